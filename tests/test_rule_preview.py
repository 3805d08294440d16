"""A rule in preview (`@rule(preview=True)`: new, not yet promoted) runs only when asked for: `--preview`, the
policy's `rules: {preview: true}`, or selected by its own code or name. A code prefix does not opt in, so an update
that adds a rule never fails a gate that passed before."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ortgate.rules import all_rules
from ortgate.rules.base import _REGISTRY
from tests.conftest import EXAMPLES, POLICIES
from tests.helpers import run_cli, run_cli_json

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"
CPU_POLICY = POLICIES / "tiny-moe-cpu.yaml"


@pytest.fixture
def moe_rule_in_preview(monkeypatch):
    rule = next(r for r in all_rules() if r.code == "OGF001")
    monkeypatch.setitem(_REGISTRY, rule.code, dataclasses.replace(rule, preview=True))


def _codes(*args) -> set[str]:
    _, report = run_cli_json("lint", UNFUSED, *args)
    return {f["code"] for f in report["findings"]}


def test_a_rule_in_preview_runs_only_when_asked_for(moe_rule_in_preview, write_policy):
    assert "OGF001" in _codes("--policy", CPU_POLICY, "--preview")
    assert "OGF001" not in _codes("--policy", CPU_POLICY)
    assert "OGF001" not in _codes("--policy", CPU_POLICY, "--select", "OGF")  # a prefix does not opt in
    assert "OGF001" in _codes("--policy", CPU_POLICY, "--select", "moe-not-fused")
    assert "OGF001" in _codes("--policy", CPU_POLICY, "--select", "OGF001,OGF002")
    opted_in = write_policy(CPU_POLICY.read_text() + "\nrules: {preview: true}\n")
    assert "OGF001" in _codes("--policy", opted_in)


def test_without_a_rule_in_preview_the_flag_changes_nothing():
    assert not [r for r in all_rules() if r.preview]  # every rule shipped today is promoted
    assert _codes("--policy", CPU_POLICY, "--preview") == _codes("--policy", CPU_POLICY)


def test_the_catalog_says_which_rules_are_in_preview():
    code, out, err = run_cli("rules", "--format", "json")
    assert code == 0, err
    assert {r["preview"] for r in json.loads(out)} == {False}
