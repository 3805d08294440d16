"""Markdown table cells that no input can break out of: the markdown report's and its comparison section's."""

from __future__ import annotations

from ortgate.report import clean


def one_cell(text: object) -> str:
    """One table cell's text: printable, on one line, its `|` escaped (a code span shows HTML as written)."""
    return " ".join(clean(text).split()).replace("|", "\\|")


def cell(text: object) -> str:
    """A table cell of text: an HTML tag in it (one that could close the report's <details>) shown as text."""
    return one_cell(text).replace("<", "&lt;")


def code(text: str) -> str:
    """A code span of `text` (a name, a path): in a fence of backticks that holds it, else shown as escaped text."""
    text = one_cell(text)
    fence = "``" if "`" in text else "`"
    if "``" in text:  # no fence of backticks holds it: shown as text, its markup escaped
        return cell(text)
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
