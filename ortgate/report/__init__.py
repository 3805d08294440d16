"""Reporters turn a LintResult into text. They format only: they never judge or filter."""

from __future__ import annotations

from typing import Callable

from ortgate.lint.engine import LintResult

Reporter = Callable[[LintResult], str]


def reporters() -> dict[str, Reporter]:
    from ortgate.report import json_report, text

    return {"text": text.render, "json": json_report.render}


def render(fmt: str, result: LintResult) -> str:
    return reporters()[fmt](result)
