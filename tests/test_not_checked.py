"""A lint names the rule families that had nothing to judge (no policy, no provider, no genai_config.json to compare
with) instead of passing in silence, in every report that has a place for it."""

from __future__ import annotations

import json

from tests.conftest import EXAMPLES, EXPORTED, POLICIES
from tests.helpers import run_cli, run_cli_json

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"  # no genai_config.json
GENAI = EXPORTED / "genai-qwen3_5_moe-fp32-cpu"  # model.onnx + genai_config.json


def gaps(report: dict) -> dict[str, str]:
    return {f["prefix"]: gap["reason"] for gap in report["inputs"]["not_checked"] for f in gap["families"]}


def test_lint_without_a_policy_names_the_families_that_did_not_run():
    code, report = run_cli_json("lint", UNFUSED)
    assert set(gaps(report)) == {"OGS", "OGP", "OGK", "OGC"}
    assert all("pass --policy" in reason for reason in gaps(report).values())
    code, text, _ = run_cli("lint", UNFUSED)
    (line,) = [line for line in text.replace("\n    ", " ").splitlines() if line.startswith("not checked: ")]
    assert "session (OGS), provider (OGP), placement (OGK) and drift (OGC) rules" in line
    assert text.rstrip("\n").splitlines()[-1].startswith("FAIL")  # the verdict stays the last line


def test_every_report_format_with_a_place_for_it_says_so():
    _, markdown, _ = run_cli("lint", UNFUSED, "--format", "markdown")
    assert "**Not checked:** session (OGS), provider (OGP)" in markdown
    _, sarif, _ = run_cli("lint", UNFUSED, "--format", "sarif")
    props = json.loads(sarif)["runs"][0]["properties"]
    assert {f["prefix"] for gap in props["notChecked"] for f in gap["families"]} == {"OGS", "OGP", "OGK", "OGC"}


def test_a_policy_and_genai_config_leave_nothing_unchecked():
    _, report = run_cli_json("lint", GENAI, "--policy", POLICIES / "tiny-moe-cpu.yaml")
    assert report["inputs"]["not_checked"] == []


def test_genai_config_alone_declares_the_session_but_drift_needs_a_policy():
    _, report = run_cli_json("lint", GENAI)
    assert set(gaps(report)) == {"OGC"}


def test_a_policy_without_genai_config_leaves_drift_unchecked():
    _, report = run_cli_json("lint", UNFUSED, "--policy", POLICIES / "tiny-moe-cpu.yaml")
    assert gaps(report) == {"OGC": "drift compares the policy with genai_config.json, and there is none"}


def test_families_that_were_not_selected_are_not_named():
    _, report = run_cli_json("lint", UNFUSED, "--select", "OGF,OGM")
    assert report["inputs"]["not_checked"] == []
