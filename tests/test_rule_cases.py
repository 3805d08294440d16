"""One case file per rule code: tests/rule_cases/<CODE>.yaml lists inputs (a model from a ModelSpec, a committed
file or ONNX text; a policy; genai_config.json; run evidence; a baseline) and how many findings of the rule each
must give. Every code has one, with at least one case that fires and one that passes. What each case reports is
kept, per rule, in tests/rule_cases/snapshots/<CODE>.txt (ORTGATE_UPDATE_SNAPSHOTS=1 rewrites them; review the
diff).

Case file format:

    rule: moe-not-fused             # the rule's name: a renamed rule must rename its case file's rule too
    cases:
      - name: every expert on every token
        model: {spec: {moe: dense_loop}}   # or {file: tests/fixtures/...} or {onnx: "<ONNX textual syntax>"}
        optimized: {file: ...}             # optional, as model
        policy: |                          # optional policy YAML (`name:` may be left out)
          model: {moe_layers: 2}
        genai_config: {...}                # optional: a genai_config.json object, or a committed file
        evidence: {...}                    # optional: ortgate.evidence.RunEvidence as data
        baseline: {...}                    # optional: a findings baseline document
        base: {spec: {...}}                # optional: the base model it is compared with (--compare), as model
        select: [moe-not-fused]            # optional: rules to run beside this one (a waiver's rule)
        findings: 2                        # how many findings of this rule (violations and undecided)
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from ortgate.findings import Finding, Kind
from ortgate.rules import all_rules
from tests.conftest import REPO
from tests.rule_inputs import RuleInputs, lint_rule

CASES = REPO / "tests" / "rule_cases"
SNAPSHOTS = CASES / "snapshots"
UPDATE = os.environ.get("ORTGATE_UPDATE_SNAPSHOTS") == "1"
CASE_KEYS = {"name", "model", "optimized", "policy", "genai_config", "evidence", "baseline", "base", "select",
             "findings"}


def load_cases(code: str) -> dict:
    return yaml.safe_load((CASES / f"{code}.yaml").read_text())


def inputs_of(case: dict, cache: Path) -> RuleInputs:
    unknown = set(case) - CASE_KEYS
    assert not unknown, f"{case.get('name')}: unknown keys {sorted(unknown)}"
    model, optimized = case.get("model") or {}, case.get("optimized") or {}
    return RuleInputs(
        model_text=model.get("onnx"), model_spec=model.get("spec"), model_file=model.get("file"),
        optimized_text=optimized.get("onnx"), optimized_file=optimized.get("file"),
        policy=case.get("policy"), genai_config=case.get("genai_config"), evidence=case.get("evidence"),
        baseline=case.get("baseline"), select=list(case.get("select") or []), cache=cache,
        base_text=(case.get("base") or {}).get("onnx"), base_spec=(case.get("base") or {}).get("spec"))


def render(findings: list[Finding], redact: list[Path]) -> str:
    """One finding per entry, with its kind, severity, place, message and fix; temporary paths redacted."""
    lines = []
    for f in findings:
        kind = "" if f.kind is Kind.VIOLATION else f" ({f.kind.value})"
        where = f.node or f.location.key_path or Path(f.location.file).name
        layer = f" layer {f.layer}" if f.layer is not None else ""
        lines.append(f"  {f.severity.label}{kind}{layer} {where}: {f.message}")
        if f.fix:
            lines.append(f"    fix: {f.fix}")
    text = "\n".join(lines) or "  (none)"
    for path in redact:
        text = text.replace(str(path), "<tmp>")
    return re.sub(r"<tmp>/spec-[0-9a-f]+/", "<tmp>/", text).replace(str(REPO) + "/", "")


@pytest.fixture(scope="module")
def spec_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("spec-models")


def test_every_rule_code_has_a_case_file_and_every_case_file_a_rule():
    codes = {r.code for r in all_rules()}
    files = {p.stem for p in CASES.glob("*.yaml")}
    assert sorted(codes - files) == [], "rules without a case file"
    assert sorted(files - codes) == [], "case files without a rule"


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.code)
def test_the_rules_cases(rule, tmp_path, spec_cache):
    data = load_cases(rule.code)
    assert data["rule"] == rule.name, f"{rule.code}.yaml names {data['rule']!r}, the rule is {rule.name!r}"
    cases = data["cases"]
    assert any(c["findings"] > 0 for c in cases) and any(c["findings"] == 0 for c in cases), \
        f"{rule.code}: a case that fires and a case that passes, at least"
    sections, failures = [], []
    for i, case in enumerate(cases):
        found = lint_rule(rule.code, inputs_of(case, spec_cache), tmp_path / f"case-{i}")
        if len(found) != case["findings"]:
            failures.append(f"{case['name']}: {len(found)} findings, the case expects {case['findings']}")
        sections.append(f"[{case['name']}]\n{render(found, [tmp_path, spec_cache])}\n")
    snapshot = f"{rule.code} {rule.name} ({rule.severity.label})\n\n" + "\n".join(sections)
    path = SNAPSHOTS / f"{rule.code}.txt"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(snapshot, encoding="utf-8")
    assert not failures, "\n".join(failures)
    assert path.is_file(), f"no snapshot {path}; create it with ORTGATE_UPDATE_SNAPSHOTS=1"
    assert path.read_text(encoding="utf-8") == snapshot, \
        f"{rule.code}'s findings differ from {path.name} (ORTGATE_UPDATE_SNAPSHOTS=1 rewrites it; review the diff)"


