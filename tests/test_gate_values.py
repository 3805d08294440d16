"""The gate's data are values: a GateConfig is frozen, applying a baseline returns the entries it matched instead of
writing them into the Baseline, and `ortgate lint` judges its findings once, also when it writes a baseline."""

from __future__ import annotations

import dataclasses
import json

import pytest

import ortgate.engine.pipeline as pipeline
from ortgate.engine.baseline import load_baseline
from ortgate.engine.gate import gate, gate_config_from, selected_rules
from ortgate.engine.pipeline import LintRequest, collect, load_inputs
from tests.conftest import EXAMPLES, POLICIES
from tests.helpers import run_cli

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"
CPU_POLICY = POLICIES / "tiny-moe-cpu.yaml"


def test_a_gate_config_is_frozen():
    config = gate_config_from(None, cli_select=["OGF001"], cli_ignore=None, fail_on=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.baseline = None  # type: ignore[misc]
    assert isinstance(config.select, tuple) and isinstance(config.waivers, tuple)


def test_the_gate_returns_the_baseline_entries_it_matched_and_leaves_the_baseline_as_loaded(tmp_path):
    baseline_path = tmp_path / "bl.json"
    assert run_cli("lint", UNFUSED, "--policy", CPU_POLICY, "--write-baseline", baseline_path)[0] == 0
    document = json.loads(baseline_path.read_text())
    stale = {"fingerprint": "moe-not-fused|gone.onnx|0|model:MatMul#0", "rule": "moe-not-fused", "file": "gone.onnx"}
    document["findings"].append(stale)
    baseline_path.write_text(json.dumps(document))
    baseline = load_baseline(baseline_path)
    before = dataclasses.asdict(baseline)
    inputs = load_inputs(LintRequest(str(UNFUSED), str(CPU_POLICY)))
    config = gate_config_from(inputs.policy, cli_select=None, cli_ignore=None, fail_on=None, baseline=baseline,
                              baseline_path=str(baseline_path))
    raw = collect(inputs, selected_rules(config))
    first, second = gate(raw, config), gate(raw, config)
    assert first == second  # nothing carried from one application to the next
    unmatched = [i for i, e in enumerate(baseline.entries) if e.data == stale]
    assert first.matched and unmatched and set(unmatched).isdisjoint(first.matched)
    assert len(first.matched) == len(baseline.entries) - 1
    assert dataclasses.asdict(baseline) == before


@pytest.mark.parametrize("extra", [[], ["--write-baseline", "bl.json"], ["--baseline", "bl.json", "--prune-baseline"]],
                         ids=["plain", "write-baseline", "prune-baseline"])
def test_lint_judges_once(tmp_path, monkeypatch, extra):
    monkeypatch.chdir(tmp_path)
    if "--prune-baseline" in extra:
        assert run_cli("lint", UNFUSED, "--policy", CPU_POLICY, "--write-baseline", "bl.json")[0] == 0
    calls = []
    judge = pipeline.judge

    def counted(*args, **kwargs):
        calls.append(args[2])
        return judge(*args, **kwargs)

    monkeypatch.setattr(pipeline, "judge", counted)
    code, out, err = run_cli("lint", UNFUSED, "--policy", CPU_POLICY, *extra)
    assert code == (1 if not extra else 0), err
    assert len(calls) == 1
    if extra:  # judged against the baseline just written
        assert calls[0].baseline_path == "bl.json" and "suppressed" in out


def test_run_judges_once_against_the_baseline_it_writes(tmp_path, monkeypatch):
    import ortgate.engine.run as engine_run

    monkeypatch.chdir(tmp_path)
    calls = []
    judge = engine_run.judge

    def counted(*args, **kwargs):
        calls.append(args[2])
        return judge(*args, **kwargs)

    monkeypatch.setattr(engine_run, "judge", counted)
    monkeypatch.setattr(pipeline, "judge", counted)
    code, out, err = run_cli("run", UNFUSED, "--policy", CPU_POLICY, "--warmup", "1", "--iterations", "2",
                             "--write-baseline", "run-bl.json", "--format", "json")
    assert code == 0, err
    assert len(calls) == 1 and calls[0].baseline_path == "run-bl.json"
    written = json.loads((tmp_path / "run-bl.json").read_text())
    assert written["format"] == "ortgate-baseline" and written["findings"]
    report = json.loads(out)
    suppressed = [f for f in report["findings"] if f.get("suppressed")]
    assert len(suppressed) == len(written["findings"])  # each entry written suppresses the finding it is for


def test_a_lint_result_and_its_summary_are_frozen_values():
    from ortgate.engine.pipeline import LintSummary, ModelSummary, NotChecked, lint
    from ortgate.engine.pricing import EstimateHeadline

    inputs = load_inputs(LintRequest(str(UNFUSED), str(CPU_POLICY)))
    result = lint(inputs, gate_config_from(inputs.policy, cli_select=None, cli_ignore=None, fail_on=None))
    summary = result.summary
    assert isinstance(summary, LintSummary) and isinstance(summary.models[0], ModelSummary)
    assert isinstance(summary.estimate, EstimateHeadline) and all(isinstance(g, NotChecked) for g in summary.not_checked)
    for value in (result, summary, summary.models[0], summary.estimate):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.__setattr__(dataclasses.fields(value)[0].name, None)
    assert summary.to_dict()["estimate"] == summary.estimate.to_dict() and summary.to_dict()["model"] == summary.model
