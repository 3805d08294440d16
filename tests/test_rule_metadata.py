"""What a rule is to the engine and to `ortgate fix` is declared once, on its `@rule`: what it needs, the repair kind
that prices it, the repair `fix` makes for it, whether it judges the policy alone. No table elsewhere repeats it,
and each attribute agrees with what the rule does (needs: tests/rule_inputs.check_needs, on every case and example)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import yaml

from ortgate.cost.repairs import REPAIR_KINDS
from ortgate.engine.pipeline import LintRequest, load_inputs, unchecked_families
from ortgate.engine.policy_check import check_policy
from ortgate.fix.pipeline import KIND_ORDER, fixable_rules
from ortgate.rules import all_rules
from ortgate.rules.base import doc_examples
from ortgate.rules.catalog import catalog
from tests.conftest import EXAMPLES, REPO
from tests.helpers import rule_findings, run_cli, run_cli_json
from tests.rule_inputs import spec_model
from tests.test_rule_cases import CASES

PACKAGE = REPO / "ortgate"
# Rule codes that no longer exist, or were split: history, not what a rule is.
HISTORY = {PACKAGE / "rules" / "redirects.py"}
RETIRED_TABLES = ("RULE_REPAIRS", "FIXES", "POLICY_RULES", "_FAMILY_GAPS")


def _string_items(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Dict):
        items = [k for k in node.keys if k is not None]
    elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = list(node.elts)
    else:
        return []
    return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]


def side_tables(path: Path, keys: set[str]) -> list[str]:
    """Literal dicts, lists, tuples and sets in `path` holding two or more rule codes or names, and assignments to the
    retired table names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        hits = [s for s in _string_items(node) if s in keys]
        if len(hits) >= 2:
            found.append(f"{path}:{node.lineno}: {', '.join(hits[:4])}")
        if isinstance(node, ast.Name) and node.id in RETIRED_TABLES and isinstance(node.ctx, ast.Store):
            found.append(f"{path}:{node.lineno}: {node.id}")
    return found


def test_no_table_outside_the_rules_keys_rules_by_code_or_name():
    keys = {k for r in all_rules() for k in (r.code, r.name)}
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path not in HISTORY for hit in side_tables(path, keys)]
    assert found == [], "per-rule facts belong on @rule (needs, price, fix, policy_only):\n" + "\n".join(found)


def test_the_side_table_check_sees_a_table(tmp_path):
    table = tmp_path / "pricing.py"
    table.write_text('KINDS = {"moe-not-fused": "moe", "gqa-not-fused": "attention"}\nFIXES = {}\n')
    assert len(side_tables(table, {k for r in all_rules() for k in (r.code, r.name)})) == 2


def test_every_price_and_fix_kind_is_one_the_cost_model_and_fix_know_and_each_is_used():
    prices = {r.price for r in all_rules() if r.price}
    fixes = {r.fix for r in all_rules() if r.fix}
    assert prices == set(REPAIR_KINDS), "a repair kind no rule is priced with, or a price the cost model lacks"
    assert fixes == set(KIND_ORDER), "a repair `fix` makes that no rule names, or one it does not make"
    assert set(fixable_rules()) == {r.code for r in all_rules() if r.fix}


def test_the_catalog_and_rules_json_carry_the_metadata():
    by_code = {r.code: r for r in all_rules()}
    for entry in catalog():
        r = by_code[entry.code]
        assert (entry.needs, entry.price, entry.fix, entry.policy_only) == (r.needs, r.price, r.fix, r.policy_only)
    _, listed = run_cli_json("rules", "--format", "json")
    for item in listed:
        r = by_code[item["code"]]
        assert (tuple(item["needs"]), item["price"], item["fix"], item["policy_only"]) == \
            (r.needs, r.price, r.fix, r.policy_only)
    _, out, _ = run_cli("explain", "moe-not-fused")
    assert "fixed by `ortgate fix` (moe repair); priced by the cost model (moe repair)" in out
    _, out, _ = run_cli("explain", "OGK001")
    assert "needs provider; no automatic fix; not priced." in out


