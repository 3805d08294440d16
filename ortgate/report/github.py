"""GitHub Actions workflow commands: one `::error` / `::warning` / `::notice` annotation per active finding.

GitHub keeps at most 10 annotations of each type per step, so errors come first and each type stops at 10;
one plain line then says how many were left out (the job summary and the SARIF report have them all).
Values are escaped as the runner expects: `%`, CR and LF in the message; also `:` and `,` in properties. A
node name can never inject a workflow command.
"""

from __future__ import annotations

from collections import Counter

from ortgate.engine.gate import suppressed_breakdown
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Severity
from ortgate.report import display_path, layer_label, target

MAX_ANNOTATIONS_PER_TYPE = 10
COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def annotation(finding: Finding) -> str:
    props = [f"file={escape_property(display_path(finding.location.file))}"]
    if finding.location.line:
        props.append(f"line={finding.location.line}")
    title = f"{finding.code} {finding.rule}"
    if finding.layer is not None:
        title += f" ({layer_label(finding.layer)})"
    props.append(f"title={escape_property(title)}")
    message = f"{target(finding)}: {finding.message}" if target(finding) else finding.message
    if finding.location.label:
        message = f"[{finding.location.label}] {message}"
    if finding.fix:
        message += f"\nfix: {finding.fix}"
    return f"::{COMMAND[finding.severity]} {','.join(props)}::{escape_data(message)}"


def render(result: LintResult) -> str:
    active = [f for f in result.findings if f.suppressed is None]
    lines: list[str] = []
    left_out: Counter[Severity] = Counter()
    for severity in sorted(Severity, reverse=True):  # the most severe first
        group = [f for f in active if f.severity == severity]
        lines += [annotation(f) for f in group[:MAX_ANNOTATIONS_PER_TYPE]]
        left_out[severity] = max(0, len(group) - MAX_ANNOTATIONS_PER_TYPE)
    total = sum(left_out.values())
    if total:
        parts = ", ".join(_plural(n, s.label) for s in sorted(Severity, reverse=True) if (n := left_out[s]))
        lines.append(f"ortgate: {total} more finding{'s' if total != 1 else ''} not annotated ({parts}): GitHub "
                     f"shows at most {MAX_ANNOTATIONS_PER_TYPE} annotations of each type per step; the job summary "
                     "and the SARIF report list them all")
    v = result.verdict
    if v.suppressed:
        by = suppressed_breakdown(v.suppressed_by)
        lines.append(f"ortgate: {_plural(v.suppressed, 'finding')} suppressed ({by})")
    counts = ", ".join(_plural(n, label) for label, n in v.counts.items())
    lines.append(f"ortgate: {'PASS' if v.passed else 'FAIL'}  {counts} (fails on {v.fail_on.label} and above)")
    return "\n".join(lines) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
