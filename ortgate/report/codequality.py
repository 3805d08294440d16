"""GitLab Code Quality report (`artifacts:reports:codequality`): a JSON array with one issue per active finding.

Each issue carries the fields GitLab reads: `description`, `check_name` (the rule's code and name), `fingerprint`
(unique in the report and stable across runs: the finding's identity, never a line, so GitLab can tell new issues
from old), `severity` (info, minor, major, critical or blocker) and `location.path` (relative to the repository
root, as GitLab resolves it) with `location.lines.begin`. Findings that a waiver or the baseline covers are left
out: GitLab shows every issue it is given. Deterministic: no timestamps, findings in a stable order.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter

from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Severity
from ortgate.report import display_path, layer_label, target

# GitLab's scale is info < minor < major < critical < blocker; an error fails the gate, so it ranks above a warning.
SEVERITY = {Severity.ERROR: "major", Severity.WARNING: "minor", Severity.INFO: "info"}


def render(result: LintResult) -> str:
    issues = []
    seen: Counter[str] = Counter()
    for f in result.findings:
        if f.suppressed is not None:
            continue
        identity = f.identity()
        seen[identity] += 1  # two findings with one identity (one node, two facts) stay two issues
        if seen[identity] > 1:
            identity += f"#{seen[identity]}"
        issues.append(issue(f, hashlib.sha256(identity.encode("utf-8")).hexdigest()))
    return json.dumps(issues, allow_nan=False, indent=2, ensure_ascii=False) + "\n"


def issue(f: Finding, fingerprint: str) -> dict:
    where = [layer_label(f.layer)] if f.layer is not None else []
    if target(f):
        where.append(target(f))
    description = f"{f.code} {f.rule}: " + (f"{', '.join(where)}: " if where else "") + f.message
    if f.location.label:
        description = f"[{f.location.label}] {description}"
    return {
        "description": description,
        "check_name": f"{f.code} {f.rule}",
        "fingerprint": fingerprint,
        "severity": SEVERITY[f.severity],
        "location": {"path": display_path(f.location.file), "lines": {"begin": f.location.line or 1}},
    }
