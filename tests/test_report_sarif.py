"""SARIF: valid against the official 2.1.0 schema (tests/data/sarif-schema-2.1.0.json, OASIS errata01), rules
documented from their docstrings, graph findings at the model file with the node as a logical location,
config findings at their policy line, line-independent fingerprints, waivers as suppressions."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import jsonschema
import pytest

from ortgate.rules import find_rule
from tests.conftest import REPO
from tests.helpers import run_cli

SCHEMA = REPO / "tests" / "data" / "sarif-schema-2.1.0.json"
UNFUSED = "examples/qwen3-moe-tiny-unfused"
FUSED = "examples/qwen3-moe-tiny-fused"
POLICY = "policies/tiny-moe-cpu.yaml"
WAIVERS = "tests/data/policies/tiny-moe-cpu-waivers.yaml"


@cache
def validator() -> jsonschema.Draft4Validator:
    schema = json.loads(SCHEMA.read_text())
    assert schema["id"].endswith("/sarif-schema-2.1.0.json")
    return jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)


def sarif(*args) -> dict:
    code, out, err = run_cli("lint", *args, "--format", "sarif")
    assert err == "" and code in (0, 1)
    return json.loads(out)


def line_of(path, text: str) -> int:
    return next(i for i, line in enumerate((REPO / path).read_text().splitlines(), start=1) if text in line)


@pytest.mark.parametrize("args", [
    (UNFUSED, "--policy", POLICY),
    (FUSED, "--policy", POLICY),
    (UNFUSED, "--policy", WAIVERS),
    (UNFUSED,),
])
def test_the_report_is_valid_sarif_2_1_0(args):
    log = sarif(*args)
    errors = sorted(validator().iter_errors(log), key=lambda e: list(map(str, e.absolute_path)))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors[:5]]
    assert log["version"] == "2.1.0"


def test_the_validator_rejects_what_the_schema_forbids():
    log = sarif(UNFUSED, "--policy", POLICY)
    log["runs"][0]["results"][0]["level"] = "fatal"
    log["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] = 0
    assert len(list(validator().iter_errors(log))) == 2


def test_every_rule_that_ran_is_described_from_its_docstring():
    run = sarif(UNFUSED, "--policy", POLICY)["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == sorted(r["id"] for r in rules)
    for descriptor in rules:
        rule = find_rule(descriptor["id"])
        assert descriptor["name"] == rule.name
        assert descriptor["shortDescription"]["text"] == rule.summary
        assert descriptor["fullDescription"]["text"] == " ".join(rule.section("What it checks").split())
        assert rule.section("Fix") in descriptor["help"]["markdown"] and "## Why it costs throughput" in descriptor["help"]["markdown"]
        assert descriptor["defaultConfiguration"]["level"] == {"error": "error", "warning": "warning",
                                                                "info": "note"}[rule.severity.label]
    for result in run["results"]:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]


def test_graph_findings_point_at_the_model_with_the_node_as_a_logical_location():
    results = sarif(UNFUSED, "--policy", POLICY, "--select", "moe-not-fused")["runs"][0]["results"]
    graph = [r for r in results if r["locations"][0].get("logicalLocations", [{}])[0].get("kind") == "function"]
    assert len(graph) == 2
    for r in graph:
        artifact = r["locations"][0]["physicalLocation"]["artifactLocation"]
        assert artifact == {"uri": f"{UNFUSED}/model.onnx", "uriBaseId": "%SRCROOT%"}
        logical = r["locations"][0]["logicalLocations"][0]
        layer = r["properties"]["layer"]
        assert logical["name"] == f"model.layers.{layer}.mlp.gate/MatMul"
        assert logical["fullyQualifiedName"] == f"layers.{layer}::{logical['name']}"
        assert r["message"]["text"].startswith(f"layer {layer}, {logical['name']}: ")


def _miscounting_policy(folder: Path, header: str = "") -> Path:
    """tiny-moe-cpu expecting 3 MoE layers of the 2-layer example: a finding on the policy's moe_layers line."""
    folder.mkdir(exist_ok=True)
    path = folder / "tiny-moe-cpu.yaml"
    text = (REPO / POLICY).read_text().replace("moe_layers: 2", "moe_layers: 3")
    path.write_text(header + text)
    return path


