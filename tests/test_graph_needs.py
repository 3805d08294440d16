"""Rules that cannot apply to a model do not run: a rule about MoE layers, attention or a KV cache declares it as a
need (rules/needs.py), the engine checks the need with a look-up in the graph index, and the rule's body never runs
on a model without one."""

from __future__ import annotations

import dataclasses

import pytest

from ortgate.engine.pipeline import LintRequest, load_inputs, run_rules
from ortgate.graph.patterns.attention import attention_cores, fused_attention_nodes
from ortgate.graph.patterns.decoder import cache_outputs
from ortgate.graph.patterns.moe import moe_blocks
from ortgate.rules import all_rules
from ortgate.rules.needs import has
from tests.conftest import EXAMPLES, EXPORTED, POLICIES

CUDA_POLICY = POLICIES / "qwen3-30b-a3b-cuda.yaml"  # declares a CUDA provider: the rules' other needs are met
MOE_RULES = {"OGF001", "OGF008", "OGM001", "OGX008", "OGK006", "OGK007", "OGK008"}
ATTENTION_RULES = {"OGF002", "OGF007", "OGF011", "OGM002", "OGM005", "OGK009"}
KV_CACHE_RULES = {"OGM012"}
WITHOUT_ANY = EXPORTED / "dynamo-mamba"  # a state-space model: no MoE, no attention, no KV cache
WITH_ALL = EXPORTED / "genai-qwen3_5_moe-fp16-cuda"  # fused MoE, GroupQueryAttention, a KV cache


def _bodies_run(model, policy=CUDA_POLICY) -> set[str]:
    """The codes of the rules whose check function the engine called in a lint of `model`."""
    inputs = load_inputs(LintRequest(str(model), str(policy)))
    ran: set[str] = set()

    def spy(rule):
        def check(ctx):
            ran.add(rule.code)
            return rule.check(ctx)
        return dataclasses.replace(rule, check=check)

    run_rules(inputs, [spy(r) for r in all_rules()])
    return ran


def test_a_model_without_moe_attention_or_kv_cache_runs_none_of_their_rules():
    ran = _bodies_run(WITHOUT_ANY)
    assert ran, "no rule ran at all"
    assert ran & (MOE_RULES | ATTENTION_RULES | KV_CACHE_RULES) == set()


def test_a_model_with_them_runs_those_rules():
    ran = _bodies_run(WITH_ALL)
    assert MOE_RULES - {"OGK006"} <= ran  # moe-cpu-kernel-miscomputes needs a CPU deployment besides
    assert ATTENTION_RULES <= ran and KV_CACHE_RULES <= ran


def test_those_rules_declare_the_need():
    needs = {r.code: r.needs for r in all_rules()}
    for codes, need in ((MOE_RULES, "moe"), (ATTENTION_RULES, "attention"), (KV_CACHE_RULES, "kv_cache")):
        assert all(need in needs[code] for code in codes), need


_MODELS = sorted(p for p in EXPORTED.iterdir() if (p / "model.onnx").is_file()) + sorted(
    p for p in EXAMPLES.iterdir() if (p / "model.onnx").is_file())


@pytest.mark.parametrize("model", _MODELS, ids=lambda p: p.name)
def test_a_graph_need_is_unmet_only_where_the_patterns_find_nothing(model):
    """The look-up a graph need is checked with agrees with the patterns the rules read: where it says there is no MoE
    layer (attention, KV cache), the pattern finds none."""
    inputs = load_inputs(LintRequest(str(model)))
    graph = inputs.model
    if not has("moe", inputs):
        assert moe_blocks(graph) == []
    if not has("attention", inputs):
        assert fused_attention_nodes(graph) == [] and attention_cores(graph) == []
    if not has("kv_cache", inputs):
        assert cache_outputs(graph) == []


def test_the_graph_needs_tell_models_apart():
    """Each graph need is met by some committed model and unmet by another: none is a constant."""
    seen = {need: set() for need in ("moe", "attention", "kv_cache")}
    for model in (WITHOUT_ANY, WITH_ALL, EXPORTED / "optimum-llama-past"):
        inputs = load_inputs(LintRequest(str(model)))
        for need, values in seen.items():
            values.add(has(need, inputs))
    assert all(values == {True, False} for values in seen.values()), seen
