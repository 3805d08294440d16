"""JUnit XML and GitLab Code Quality, the report formats other CI systems read, checked against their published
shapes (tests/data/formats: a JUnit XML schema and a JSON Schema of GitLab's Code Quality issues)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from lxml import etree

from tests.conftest import REPO
from tests.helpers import run_cli

FORMATS = REPO / "tests" / "data" / "formats"
UNFUSED = "examples/qwen3-moe-tiny-unfused"
WAIVERS = "tests/data/policies/tiny-moe-cpu-waivers.yaml"


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # paths in the reports are relative to the checkout, as on CI
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)


def junit(*argv) -> tuple[int, etree._Element]:
    code, out, err = run_cli("lint", *argv, "--format", "junit")
    assert err == "", err
    root = etree.fromstring(out.encode("utf-8"))
    schema = etree.XMLSchema(etree.parse(str(FORMATS / "junit.xsd")))
    assert schema.validate(root), schema.error_log
    return code, root


def test_junit_has_one_test_per_rule_and_fails_exactly_the_rules_that_fail_the_gate():
    code, root = junit(UNFUSED, "--policy", WAIVERS)
    assert code == 1
    [suite] = root.findall("testsuite")
    cases = suite.findall("testcase")
    _, report = run_cli("lint", UNFUSED, "--policy", WAIVERS, "--format", "json")[:2]
    findings = json.loads(report)["findings"]
    failing_codes = {f["code"] for f in findings if f["suppressed"] is None and f["severity"] == "error"}
    failed = {c.get("name").split()[0] for c in cases if c.find("failure") is not None}
    assert failed == failing_codes and failed
    assert int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == len(failed)
    assert root.get("failures") == suite.get("failures")
    moe = next(c for c in cases if c.get("name") == "OGF001 moe-not-fused")
    failure = moe.find("failure")
    assert failure.get("type") == "error" and "layer 1" in failure.get("message")
    assert "fix: Run `ortgate fix MODEL -o OUT`" in failure.text
    assert "waiver: " in moe.find("system-out").text  # the waived layer 0 is listed, not failed


def test_junit_passes_when_the_gate_passes():
    code, root = junit("examples/qwen3-moe-tiny-fused", "--select", "moe-not-fused,gqa-not-fused")
    assert code == 0 and root.get("failures") == "0" and int(root.get("tests")) >= 2


def test_the_junit_schema_rejects_what_ci_systems_reject():
    schema = etree.XMLSchema(etree.parse(str(FORMATS / "junit.xsd")))
    assert not schema.validate(etree.fromstring(b"<testsuites><testsuite name='x'/></testsuites>"))  # no counts
    assert not schema.validate(etree.fromstring(b"<testsuite name='x' tests='1' failures='0' errors='0'>"
                                                b"<testcase/></testsuite>"))  # a test without a name


def codequality(*argv) -> tuple[int, list]:
    code, out, err = run_cli("lint", *argv, "--format", "codequality")
    assert err == "", err
    issues = json.loads(out)
    jsonschema.validate(issues, json.loads((FORMATS / "gitlab-codequality.schema.json").read_text()))
    return code, issues


def test_codequality_lists_every_active_finding_with_unique_stable_fingerprints():
    code, issues = codequality(UNFUSED, "--policy", WAIVERS)
    _, again = codequality(UNFUSED, "--policy", WAIVERS)
    assert code == 1 and issues == again
    _, report = run_cli("lint", UNFUSED, "--policy", WAIVERS, "--format", "json")[:2]
    active = [f for f in json.loads(report)["findings"] if f["suppressed"] is None]
    assert len(issues) == len(active)
    assert len({i["fingerprint"] for i in issues}) == len(issues)
    paths = {i["location"]["path"] for i in issues}
    assert paths <= {"examples/qwen3-moe-tiny-unfused/model.onnx", WAIVERS, "policies/tiny-moe-cpu.yaml"}
    waiver = next(i for i in issues if i["check_name"] == "OGW001 waiver-expired")
    assert waiver["severity"] == "major" and waiver["location"]["lines"]["begin"] > 1


def test_side_reports_for_ci_formats(tmp_path):
    code, out, err = run_cli("lint", UNFUSED, "--junit", tmp_path / "r.xml", "--codequality", tmp_path / "cq.json",
                             "--select", "moe-not-fused")
    assert code == 1 and err == ""
    assert etree.parse(str(tmp_path / "r.xml")).getroot().tag == "testsuites"
    assert json.loads(Path(tmp_path / "cq.json").read_text())[0]["check_name"] == "OGF001 moe-not-fused"