def test_config_findings_point_at_the_policy_line_that_causes_them(tmp_path):
    policy = _miscounting_policy(tmp_path)
    results = sarif(UNFUSED, "--policy", policy, "--select", "moe-not-fused")["runs"][0]["results"]
    [config] = [r for r in results if r["locations"][0]["logicalLocations"][0]["kind"] == "property"]
    physical = config["locations"][0]["physicalLocation"]
    assert physical["artifactLocation"]["uri"] == policy.as_uri()
    assert physical["region"]["startLine"] == line_of(policy, "moe_layers:")
    assert config["locations"][0]["logicalLocations"][0]["fullyQualifiedName"] == "model.moe_layers"


def test_fingerprints_ignore_line_numbers_and_tell_findings_apart(tmp_path):
    policy = _miscounting_policy(tmp_path)
    before = sarif(UNFUSED, "--policy", policy)["runs"][0]["results"]
    moved = _miscounting_policy(tmp_path, "# three lines\n# pushed the keys\n# down\n")  # the same file, edited
    after = sarif(UNFUSED, "--policy", moved)["runs"][0]["results"]

    def by_fingerprint(results):
        return {r["partialFingerprints"]["ortgate/v3"]: r for r in results}

    assert len(by_fingerprint(before)) == len(before)  # every finding has its own
    assert by_fingerprint(before).keys() == by_fingerprint(after).keys()
    lines = {fp: r["locations"][0]["physicalLocation"]["region"]["startLine"] for fp, r in by_fingerprint(after).items()
             if r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == moved.as_uri()}
    assert lines and all(lines[fp] == by_fingerprint(before)[fp]["locations"][0]["physicalLocation"]["region"]["startLine"] + 3
                         for fp in lines)


def test_a_waived_finding_carries_a_suppression_with_the_waivers_reason_and_line():
    run = sarif(UNFUSED, "--policy", WAIVERS)["runs"][0]
    suppressed = [r for r in run["results"] if r.get("suppressions")]
    assert len(suppressed) == 1
    [s] = suppressed[0]["suppressions"]
    assert s["kind"] == "external" and s["status"] == "accepted"
    assert s["justification"] == "layer 0 keeps the reference MoE until the re-export lands"
    assert s["location"]["physicalLocation"]["artifactLocation"]["uri"] == WAIVERS
    assert s["location"]["physicalLocation"]["region"]["startLine"] == line_of(WAIVERS, "- rule: moe-not-fused")
    assert suppressed[0]["locations"][0]["logicalLocations"][0]["name"] == "model.layers.0.mlp.gate/MatMul"
    expired = [r for r in run["results"] if r["ruleId"] == "OGW001"]
    assert expired[0]["locations"][0]["physicalLocation"]["region"]["startLine"] == line_of(WAIVERS, "- rule: gqa-not-fused")


def test_a_baseline_suppression_names_the_baseline(tmp_path):
    baseline = tmp_path / "baseline.json"
    assert run_cli("lint", UNFUSED, "--select", "OGF001", "--write-baseline", baseline)[0] == 0
    results = sarif(UNFUSED, "--select", "OGF001", "--baseline", baseline)["runs"][0]["results"]
    assert results and all(r["suppressions"][0]["justification"] == f"in the baseline {baseline}" for r in results)
    assert all(r["suppressions"][0]["location"]["physicalLocation"]["artifactLocation"]["uri"] == baseline.as_uri()
               for r in results)


def test_files_outside_the_source_root_are_absolute_file_uris(tmp_path, make_model):
    model = make_model(moe="dense_loop")
    results = sarif(model, "--select", "OGF001")["runs"][0]["results"]
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"] == {"uri": model.resolve().as_uri()}
    assert not list(validator().iter_errors(sarif(model, "--select", "OGF001")))


def test_on_github_paths_are_relative_to_the_workspace(monkeypatch):
    monkeypatch.setenv("GITHUB_WORKSPACE", str(REPO / "examples"))
    results = sarif(UNFUSED, "--select", "OGF001")["runs"][0]["results"]
    assert results[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "qwen3-moe-tiny-unfused/model.onnx"