def _fix_entries(code: str) -> list[dict]:
    text = (CASES / f"{code}.yaml").read_text(encoding="utf-8")
    return (yaml.safe_load(text) or {}).get("fix") or []


def test_only_the_rules_fix_repairs_record_fix_outcomes():
    assert [r.code for r in all_rules() if r.fix is None and _fix_entries(r.code)] == []


# `fix --select` runs onnxscript's attention / rotary fusion for these, but no committed model has a form those
# fusions match (their fix: sections record it): the promise is not yet proved. Strict: a model that proves it
# makes the test pass, and the mark must go.
UNPROVED = {"OGF006": "no onnxscript rotary rule matches the committed exports' rotary forms (the rotary is folded "
                      "into GroupQueryAttention by the attention repair, not by --select rotary-not-fused)"}


@pytest.mark.parametrize("rule", [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=UNPROVED[r.code]))
                                  if r.code in UNPROVED else r for r in all_rules() if r.fix], ids=lambda r: r.code)
def test_a_fixable_rule_s_recorded_fix_removes_its_findings(rule, tmp_path):
    """A rule marked fixable records an `ortgate fix --select CODE` outcome (tests/test_fix_cases.py replays each) on
    a model that has its finding: written, verified, and without the finding after."""
    repaired = [e for e in _fix_entries(rule.code) if e["written"] and e["verified"] and e["findings_after"] == 0]
    assert repaired, f"{rule.code} declares fix={rule.fix!r} but no recorded fix removes its findings"
    model = repaired[0]["model"]
    source = spec_model(model["spec"], tmp_path) if "spec" in model else REPO / model["file"]
    assert rule_findings(source, rule.name), f"{rule.code}: the recorded fix's model has no finding to remove"


def test_not_checked_comes_from_the_rules_needs():
    inputs = load_inputs(LintRequest(str(EXAMPLES / "qwen3-moe-tiny-unfused")))
    rules = all_rules()
    named = {f["prefix"] for gap in unchecked_families(inputs, rules) for f in gap["families"]}
    assert named == {"OGS", "OGP", "OGK", "OGC"}
    assert unchecked_families(inputs, [dataclasses.replace(r, needs=()) for r in rules]) == []
    session_only = [dataclasses.replace(r, needs=("session",)) if r.code.startswith("OGM") else r for r in rules]
    named = {f["prefix"] for gap in unchecked_families(inputs, session_only) for f in gap["families"]}
    assert named == {"OGM", "OGS", "OGP", "OGK", "OGC"}


def test_policy_only_rules_are_what_policy_validate_runs(tmp_path):
    """Each policy-only rule whose Bad example is a policy alone: `policy validate` of that policy reports it."""
    policy_only = [r for r in all_rules() if r.policy_only]
    assert policy_only
    for rule in policy_only:
        assert set(rule.needs) <= {"session", "policy"}, f"{rule.code} judges the policy alone, yet needs {rule.needs}"
        blocks = [e.text for e in doc_examples(rule.section("Bad")) if e.kind == "policy"]
        if not blocks or any(e.kind in ("model", "optimized") for e in doc_examples(rule.section("Bad"))):
            continue
        policy = blocks[0]
        if rule.name == "waiver-unused":  # validate judges waivers of the rules it runs, which this one is not
            policy = policy.replace("rule: gqa-not-fused", "rule: unknown-provider-option")
        path = tmp_path / f"{rule.code}.yaml"
        text = policy if policy.lstrip().startswith("name:") else f"name: example\n{policy}"
        path.write_text(text)
        problems = check_policy(path).problems
        assert any(p.rule == f"{rule.code} {rule.name}" for p in problems), \
            f"{rule.code} is policy-only but `policy validate` of its Bad policy does not report it"
