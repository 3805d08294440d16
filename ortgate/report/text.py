"""Human report: findings grouped by file and decoder layer, then a one-line verdict."""

from __future__ import annotations

import io
from collections import defaultdict

from rich.console import Console
from rich.text import Text

from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Severity
from ortgate.report import price_text

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def render(result: LintResult, *, color: bool = False, width: int = 110) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=color, no_color=not color, width=width, highlight=False,
                      soft_wrap=True)
    write(console, result)
    return buffer.getvalue()


def write(console: Console, result: LintResult) -> None:
    by_file: dict[str, dict[int | None, list[Finding]]] = defaultdict(lambda: defaultdict(list))
    for f in result.findings:
        if f.suppressed is None:
            by_file[f.location.file][f.layer].append(f)
    shown_fixes: set[str] = set()  # a fix repeated on every layer is printed once, under its first finding
    for file, layers in by_file.items():
        console.print(Text(file, style="bold underline"))
        for layer in sorted(layers, key=lambda x: (x is not None, x if x is not None else -1)):
            if layer is not None:
                heading = f"  layer {layer}"
            elif any(f.node for f in layers[layer]):
                heading = "  outside the decoder layers"
            else:
                heading = "  configuration"
            console.print(Text(heading, style="bold"))
            for f in layers[layer]:
                _write_finding(console, f, show_fix=bool(f.fix) and f.fix not in shown_fixes)
                if f.fix:
                    shown_fixes.add(f.fix)
        console.print()
    _write_summary(console, result)


def _write_finding(console: Console, f: Finding, *, show_fix: bool) -> None:
    where = f":{f.location.line}" if f.location.line else ""
    target = f.node or f.location.key_path or ""
    line = Text("    ")
    line.append(f"{f.severity.label:<7}", style=STYLE[f.severity])
    line.append(f" {f.code} ", style="dim")
    line.append(f"{f.rule}", style="bold")
    if target or where:
        line.append(f"  {target}{where}", style="dim")
    console.print(line)
    console.print(Text(f"      {f.message}"))
    if f.price is not None:
        console.print(Text(f"      saves {price_text(f.price)}", style="magenta"))
    if show_fix:
        console.print(Text(f"      fix: {f.fix}", style="green"))


def _write_summary(console: Console, result: LintResult) -> None:
    v = result.verdict
    counts = ", ".join(f"{n} {label}{'s' if n != 1 else ''}" for label, n in v.counts.items())
    suppressed = ""
    if v.suppressed:
        from ortgate.engine.gate import suppressed_breakdown

        by = suppressed_breakdown(v.suppressed_by)
        suppressed = f", {v.suppressed} suppressed" + (f" ({by})" if by else "")
    s = result.summary
    scope = f"{s['nodes']} nodes"
    if s.get("layers"):
        scope += f", {s['layers']} layers"
    if s.get("provider"):
        scope += f", {s['provider']}"
    if s.get("estimate"):
        from ortgate.engine.pricing import headline

        console.print(Text(f"estimate  {headline(s['estimate'])}"))
    verdict = Text("PASS" if v.passed else "FAIL", style="bold green" if v.passed else "bold red")
    line = Text()
    line.append(verdict)
    line.append(f"  {counts}{suppressed} ({scope}; fails on {v.fail_on.label} and above)")
    console.print(line)
