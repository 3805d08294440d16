"""Every rule's documentation is executed: its Bad example must fire the rule, its Good example must not.

The examples are fenced blocks in the rule's docstring (the format is in ortgate/rules/base.py): ONNX textual
syntax for graphs, policy YAML, genai_config.json, run evidence. So the documentation cannot drift from the rule.
"""

from __future__ import annotations

import pytest
import yaml

from ortgate.findings import Kind
from ortgate.rules import all_rules
from ortgate.rules.base import Example, doc_examples
from tests.rule_inputs import RuleInputs, lint_rule

RULES = all_rules()
EXECUTED = {"model", "optimized", "policy", "genai_config", "evidence", "baseline", "base"}


def examples(rule, section: str) -> list[Example]:
    return doc_examples(rule.section(section))


def inputs_of(found: list[Example]) -> RuleInputs:
    by_kind = {e.kind: e.text for e in found if e.kind in EXECUTED}
    policy = by_kind.get("policy")
    waived = [w["rule"] for w in (yaml.safe_load(policy) or {}).get("waivers") or []] if policy else []
    baseline = yaml.safe_load(by_kind["baseline"]) if "baseline" in by_kind else None
    accepted = [e["rule"] for e in (baseline or {}).get("findings", []) if e.get("rule")]
    return RuleInputs(
        model_text=by_kind.get("model"),
        optimized_text=by_kind.get("optimized"),
        policy=policy,
        genai_config=yaml.safe_load(by_kind["genai_config"]) if "genai_config" in by_kind else None,
        evidence=yaml.safe_load(by_kind["evidence"]) if "evidence" in by_kind else None,
        baseline=baseline,
        base_text=by_kind.get("base"),
        select=waived + accepted,
    )


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.code}-{r.name}")
@pytest.mark.parametrize("section", ["Bad", "Good"])
def test_each_example_says_what_it_is_and_can_run(rule, section):
    found = examples(rule, section)
    kinds = [e.kind for e in found]
    assert "unknown" not in kinds, f"{rule.code} {section}: a fenced block without a known info string"
    assert set(kinds) & EXECUTED, f"{rule.code} {section}: no executed block (onnx, yaml, json, yaml evidence)"
    executed = [k for k in kinds if k in EXECUTED]
    assert len(executed) == len(set(executed)), f"{rule.code} {section}: one block of each kind at most"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.code}-{r.name}")
def test_the_bad_example_fires_the_rule(rule, tmp_path):
    found = lint_rule(rule.code, inputs_of(examples(rule, "Bad")), tmp_path)
    assert [f for f in found if f.kind is Kind.VIOLATION], f"{rule.code} {rule.name}: the Bad example does not fire"


@pytest.mark.parametrize("rule", RULES, ids=lambda r: f"{r.code}-{r.name}")
def test_the_good_example_passes(rule, tmp_path):
    found = lint_rule(rule.code, inputs_of(examples(rule, "Good")), tmp_path)
    assert found == [], f"{rule.code} {rule.name}: the Good example is reported: {[f.message for f in found]}"
