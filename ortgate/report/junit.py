"""JUnit XML, the test-report format CI systems already show (GitLab `artifacts:reports:junit`, Jenkins, Azure
Pipelines, CircleCI, ...): each rule that ran is one test case of the suite "ortgate".

A rule fails (`<failure>`) when one of its active findings is at least as severe as the gate's threshold; the
failure lists its findings, identical ones across layers once (report.groups), and the fix. A rule whose findings
are all below the threshold, or suppressed, passes and lists them in `<system-out>`. `tests` / `failures`
count test cases, so a red test report means exactly a failed gate. Deterministic: no timestamps, time 0.
"""

from __future__ import annotations

import re
from collections import defaultdict
from xml.etree import ElementTree as ET

from ortgate import __version__
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding
from ortgate.report import clean, display_path
from ortgate.report.groups import group_findings, where


def render(result: LintResult) -> str:
    v = result.verdict
    by_code: dict[str, list[Finding]] = defaultdict(list)
    for f in result.findings:
        by_code[f.code].append(f)
    rules = {r.code: r.name for r in result.rules}
    for f in result.findings:  # the gate's own findings (waivers) come from rules that were not selected
        rules.setdefault(f.code, f.rule)
    cases = []
    failures = 0
    for code in sorted(rules):
        findings = by_code.get(code, [])
        active = [f for f in findings if f.suppressed is None]
        failing = [f for f in active if f.severity >= v.fail_on]
        case = ET.Element("testcase", name=_xml(f"{code} {rules[code]}"), classname=f"ortgate.{code[:3]}", time="0")
        if failing:
            failures += 1
            worst = max(f.severity for f in failing)
            failure = ET.SubElement(case, "failure", type=worst.label,
                                    message=_xml(f"{_count(failing)} ({where(failing)})"))
            failure.text = _xml(_describe(failing))
        reported = [f for f in findings if f not in failing]
        if reported:
            ET.SubElement(case, "system-out").text = _xml(_describe(reported))
        cases.append(case)
    models = result.summary.models
    suite = ET.Element("testsuite", name="ortgate", tests=str(len(cases)), failures=str(failures), errors="0",
                       skipped="0", time="0")
    properties = ET.SubElement(suite, "properties")
    for name, value in (("ortgate.version", __version__), ("fail_on", v.fail_on.label),
                        ("policy", result.summary.policy or ""),
                        ("provider", result.summary.provider or ""),
                        *(("model", display_path(m.model)) for m in models if m.model)):
        ET.SubElement(properties, "property", name=name, value=_xml(str(value)))
    suite.extend(cases)
    root = ET.Element("testsuites", name="ortgate", tests=str(len(cases)), failures=str(failures), errors="0",
                      time="0")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# What XML 1.0 forbids in a document (C0 controls but tab and newline, surrogates, U+FFFE/U+FFFF): never written.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml(text: str) -> str:
    """Text for an attribute or element: what came from the user on printable lines, nothing XML forbids."""
    return _NOT_XML.sub("", "\n".join(clean(line) for line in text.split("\n")))


def _count(findings: list[Finding]) -> str:
    return f"{len(findings)} finding{'' if len(findings) == 1 else 's'}"


def _describe(findings: list[Finding]) -> str:
    lines = []
    fixes: list[str] = []
    for g in group_findings(findings):
        f = g.first
        place = [f.location.label or display_path(f.location.file) + (f":{f.location.line}" if f.location.line else "")]
        if f.node:
            place.append(where(g.findings))
        if g.target:
            place.append(g.target)
        state = f" [{f.suppressed.kind}: {f.suppressed.justification}]" if f.suppressed else ""
        lines.append(f"{f.severity.label}: {' · '.join(place)}: {g.message}{state}")
        if g.fix and g.fix not in fixes:
            fixes.append(g.fix)
    return "\n".join(lines + [f"fix: {fix}" for fix in fixes]) + "\n"
