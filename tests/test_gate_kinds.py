"""Severity belongs to the rule's code: a policy re-levels a rule's violations, never a finding that says the rule
could not decide or that the rule failed. Old rule references keep covering the findings they covered before a
rule was split."""

from __future__ import annotations

import dataclasses

import pytest

from ortgate.engine.gate import apply_gate, decide, gate_config_from
from ortgate.engine.pipeline import LintRequest, lint, load_inputs, run_rules
from ortgate.findings import Finding, Kind, Location, Severity
from ortgate.rules import all_rules, find_rule, match_rules
from ortgate.rules.redirects import RENAMED, SPLIT_FROM
from tests.helpers import run_cli_json


def _gate(model, policy, select=None):
    inputs = load_inputs(LintRequest(str(model), str(policy)))
    config = gate_config_from(inputs.policy, cli_select=select, cli_ignore=None, fail_on=None)
    result = lint(inputs, config)
    return result.findings, result.verdict


def test_an_error_override_does_not_turn_could_not_decide_into_an_error(make_model, write_policy):
    model = make_model()
    policy = write_policy("name: p\nmodel: {family: nosuchfamily}\n"
                          "rules:\n  severity: {moe-routing-mismatch: error}\n")
    findings, verdict = _gate(model, policy, select=["moe-routing-mismatch"])
    [undecided] = findings
    assert undecided.kind is Kind.UNDECIDED and undecided.severity is Severity.INFO
    assert "nosuchfamily" in undecided.message
    assert verdict.passed and verdict.counts["error"] == 0


def test_an_override_still_relevels_the_rules_violations(make_model, write_policy):
    model = make_model(top_k=2)
    policy = write_policy("name: p\nmodel: {top_k: 8}\nrules:\n  severity: {moe-routing-mismatch: warning}\n")
    findings, verdict = _gate(model, policy, select=["moe-routing-mismatch"])
    assert [(f.kind, f.severity) for f in findings] == [(Kind.VIOLATION, Severity.WARNING)]
    assert verdict.passed


def test_an_override_does_not_relevel_a_rule_that_failed(make_model, write_policy, monkeypatch):
    monkeypatch.setenv("ORTGATE_STRICT", "0")
    model = make_model()
    policy = write_policy("name: p\nrules:\n  severity: {moe-not-fused: error}\n")
    inputs = load_inputs(LintRequest(str(model), str(policy)))
    config = gate_config_from(inputs.policy, cli_select=None, cli_ignore=None, fail_on="info")

    def crash(_ctx):
        raise RuntimeError("odd graph")

    broken = dataclasses.replace(find_rule("moe-not-fused"), check=crash)
    findings = apply_gate(run_rules(inputs, [broken]), config)
    [failed] = findings
    assert failed.kind is Kind.INTERNAL_ERROR and failed.severity is Severity.INFO
    assert "internal error RuntimeError: odd graph" in failed.message
    assert not decide(findings, Severity.WARNING).counts["error"]


def test_a_finding_that_is_not_a_violation_is_info_and_cannot_be_relevelled():
    where = Location("m.onnx")
    with pytest.raises(ValueError):
        Finding("OGM001", "moe-routing-mismatch", Severity.ERROR, "m", where, kind=Kind.UNDECIDED)
    undecided = Finding("OGM001", "moe-routing-mismatch", Severity.INFO, "m", where, kind=Kind.UNDECIDED)
    with pytest.raises(ValueError):
        undecided.with_severity(Severity.ERROR)


def test_the_json_report_names_each_findings_kind(make_model, write_policy):
    model = make_model()
    policy = write_policy("name: p\nmodel: {family: nosuchfamily, top_k: 8}\n")
    _, report = run_cli_json("lint", model, "--policy", policy, "--select", "moe-routing-mismatch")
    kinds = sorted((f["kind"], f["severity"]) for f in report["findings"])
    assert kinds == [("undecided", "info"), ("violation", "error")]


# References that outlive a split ------------------------------------------------------------------------------

def test_every_redirect_names_registered_rules_and_no_code_is_both_live_and_renamed():
    codes = {r.code for r in all_rules()}
    names = {r.name for r in all_rules()}
    for old, new in RENAMED.items():
        assert old not in codes and old not in names and new in codes
    for child, parents in SPLIT_FROM.items():
        assert child in codes and parents and all(p in codes for p in parents), child


def test_an_old_reference_covers_the_codes_split_off_it_and_a_new_one_only_itself():
    assert [r.code for r in match_rules("OGM008")] == ["OGM008"]
    for parent in ("OGF001", "moe-not-fused"):
        assert {r.code for r in match_rules(parent)} == {"OGF001", "OGM008"}
    assert {r.code for r in match_rules("gqa-not-fused")} == {"OGF002", "OGM002", "OGM009"}


def test_a_waiver_written_before_a_split_still_waives_the_split_off_findings(write_policy, make_model):
    policy = write_policy(
        "name: p\nexecution_provider:\n  name: TensorrtExecutionProvider\n"
        "  options: {trt_fp16_enable: 'True', trt_load_user_initializer: 'True'}\n"
        "waivers:\n  - {rule: unknown-provider-option, reason: set from C++}\n")
    findings, verdict = _gate(make_model(), policy, select=["OGP", "OGW"])
    c_api = [f for f in findings if f.rule == "provider-option-c-api-only"]
    assert c_api and all(f.suppressed is not None for f in c_api)
    assert not [f for f in findings if f.rule == "waiver-unused"]


def test_an_exact_reference_outranks_one_that_reaches_the_rule_through_a_split(write_policy):
    policy = write_policy("name: p\nrules:\n  severity: {OGM008: error, moe-not-fused: warning}\n")
    from ortgate.config.policy import load_policy
    from ortgate.engine.gate import severity_overrides

    config = gate_config_from(load_policy(policy), cli_select=None, cli_ignore=None, fail_on=None)
    levels = severity_overrides(config)
    assert levels["OGM008"] is Severity.ERROR and levels["OGF001"] is Severity.WARNING
