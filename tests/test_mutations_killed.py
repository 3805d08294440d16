"""Behaviours that a mutation of the code once changed without any test noticing (scripts/mutation_check.py runs
those mutations against this file): the numbering of findings that share a structural signature, which baseline
identities depend on across re-exports, and the MoE anatomy's cross-check of what it reads against the form the
block was found as."""

from __future__ import annotations

import dataclasses
import sys

import onnx
import pytest

from ortgate.findings import Finding, Location, Severity, number_occurrences
from ortgate.graph import build_graph
from ortgate.graph.patterns.moe import ExpertForm, RoutingForm, moe_blocks
from ortgate.graph.patterns.moe_anatomy import _anatomy
from tests.conftest import EXAMPLES, EXPORTED, REPO
from tests.helpers import rule_findings

FUSED = EXAMPLES / "qwen3-moe-tiny-fused" / "model.onnx"
# A policy whose head counts differ from the fused example's: gqa-config-mismatch reports each GroupQueryAttention,
# one rule's findings with one anchor ("model:com.microsoft.GroupQueryAttention") told apart only by their occurrence.
CUDA_POLICY = REPO / "policies" / "qwen3-30b-a3b-cuda.yaml"
RULE = "gqa-config-mismatch"


def _numbered(model) -> list[tuple[int, int, str]]:
    found = [f for f in rule_findings(model, RULE, CUDA_POLICY) if f.anchor is not None]
    assert len(found) >= 2, "fewer than two findings with one signature: the test checks nothing"
    assert len({(f.layer, f.anchor) for f in found}) == 1
    return sorted((f.position or 0, f.occurrence, f.identity().rsplit("|", 1)[1]) for f in found)


def test_findings_with_one_signature_are_numbered_in_graph_order():
    numbered = _numbered(FUSED)
    anchor = "model:com.microsoft.GroupQueryAttention"
    assert [(occurrence, target) for _, occurrence, target in numbered] == [
        (i, f"{anchor}#{i}") for i in range(len(numbered))]


def test_a_re_export_that_renames_and_reorders_names_keeps_each_identity(tmp_path):
    """Node names reversed (a re-export renames every node): each finding keeps its identity, since the numbering
    follows the graph's order, not the names or the order the rule happened to walk them in."""
    model = onnx.load(str(FUSED), load_external_data=False)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{len(model.graph.node) - i:05d}"
    renamed = tmp_path / "model.onnx"
    onnx.save(model, renamed)
    before = rule_findings(FUSED, RULE, CUDA_POLICY)
    after = rule_findings(renamed, RULE, CUDA_POLICY)
    key = lambda f: f.position or 0  # noqa: E731
    assert [f.identity().rsplit("|", 1)[1] for f in sorted(before, key=key)] == [
        f.identity().rsplit("|", 1)[1] for f in sorted(after, key=key)]


def test_number_occurrences_orders_by_position_then_by_the_rules_order():
    """The numbering itself: graph position first; findings without one after, in the rule's order."""
    def finding(node: str, position: int | None) -> Finding:
        return Finding("OGX000", "r", Severity.WARNING, "m", Location("model.onnx"), node=node,
                       anchor="model:MatMul", position=position)

    numbered = number_occurrences([finding("c", None), finding("b", 7), finding("a", 3), finding("d", None)])
    assert {f.node: f.occurrence for f in numbered} == {"a": 0, "b": 1, "c": 2, "d": 3}


def _blocks(path):
    graph = build_graph(onnx.load(str(path), load_external_data=False), str(path))
    blocks = [b for b in moe_blocks(graph) if b.fused is None and b.router is not None and b.topk is not None]
    assert blocks, f"{path}: no unfused MoE block"
    return graph, blocks


@pytest.mark.parametrize("path", [EXAMPLES / "qwen3-moe-tiny-unfused" / "model.onnx",
                                  EXPORTED / "dynamo-gpt_oss" / "model.onnx"], ids=["softmax_topk", "topk_softmax"])
def test_the_anatomy_refuses_a_routing_other_than_the_one_the_block_was_found_as(path):
    graph, blocks = _blocks(path)
    for block in blocks:
        assert _anatomy(graph, block).refusal is None
        other = (RoutingForm.TOPK_SOFTMAX if block.routing_form is RoutingForm.SOFTMAX_TOPK
                 else RoutingForm.SOFTMAX_TOPK)
        refusal = _anatomy(graph, dataclasses.replace(block, routing_form=other)).refusal
        assert refusal == (f"the routing reads as {block.routing_form.words} where the block was found as "
                           f"{other.words}")


@pytest.mark.parametrize("path, other", [
    (EXAMPLES / "qwen3-moe-tiny-unfused" / "model.onnx", ExpertForm.GATHER),
    (EXPORTED / "optimum-qwen3_moe-past" / "model.onnx", ExpertForm.DENSE),
], ids=["dense-as-gather", "gather-as-dense"])
def test_the_anatomy_refuses_experts_read_in_another_form_than_found(path, other):
    graph, blocks = _blocks(path)
    for block in blocks:
        assert _anatomy(graph, block).refusal is None
        refusal = _anatomy(graph, dataclasses.replace(block, expert_form=other)).refusal
        assert refusal is not None and refusal.startswith("the experts read their input as a "), refusal
        assert refusal.endswith(f"but were found {other.words}")


@pytest.mark.parametrize("path", [EXAMPLES / "qwen3-moe-tiny-unfused" / "model.onnx",
                                  EXPORTED / "optimum-qwen3_moe-past" / "model.onnx"], ids=["dense", "gather"])
def test_the_anatomy_refuses_a_looped_block_found_as_batched(path):
    graph, blocks = _blocks(path)
    for block in blocks:
        refusal = _anatomy(graph, dataclasses.replace(block, expert_form=ExpertForm.BATCHED)).refusal
        assert refusal is not None and "but were found " + ExpertForm.BATCHED.words in refusal, refusal


@pytest.mark.parametrize("path, other", [
    (EXPORTED / "dynamo-gpt_oss_batched" / "model.onnx", ExpertForm.DENSE),
    (EXPORTED / "olive-mixtral" / "model.onnx", ExpertForm.GATHER),
], ids=["batched-as-dense", "batched-as-gather"])
def test_the_anatomy_refuses_a_batched_block_found_as_a_loop(path, other):
    graph, blocks = _blocks(path)
    for block in blocks:
        assert _anatomy(graph, block).refusal is None
        refusal = _anatomy(graph, dataclasses.replace(block, expert_form=other)).refusal
        assert refusal == f"one weighted output for all experts, but the experts were found {other.words}"


def test_every_mutation_of_the_mutation_check_still_applies():
    """scripts/mutation_check.py names its mutations by exact source text: each must still occur once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mutation_check", REPO / "scripts" / "mutation_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    assert module.MUTATIONS
    for m in module.MUTATIONS:
        assert (REPO / m.file).read_text().count(m.old) == 1, m.name
        assert all((REPO / t.split("::")[0]).is_file() for t in m.tests), m.name
