"""SARIF 2.1.0 report, for GitHub code scanning and any other SARIF viewer.

- Every rule that ran is a `reportingDescriptor`, documented from its docstring.
- Graph findings point at the model file; the node is a logical location (kind "function": a node is one
  operator call) whose fully qualified name carries the decoder layer and subgraph path. A binary model has
  no lines, but GitHub code scanning only shows results with `region.startLine`, so they anchor at line 1.
- Config findings point at the line of the policy YAML (or genai_config.json) that set the value.
- `partialFingerprints` hash the finding's identity (rule + the file's path relative to the working directory +
  layer + structural signature or key), never a line.
- Findings covered by a waiver or the baseline carry `suppressions` with the justification.
- Compared with a base model (`--compare`): each result carries `baselineState` new or unchanged, and the base's
  findings the model no longer has are results of their own with `baselineState` absent (kind pass, level none).
- Deterministic: no timestamps, no absolute paths of the checkout, findings in a stable order.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING
from urllib.parse import quote

from ortgate import __version__
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Location, Severity
from ortgate.report import display_path, layer_label, target
from ortgate.rules import Rule, find_rule

if TYPE_CHECKING:
    from ortgate.engine.compare import Comparison

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SRCROOT = "%SRCROOT%"
FINGERPRINT_KEY = "ortgate/v3"  # v3: the model's path relative to the working directory; v2: its name; no node names
LEVEL = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}


def render(result: LintResult) -> str:
    return json.dumps(sarif_log(result), allow_nan=False, indent=2, ensure_ascii=False, default=str) + "\n"


def sarif_log(result: LintResult) -> dict:
    rules = _rules(result)
    index = {r.code: i for i, r in enumerate(rules)}
    v = result.verdict
    run: dict = {
        "tool": {"driver": {
            "name": "ortgate",
            "version": __version__,
            "semanticVersion": __version__,
            "rules": [_descriptor(r) for r in rules],
        }},
        # No originalUriBaseIds: the checkout's absolute path differs per machine; GitHub resolves %SRCROOT%
        # against the repository root.
        "results": [_result(f, index, result.comparison) for f in result.findings] + _absent(result, index),
        "properties": {
            "verdict": {"passed": v.passed, "failOn": v.fail_on.label, "counts": v.counts,
                        "suppressed": v.suppressed},
            "model": display_path(result.summary["model"]) if result.summary.get("model") else None,
            **({"models": [display_path(m["model"]) for m in result.summary["models"]]}
               if result.summary.get("models") else {}),
            "policy": result.summary.get("policy"),
            "provider": result.summary.get("provider"),
            **({"notChecked": result.summary["not_checked"]} if result.summary.get("not_checked") else {}),
        },
    }
    c = result.comparison
    if c is not None:
        compared: dict = {"base": c.base_name, "appeared": len(c.appeared), "disappeared": len(c.disappeared),
                          "unchanged": len(c.unchanged)}
        if c.estimate is not None:
            compared["estimate"] = c.estimate.to_dict()["as_exported"]
        run["properties"]["comparison"] = compared
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def _absent(result: LintResult, index: dict[str, int]) -> list[dict]:
    """The base's findings the model no longer has (`--compare`): results with baselineState absent, of kind
    pass and level none (nothing to fix), so that a viewer can show what the change fixed."""
    comparison = result.comparison
    if comparison is None:
        return []
    out = []
    for f in comparison.disappeared:
        if f.code not in index:
            continue
        entry = _result(f, index)
        entry.update(kind="pass", level="none", baselineState="absent")
        entry.pop("suppressions", None)
        out.append(entry)
    return out


def _rules(result: LintResult) -> list[Rule]:
    by_code = {r.code: r for r in result.rules}
    for f in result.findings:
        if f.code not in by_code:
            found = find_rule(f.code)
            if found is not None:
                by_code[f.code] = found
    return [by_code[c] for c in sorted(by_code)]


def _descriptor(rule: Rule) -> dict:
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.summary},
        "fullDescription": {"text": " ".join((rule.section("What it checks") or rule.summary).split())},
        "help": {"text": rule.doc, "markdown": f"# {rule.code} {rule.name}\n\n{rule.doc}"},
        "defaultConfiguration": {"level": LEVEL[rule.severity]},
        "properties": {"tags": ["ortgate", rule.family]},
    }


def fingerprint(finding: Finding) -> str:
    return hashlib.sha256(finding.identity().encode("utf-8")).hexdigest()


def _message(finding: Finding) -> str:
    where = [layer_label(finding.layer)] if finding.layer is not None else []
    if target(finding):
        where.append(target(finding))
    return f"{', '.join(where)}: {finding.message}" if where else finding.message


def _result(finding: Finding, index: dict[str, int], comparison: Comparison | None = None) -> dict:
    out: dict = {
        "ruleId": finding.code,
        "ruleIndex": index[finding.code],
        "level": LEVEL[finding.severity],
        "message": {"text": _message(finding)},
        "locations": [_location(finding)],
        "partialFingerprints": {FINGERPRINT_KEY: fingerprint(finding)},
    }
    if comparison is not None and comparison.state(finding) is not None:
        out["baselineState"] = comparison.state(finding)
    if finding.related_nodes:
        out["relatedLocations"] = [
            {"id": i, "message": {"text": "related node"},
             "logicalLocations": [{"name": name, "kind": "function"}]}
            for i, name in enumerate(finding.related_nodes, start=1)
        ]
    if finding.suppressed is not None:
        suppression: dict = {"kind": "external", "status": "accepted",
                             "justification": finding.suppressed.justification,
                             "properties": {"source": finding.suppressed.kind}}
        if finding.suppressed.location is not None:
            suppression["location"] = {"physicalLocation": _physical(finding.suppressed.location.file,
                                                                     finding.suppressed.location.line)}
        out["suppressions"] = [suppression]
    properties: dict = {"rule": finding.rule}
    if not finding.relevelable:
        properties["findingKind"] = finding.kind.value
    if finding.location.label:
        properties["fileLabel"] = finding.location.label
    if finding.layer is not None:
        properties["layer"] = finding.layer
    if finding.op_type:
        properties["opType"] = finding.op_type
    if finding.fix:
        properties["fix"] = finding.fix
    if finding.properties:
        properties["details"] = {str(k): v for k, v in finding.properties}
    if finding.price is not None:
        properties["price"] = finding.price.to_dict()
    out["properties"] = properties
    return out


def _location(finding: Finding) -> dict:
    loc: Location = finding.location
    out: dict = {"physicalLocation": _physical(loc.file, loc.line)}
    if finding.node:
        parts = [f"layers.{finding.layer}" if finding.layer is not None else "model"]
        if finding.graph:
            parts.append(finding.graph)
        parts.append(finding.node)
        logical: dict = {"name": finding.node, "fullyQualifiedName": "::".join(parts), "kind": "function"}
        if finding.op_type:
            logical["properties"] = {"opType": finding.op_type}
        out["logicalLocations"] = [logical]
    elif loc.key_path:
        out["logicalLocations"] = [{"name": _last_key(loc.key_path), "fullyQualifiedName": loc.key_path,
                                    "kind": "property"}]
    return out


def _physical(file: str, line: int | None) -> dict:
    return {"artifactLocation": _artifact(file), "region": {"startLine": line or 1}}


def _artifact(file: str) -> dict:
    shown = display_path(file)
    if Path(shown).is_absolute() or PurePosixPath(shown).parts[:1] == ("..",):
        return {"uri": Path(file).resolve().as_uri()}  # outside the source root: an absolute file URI
    return {"uri": quote(shown), "uriBaseId": SRCROOT}


def _last_key(key_path: str) -> str:
    return key_path.rsplit(".", 1)[-1]
