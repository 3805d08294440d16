"""A lint's graph index is freed when the lint is done, by reference counting alone.

`ortgate lint` pauses the cyclic garbage collector while it indexes and checks a model (the index is large and
acyclic). A reference cycle through the index (a cached pattern or cost model that refers back to its graph)
would keep every lint's whole index alive until the collector runs again: a process that lints model after model
(a benchmark, a CI step linting many models, a library user) would grow by the size of each index.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import LintRequest, lint, load_inputs
from ortgate.report import render
from tests.conftest import REPO

UNFUSED = str(REPO / "examples" / "qwen3-moe-tiny-unfused")
FUSED = str(REPO / "examples" / "qwen3-moe-tiny-fused")
POLICY = str(REPO / "policies" / "qwen3-30b-a3b-cuda.yaml")  # a throughput block: the cost model runs too


@pytest.fixture
def collector_paused():
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@pytest.mark.parametrize("model", [UNFUSED, FUSED], ids=["unfused", "fused"])
def test_a_linted_graph_is_freed_without_the_cyclic_collector(model, collector_paused):
    inputs = load_inputs(LintRequest(model, POLICY))
    config = gate_config_from(inputs.policy, cli_select=None, cli_ignore=None, fail_on=None)
    result = lint(inputs, config)
    assert inputs.estimate is not None  # the cost model ran and is cached on the graph
    assert result.findings and render("json", result) and render("text", result)
    graph = weakref.ref(inputs.model)
    del inputs, result
    assert graph() is None, "the graph index is only reachable through a reference cycle"
