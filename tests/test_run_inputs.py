"""`ortgate run` judges the session's optimized dump as what it is: the graph ORT executes, already optimized.

The inputs a lint judges are one frozen value (`LintInputs`); the run derives a new one with ORT's dump and a
cost setup that prices the dump as optimized, so ORT's fusions are never applied to it a second time.
"""

from __future__ import annotations

import dataclasses

import pytest

from ortgate.cost import estimate
from ortgate.engine.run import run_reference
from ortgate.runner.collect import RunRequest

# QuickGeluFusion disabled: the dump keeps every x * Sigmoid(x) of the experts, which a cost model pricing the
# dump as unoptimized would fold into QuickGelu as ORT's CPU provider does by default.
POLICY = """name: cpu-no-quickgelu
extends: builtin:cpu
session:
  config_entries: {optimization.disable_specified_optimizers: QuickGeluFusion}
  free_dimension_overrides: {batch_size: 1, sequence_length: 1}
throughput:
  device: cpu
  calibration: {bandwidth_gb_s: 4.77, kernel_us: 0.5, graph_kernel_us: 0.5, memory_efficiency: 1.0}
runner: {warmup: 1, iterations: 2, past_sequence_length: 4}
"""


def test_run_prices_ort_s_dump_as_the_optimized_graph(make_model, write_policy):
    model = make_model(moe="dense_loop", moe_activation="silu", naming="opaque")
    outcome = run_reference(RunRequest(str(model), str(write_policy(POLICY))))
    inputs = outcome.inputs
    dump = inputs.optimized
    assert dump is not None and dump.by_op_type("Sigmoid"), "the dump keeps the SiLUs ORT was told not to fuse"
    assert inputs.cost is not None and inputs.cost.optimized
    priced = inputs.estimate
    assert priced is not None and priced.model.ort_fusions_applied == []
    # what pricing the dump as unoptimized says: ORT's QuickGeluFusion applied to a graph ORT already optimized
    twice = estimate(dump, dataclasses.replace(inputs.cost, optimized=False))
    assert any("QuickGeluFusion" in f for f in twice.model.ort_fusions_applied)
    assert priced.as_exported.totals.launches > twice.as_exported.totals.launches
    assert outcome.result.summary.estimate.as_exported.ms_per_step_expected == \
        pytest.approx(priced.as_exported.expected_s * 1e3, rel=1e-2, abs=1e-3)


def test_inputs_are_a_value(make_model, write_policy):
    from ortgate.engine.pipeline import LintRequest, load_inputs
    from ortgate.rules.context import EVIDENCE_KEY

    inputs = load_inputs(LintRequest(str(make_model()), str(write_policy(POLICY))))
    with pytest.raises(dataclasses.FrozenInstanceError):
        inputs.optimized = inputs.model  # type: ignore[misc]
    with_run = inputs.with_evidence(EVIDENCE_KEY, "evidence")
    assert EVIDENCE_KEY in with_run.evidence and EVIDENCE_KEY not in inputs.evidence
    dumped = inputs.with_optimized(inputs.model)
    assert (inputs.cost.optimized, dumped.cost.optimized) == (False, True)
