"""Reporters turn a LintResult into text. They format only: they never judge or filter."""

from __future__ import annotations

import os
from pathlib import Path

from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Price


def render(fmt: str, result: LintResult, *, expand: bool = False, width: int | None = None,
           color: bool = False) -> str:
    """`result` in format `fmt` (one of `ortgate lint --format`'s). `expand`, `width` and `color` shape the text
    report (and `expand` the markdown summary); the machine formats always hold every finding whole. Only the
    format's own module is imported: a lint loads the one reporter it writes with."""
    if fmt == "text":
        from ortgate.report import text

        return text.render(result, text.TextOptions(width=width or text.DEFAULT_WIDTH, color=color, expand=expand))
    if fmt == "markdown":
        from ortgate.report import markdown

        return markdown.render(result, expand=expand)
    if fmt == "json":
        from ortgate.report import json_report

        return json_report.render(result)
    if fmt == "sarif":
        from ortgate.report import sarif

        return sarif.render(result)
    if fmt == "github":
        from ortgate.report import github

        return github.render(result)
    if fmt == "junit":
        from ortgate.report import junit

        return junit.render(result)
    if fmt == "codequality":
        from ortgate.report import codequality

        return codequality.render(result)
    raise KeyError(fmt)


def clean(text: object) -> str:
    """A value that came from the user (a policy name, a path, a key) as one printable line: newlines, carriage
    returns and terminal escapes shown escaped, so that no report line can be forged by an input."""
    from ortgate.errors import printable

    return printable(str(text))


def unforgeable(report: str) -> str:
    """A plain-text report that a CI runner reads line by line: a line that would start a GitHub Actions workflow
    command (`::name ...::`, after any indentation) has its `::` escaped as the runner's own `%3A%3A`. ortgate
    writes no such line itself; only an input's text, wrapped to the start of a line, could."""
    if "::" not in report:
        return report
    lines = report.split("\n")
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if stripped.startswith("::"):
            lines[i] = line[: len(line) - len(stripped)] + "%3A%3A" + stripped[2:]
    return "\n".join(lines)


def source_root() -> Path:
    """The folder report paths are relative to: the checkout on GitHub Actions, else the working directory."""
    return Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd())


def display_path(file: str) -> str:
    """`file` relative to the source root (forward slashes) when it lies inside it, else as given."""
    path = Path(file)
    absolute = path if path.is_absolute() else Path.cwd() / path
    try:
        return absolute.resolve().relative_to(source_root().resolve()).as_posix()
    except (ValueError, OSError):
        return path.as_posix()


def target(finding: Finding) -> str:
    """What a finding is about inside its file: the graph node (with its subgraph) or the config key."""
    if finding.node:
        return f"{finding.graph}/{finding.node}" if finding.graph else finding.node
    return finding.location.key_path or ""


def layer_label(layer: int | None) -> str:
    return f"layer {layer}" if layer is not None else "model / config"


def time_text(ms: float) -> str:
    """'4.21 ms', '18.9 us'."""
    return f"{ms:.3g} ms" if ms >= 0.1 else f"{ms * 1e3:.3g} us"


def price_text(price: Price) -> str:
    """'~4.21 ms per token (37% of the step) on h100-sxm, estimated'."""
    return f"~{time_text(price.ms_per_token)} per token ({price.share:.0%} of the step) on {price.device}, estimated"


def price_totals(prices: list[Price]) -> tuple[float, float]:
    """What fixing all these findings saves: ms per token and share of the step."""
    return sum(p.ms_per_token for p in prices), sum(p.share for p in prices)


def group_price_text(prices: list[Price]) -> str:
    """One finding's price, or a group's: each (when equal) and all together."""
    if len(prices) == 1:
        return price_text(prices[0])
    total, share = price_totals(prices)
    equal = len({round(p.ms_per_token, 9) for p in prices}) == 1
    each = f"~{time_text(prices[0].ms_per_token)} per token each, " if equal else ""
    per = "" if equal else " per token"
    return (f"{each}~{time_text(total)}{per} for all {len(prices)} ({share:.0%} of the step) on {prices[0].device}, "
            "estimated")
