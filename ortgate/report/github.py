"""GitHub Actions workflow commands: one `::error` / `::warning` / `::notice` annotation per rule and file, whose
title carries where its findings lie ("layers 0-47 (48)") and whose message lists each group of identical
findings (report.groups) once, and the rule's fix once.

GitHub keeps at most 10 annotations of each type per step, so errors come first and each type stops at 10;
one plain line then says how many were left out (the job summary and the SARIF report have them all). A finding
that stops the model from loading (`Finding.stops_session`) is never left out: such annotations come first, and
when they alone pass the cap, the type's last annotation lists the rest of them.
Values are escaped as the runner expects: `%`, CR and LF in the message; also `:` and `,` in properties. A
node name can never inject a workflow command.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ortgate.engine.gate import suppressed_breakdown
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Severity
from ortgate.report import display_path
from ortgate.report.groups import group_findings, where

MAX_ANNOTATIONS_PER_TYPE = 10
MAX_ENTRIES = 8  # groups of identical findings listed in one annotation; the summary and SARIF list the rest
COMMAND = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}


def escape_data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def rule_annotation(findings: list[Finding]) -> str:
    """One annotation for one rule's findings in one file."""
    first = findings[0]
    severity = max(f.severity for f in findings)
    props = [f"file={escape_property(display_path(first.location.file))}"]
    line = min((f.location.line for f in findings if f.location.line), default=None)
    if line:
        props.append(f"line={line}")
    title = f"{first.code} {first.rule}"
    place = where(findings)
    if any(f.node for f in findings) and place:
        title += f": {place}"
    elif len(findings) > 1:
        title += f": {len(findings)} findings"
    props.append(f"title={escape_property(title)}")
    entries: list[str] = []
    fixes: list[str] = []
    groups = sorted(group_findings(findings), key=lambda g: (g.first.layer is None, g.first.layer or 0,
                                                              g.first.location.line or 0))
    for group in groups[:MAX_ENTRIES]:
        f = group.first
        head = []
        if f.node:
            head.append(where(group.findings))
        if group.target:
            other_line = f.location.line and f.location.line != line  # the annotation's own line goes unsaid
            head.append(group.target + (f" (line {f.location.line})" if other_line else ""))
        entries.append(f"{': '.join(head)}: {group.message}" if head else group.message)
        if group.fix and group.fix not in fixes:
            fixes.append(group.fix)
    if len(groups) > MAX_ENTRIES:
        entries.append(f"... and {len(groups) - MAX_ENTRIES} more (the job summary and the SARIF report list them)")
    if first.location.label:  # the optimized graph of MODEL, from a dump that was not kept
        entries[0] = f"[{first.location.label}] {entries[0]}"
    message = "\n".join(entries + [f"fix: {fix}" for fix in fixes])
    return f"::{COMMAND[severity]} {','.join(props)}::{escape_data(message)}"


def render(result: LintResult) -> str:
    active = [f for f in result.findings if f.suppressed is None]
    by_rule: dict[tuple[str, str | None, str], list[Finding]] = defaultdict(list)
    for f in active:
        by_rule[(f.location.file, f.location.label, f.code)].append(f)
    annotations = sorted(by_rule.values(), key=lambda fs: (-max(f.severity for f in fs), fs[0].code))
    lines: list[str] = []
    left_out: Counter[Severity] = Counter()
    for severity in sorted(Severity, reverse=True):  # the most severe first
        group = [fs for fs in annotations if max(f.severity for f in fs) == severity]
        # A finding that stops the model loading is never left out: those annotations come first, and where they
        # alone pass the cap, the last annotation of the type carries the rest of them.
        blocking = [fs for fs in group if any(f.stops_session for f in fs)]
        group = blocking + [fs for fs in group if fs not in blocking]
        if len(blocking) > MAX_ANNOTATIONS_PER_TYPE:
            kept = group[:MAX_ANNOTATIONS_PER_TYPE - 1]
            lines += [rule_annotation(fs) for fs in kept] + [_blocking_annotation(blocking[len(kept):], severity)]
            shown = len(blocking)
        else:
            shown = MAX_ANNOTATIONS_PER_TYPE
            lines += [rule_annotation(fs) for fs in group[:shown]]
        left_out[severity] = sum(len(fs) for fs in group[shown:])
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


def _blocking_annotation(groups: list[list[Finding]], severity: Severity) -> str:
    """One annotation for the findings that stop the model loading beyond the cap: each rule's first message."""
    findings = [f for fs in groups for f in fs]
    files = sorted({display_path(f.location.file) for f in findings})
    props = [f"file={escape_property(files[0])}"] if len(files) == 1 else []
    props.append(f"title={escape_property(f'{len(findings)} more findings that stop the model from loading')}")
    entries = [f"{fs[0].code} {fs[0].rule} ({display_path(fs[0].location.file)}): {fs[0].message}" for fs in groups]
    return f"::{COMMAND[severity]} {','.join(props)}::{escape_data(chr(10).join(entries))}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
