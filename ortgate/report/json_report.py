"""JSON report: deterministic (sorted keys, findings in a stable order, no timestamps)."""

from __future__ import annotations

import json

from ortgate import __version__
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding

SCHEMA_VERSION = 1


def finding_dict(f: Finding) -> dict:
    out = {
        "code": f.code,
        "rule": f.rule,
        "severity": f.severity.label,
        "kind": f.kind.value,
        "message": f.message,
        "file": f.location.file,
        "line": f.location.line,
        "key_path": f.location.key_path,
        "node": f.node,
        "op_type": f.op_type,
        "layer": f.layer,
        "graph": f.graph,
        "fix": f.fix,
        "related_nodes": list(f.related_nodes),
        "properties": dict(f.properties),
        "suppressed": None if f.suppressed is None else {
            "kind": f.suppressed.kind,
            "justification": f.suppressed.justification,
            "file": f.suppressed.location.file if f.suppressed.location else None,
            "line": f.suppressed.location.line if f.suppressed.location else None,
        },
        "fingerprint": f.identity(),
        "price": f.price.to_dict() if f.price is not None else None,
    }
    if f.location.label:  # "file" is MODEL; the finding is about its optimized graph, from a dump not kept
        out["file_label"] = f.location.label
    return out


def report_dict(result: LintResult) -> dict:
    v = result.verdict
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ortgate", "version": __version__},
        "inputs": result.summary,
        "verdict": {
            "passed": v.passed,
            "fail_on": v.fail_on.label,
            "counts": v.counts,
            "suppressed": v.suppressed,
            "suppressed_by": v.suppressed_by,
        },
        "findings": [finding_dict(f) for f in result.findings],
        **({"comparison": result.comparison.to_dict(finding_dict)} if result.comparison is not None else {}),
    }


def render(result: LintResult) -> str:
    return json.dumps(report_dict(result), allow_nan=False, indent=2, sort_keys=True, default=str) + "\n"
