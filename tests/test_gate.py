"""The gate: waivers (suppress, expire, go unused), baselines (accept what exists, fail on what is new), and
the verdict's inclusive `--fail-on` threshold and `--exit-zero`."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from ortgate.engine.baseline import load_baseline
from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import LintRequest, lint, load_inputs
from tests.helpers import run_cli, run_cli_json

FUSION = ["moe-not-fused", "gqa-not-fused", "OGW"]


def gate(model, policy=None, *, today: dt.date | None = None, select=FUSION, baseline=None, fail_on=None):
    inputs = load_inputs(LintRequest(str(model), str(policy) if policy else None))
    config = gate_config_from(inputs.policy, cli_select=select, cli_ignore=None, fail_on=fail_on,
                              baseline=baseline, today=today)
    result = lint(inputs, config)
    return result.findings, result.verdict


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


@pytest.fixture
def unfused(make_model):
    """Two decoder layers with MoE as a per-expert loop and attention as MatMul-Softmax-MatMul."""
    return make_model("unfused", moe="dense_loop", attention="decomposed", kv_cache=False)


# Waivers ------------------------------------------------------------------------------------------------------

def test_a_waiver_suppresses_only_the_nodes_its_glob_matches(unfused, write_policy):
    policy = write_policy(
        "name: p\nwaivers:\n"
        "  - rule: moe-not-fused\n"
        "    node: /model/layers.0/*\n"
        "    reason: layer 0 keeps the reference MoE\n")
    findings, verdict = gate(unfused, policy)
    moe = {f.layer: f for f in findings if f.rule == "moe-not-fused"}
    assert set(moe) == {0, 1}
    assert moe[0].suppressed is not None and moe[1].suppressed is None
    assert moe[0].suppressed.kind == "waiver"
    assert moe[0].suppressed.justification == "layer 0 keeps the reference MoE"
    assert moe[0].suppressed.location.line == line_of(policy, "- rule: moe-not-fused")
    assert verdict.suppressed == 1 and verdict.suppressed_by == {"waiver": 1}
    assert verdict.counts["error"] == sum(1 for f in findings if f.suppressed is None and f.severity.label == "error")
    assert not [f for f in findings if f.rule.startswith("waiver-")]


def test_a_waiver_by_code_without_node_covers_every_finding_of_its_rule(unfused, write_policy):
    policy = write_policy("name: p\nwaivers:\n  - {rule: OGF002, reason: attention fusion lands next release}\n")
    findings, _ = gate(unfused, policy)
    gqa = [f for f in findings if f.rule == "gqa-not-fused"]
    assert len(gqa) == 2 and all(f.suppressed is not None for f in gqa)
    assert all(f.suppressed is None for f in findings if f.rule == "moe-not-fused")


@pytest.mark.parametrize("days_after_expiry, applies", [(0, True), (1, False)])
def test_a_waiver_applies_through_its_expiry_date_and_not_a_day_longer(unfused, write_policy, days_after_expiry,
                                                                       applies):
    policy = write_policy("name: p\nwaivers:\n  - {rule: gqa-not-fused, reason: due, expires: 2031-05-20}\n")
    today = dt.date(2031, 5, 20) + dt.timedelta(days=days_after_expiry)
    findings, verdict = gate(unfused, policy, today=today)
    gqa = [f for f in findings if f.rule == "gqa-not-fused"]
    expired = [f for f in findings if f.rule == "waiver-expired"]
    assert all((f.suppressed is not None) == applies for f in gqa)
    if applies:
        assert expired == []
    else:
        [finding] = expired
        assert finding.location.line == line_of(policy, "gqa-not-fused")
        assert "expired on 2031-05-20" in finding.message
        assert not verdict.passed


def test_a_waiver_that_matches_nothing_is_reported_unused(unfused, write_policy):
    policy = write_policy("name: p\nwaivers:\n"
                          "  - {rule: moe-not-fused, node: '/model/layers.7/*', reason: stale}\n")
    findings, _ = gate(unfused, policy)
    [unused] = [f for f in findings if f.rule == "waiver-unused"]
    assert unused.location.line == 3 and unused.severity.label == "warning"
    assert "/model/layers.7/*" in unused.message
    assert all(f.suppressed is None for f in findings)


def test_a_waiver_for_a_rule_that_did_not_run_is_not_called_unused(unfused, write_policy):
    policy = write_policy("name: p\nwaivers:\n  - {rule: gqa-not-fused, node: '/model/layers.7/*', reason: x}\n")
    findings, _ = gate(unfused, policy, select=["moe-not-fused", "OGW"])
    assert [f for f in findings if f.rule == "waiver-unused"] == []


def test_severity_overrides_reach_the_waiver_findings(unfused, write_policy):
    policy = write_policy("name: p\nrules:\n  severity: {waiver-unused: error}\n"
                          "waivers:\n  - {rule: moe-not-fused, node: nothing-matches, reason: x}\n")
    findings, verdict = gate(unfused, policy, select=["OGF001", "OGW"])
    [unused] = [f for f in findings if f.rule == "waiver-unused"]
    assert unused.severity.label == "error" and not verdict.passed


@pytest.mark.parametrize("waiver, key, problem", [
    ("{rule: moe-not-fused}", "waivers[0]", "'reason' is a required property"),
    ("{rule: moe-not-fused, reason: '  '}", "waivers[0].reason", "a waiver needs a reason"),
    ("{rule: moe-not-fused, reason: x, expires: 2025-02-30}", "waivers[0].expires", "'2025-02-30' is not a date"),
    ("{rule: moe-not-fused, reason: x, expires: next-week}", "waivers[0].expires", "is not a date"),
    ("{rule: moe-not-fusd, reason: x}", "waivers[0].rule", "unknown rule 'moe-not-fusd'; did you mean 'moe-not-fused'?"),
])
def test_a_malformed_waiver_is_a_one_line_input_error_naming_file_and_key(unfused, write_policy, waiver, key,
                                                                           problem):
    policy = write_policy(f"name: p\nwaivers:\n  - {waiver}\n")
    code, out, err = run_cli("lint", unfused, "--policy", policy)
    assert (code, out) == (2, "")
    assert err.startswith(f"ortgate: error: {policy}:3: {key}: ")
    assert problem in err and err.count("\n") == 1


def test_policy_validate_rejects_a_waiver_for_an_unknown_rule(write_policy):
    policy = write_policy("name: p\nwaivers:\n  - {rule: gqa-unfused, reason: x}\n")
    code, _, err = run_cli("policy", "validate", policy)
    assert code == 2 and f"{policy}:3: waivers[0].rule: unknown rule 'gqa-unfused'" in err


# Baselines ----------------------------------------------------------------------------------------------------

def _export(make_model, folder: Path, layers: int) -> Path:
    """An unfused export of `layers` decoder layers, saved as FOLDER/model.onnx."""
    folder.mkdir()
    built = make_model(layers=layers, moe="dense_loop", attention="decomposed", kv_cache=False)
    return built.rename(folder / "model.onnx")


def test_a_baseline_accepts_existing_findings_and_fails_only_on_new_ones(make_model, tmp_path):
    v1 = _export(make_model, tmp_path / "v1", layers=2)
    baseline = tmp_path / "ortgate-baseline.json"
    code, _, err = run_cli("lint", v1, "--select", "OGF001,OGF002", "--write-baseline", baseline)
    assert (code, err) == (0, "")
    doc = json.loads(baseline.read_text())
    assert doc["format"] == "ortgate-baseline" and doc["version"] == 4
    assert {(e["rule"], e["node"]) for e in doc["findings"]} == {
        ("moe-not-fused", "/model/layers.0/moe/router/MatMul"), ("moe-not-fused", "/model/layers.1/moe/router/MatMul"),
        ("gqa-not-fused", "/model/layers.0/attn/Softmax"), ("gqa-not-fused", "/model/layers.1/attn/Softmax")}

    # The next export, in the model's place, grew a layer: only that layer's findings are new.
    v1.unlink()
    v1.parent.rmdir()
    v2 = _export(make_model, tmp_path / "v1", layers=3)
    code, report = run_cli_json("lint", v2, "--select", "OGF001,OGF002", "--baseline", baseline)
    assert code == 1
    active = [(f["rule"], f["layer"]) for f in report["findings"] if f["suppressed"] is None]
    assert sorted(active) == [("gqa-not-fused", 2), ("moe-not-fused", 2)]
    assert report["verdict"]["suppressed_by"] == {"baseline": 4}
    suppressed = [f["suppressed"] for f in report["findings"] if f["suppressed"]]
    assert all(s["kind"] == "baseline" and s["file"] == str(baseline) for s in suppressed)


def test_a_baseline_ignores_line_numbers(unfused, write_policy, tmp_path):
    text = "name: p\nmodel:\n  moe_layers: 3\n"  # the graph has 2: a count finding on line 3
    policy = write_policy(text)
    baseline = tmp_path / "b.json"
    assert run_cli("lint", unfused, "--policy", policy, "--select", "OGF001", "--write-baseline", baseline)[0] == 0
    moved = write_policy("# a comment\n\n# moved the keys down\n" + text)
    code, report = run_cli_json("lint", unfused, "--policy", moved, "--select", "OGF001", "--baseline", baseline)
    config_findings = [f for f in report["findings"] if f["key_path"] == "model.moe_layers"]
    assert config_findings and config_findings[0]["line"] == 6
    assert code == 0 and all(f["suppressed"] for f in report["findings"])


def test_a_baseline_never_silences_an_expired_waiver(unfused, write_policy, tmp_path):
    policy = write_policy("name: p\nwaivers:\n  - {rule: gqa-not-fused, reason: due, expires: 2020-01-01}\n")
    baseline = tmp_path / "b.json"
    code, _, _ = run_cli("lint", unfused, "--policy", policy, "--select", "OGF002,OGW", "--write-baseline", baseline)
    assert code == 1
    assert {e["rule"] for e in json.loads(baseline.read_text())["findings"]} == {"gqa-not-fused"}
    findings, verdict = gate(unfused, policy, select=["OGF002", "OGW"], baseline=load_baseline(baseline))
    assert [f.rule for f in findings if f.suppressed is None] == ["waiver-expired"]


def test_write_baseline_may_rewrite_the_baseline_it_read(unfused, tmp_path):
    baseline = tmp_path / "b.json"
    run_cli("lint", unfused, "--select", "OGF001", "--write-baseline", baseline)
    code, _, err = run_cli("lint", unfused, "--select", "OGF001,OGF002", "--baseline", baseline,
                           "--write-baseline", baseline)
    assert (code, err) == (0, "")
    assert {e["rule"] for e in json.loads(baseline.read_text())["findings"]} == {"moe-not-fused", "gqa-not-fused"}


@pytest.mark.parametrize("target", ["model", "policy", "other"])
def test_write_baseline_refuses_to_overwrite_an_input_or_a_foreign_file(unfused, write_policy, tmp_path, target):
    policy = write_policy("name: p\n")
    other = tmp_path / "notes.json"
    other.write_text('{"keep": true}\n')
    path = {"model": unfused, "policy": policy, "other": other}[target]
    before = path.read_bytes()
    code, out, err = run_cli("lint", unfused, "--policy", policy, "--write-baseline", path)
    assert (code, out) == (2, "")
    assert err.startswith(f"ortgate: error: {path}: refusing to")
    assert path.read_bytes() == before


@pytest.mark.parametrize("content, key", [
    ('{"findings": []}', "format"),
    ('{"format": "ruff-baseline", "version": 1, "findings": []}', "format"),
    ('{"format": "ortgate-baseline", "version": 7, "findings": []}', "version"),
    ('{"format": "ortgate-baseline", "version": 1, "findings": {}}', "findings"),
    ('{"format": "ortgate-baseline", "version": 1,\n "findings": [{"rule": "moe-not-fused"}]}', "findings[0].identity"),
])
def test_a_file_that_is_not_an_ortgate_baseline_is_an_input_error_naming_the_key(unfused, tmp_path, content, key):
    path = tmp_path / "baseline.json"
    path.write_text(content)
    code, out, err = run_cli("lint", unfused, "--baseline", path)
    assert (code, out) == (2, "")
    assert err.startswith(f"ortgate: error: {path}:") and f": {key}: " in err and err.count("\n") == 1


def test_a_yaml_file_given_as_baseline_is_an_input_error(unfused, write_policy):
    policy = write_policy("name: p\n")
    code, _, err = run_cli("lint", unfused, "--baseline", policy)
    assert code == 2 and "not valid JSON" in err and "not an ortgate baseline" in err


# Verdict ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("level, fail_on, code", [
    ("error", "error", 1),
    ("warning", "warning", 1),   # at the threshold: fails
    ("warning", "error", 0),     # one step below: passes
    ("info", "info", 1),
    ("info", "warning", 0),
])
def test_fail_on_is_inclusive_at_both_boundaries(unfused, write_policy, level, fail_on, code):
    policy = write_policy(f"name: p\nrules:\n  severity: {{moe-not-fused: {level}}}\n")
    result, report = run_cli_json("lint", unfused, "--policy", policy, "--select", "OGF001", "--fail-on", fail_on)
    assert {f["severity"] for f in report["findings"]} == {level}
    assert result == code and report["verdict"]["passed"] == (code == 0)


def test_exit_zero_reports_the_failure_but_exits_0(unfused):
    code, out, _ = run_cli("lint", unfused, "--select", "OGF001", "--exit-zero")
    assert code == 0 and out.splitlines()[-1].startswith("FAIL")


def test_a_waiver_by_layers_covers_only_those_layers(write_policy):
    """A dynamo export's node names carry no layer number: `layers:` waives by decoder layer instead."""
    from tests.conftest import EXPORTED
    from tests.helpers import run_cli_json

    policy = write_policy("name: p\nwaivers:\n  - rule: moe-not-fused\n    layers: [1]\n    reason: layer 1 next sprint\n"
                          "  - rule: gqa-not-fused\n    layers: ['0-1']\n    reason: attention re-export pending\n")
    _, report = run_cli_json("lint", EXPORTED / "dynamo-qwen3_moe", "--policy", policy, "--select",
                             "moe-not-fused,gqa-not-fused,OGW")
    state = {(f["rule"], f["layer"]): f["suppressed"] is not None for f in report["findings"]}
    assert state == {("moe-not-fused", 0): False, ("moe-not-fused", 1): True,
                     ("gqa-not-fused", 0): True, ("gqa-not-fused", 1): True}
    bad = write_policy("name: p\nwaivers:\n  - rule: moe-not-fused\n    layers: [one]\n    reason: r\n", "bad.yaml")
    from tests.helpers import run_cli

    code, _, err = run_cli("policy", "validate", bad)
    assert code == 2 and "waivers[0].layers[0]" in err
