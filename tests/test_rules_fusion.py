"""moe-not-fused, gqa-not-fused, fusedmatmul-missing: this graph, this policy, these findings."""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLES, EXPORTED
from tests.helpers import by_rule, lint_findings

UNFUSED_MOE = dict(moe="dense_loop")
TINY_POLICY = """\
name: tiny
model: {layers: 2, moe_layers: 2, attention_layers: 2, num_heads: 4, kv_num_heads: 2}
"""


# moe-not-fused ----------------------------------------------------------------------------------------

def test_dense_expert_loop_is_reported_once_per_layer(make_model):
    model = make_model(layers=3, experts=4, **UNFUSED_MOE)
    found = by_rule(lint_findings(model, select=["moe-not-fused"]), "moe-not-fused")
    assert [f.layer for f in found] == [0, 1, 2]
    first = found[0]
    assert first.node == "/model/layers.0/moe/router/MatMul" or "layers.0" in first.node
    assert "4 experts" in first.message and "com.microsoft.MoE" in first.message
    assert any("TopK" in n or "topk" in n.lower() for n in first.related_nodes)
    assert dict(first.properties)["expert_projections"] >= 4 * 2


def test_gather_loop_routing_is_reported(make_model):
    found = by_rule(lint_findings(make_model(moe="gather_loop"), select=["moe-not-fused"]), "moe-not-fused")
    assert [f.layer for f in found] == [0, 1]


@pytest.mark.parametrize("renormalisation", ["sum", "l1", "clamped_sum"])
def test_every_renormalisation_spelling_is_named(make_model, renormalisation):
    """Top-k weights divided by their sum (Qwen3), their L1 norm (DBRX: ReduceL1 -> Div) or their sum clamped to a
    minimum (ERNIE-4.5: ReduceSum -> Clip -> Div) are renormalised; without the Div they are not."""
    for normalize in (1, 0):
        model = make_model(moe="dense_loop", renormalisation=renormalisation, normalize_routing_weights=normalize)
        found = by_rule(lint_findings(model, select=["moe-not-fused"]), "moe-not-fused")
        assert found and all(("renormalised" in f.message) == bool(normalize) for f in found)


def test_fused_moe_passes(make_model):
    assert by_rule(lint_findings(make_model(moe="fused"), select=["moe-not-fused"]), "moe-not-fused") == []


def test_qmoe_counts_as_fused(make_model):
    assert by_rule(lint_findings(make_model(moe="qmoe"), select=["moe-not-fused"]), "moe-not-fused") == []


def test_dense_mlp_model_has_no_moe_finding(make_model):
    assert lint_findings(make_model(moe="dense"), select=["moe-not-fused"]) == []


def test_more_moe_layers_in_the_policy_than_in_a_fused_graph_is_a_count_mismatch(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  moe_layers: 48\n")
    found = lint_findings(make_model(layers=2), policy, select=["moe-not-fused"])
    [count] = found
    assert count.rule == "moe-layer-count-mismatch" and "re-export" not in count.message.lower()
    assert count.location.line == 3 and count.location.file == str(policy)
    assert dict(count.properties) == {"expected": 48, "found": 2}
    assert "disagree on MoE layers" in count.message and "the policy expects 48" in count.message


def test_an_unfused_graph_with_the_declared_moe_layers_has_no_count_finding(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  moe_layers: 2\n")
    found = lint_findings(make_model(layers=2, moe="dense_loop"), policy, select=["moe-not-fused"])
    assert sorted(f.rule for f in found) == ["moe-not-fused", "moe-not-fused"]


def test_moe_behind_a_quantized_router_is_seen_and_counted(write_policy):
    """quantize_dynamic's routers (MatMulInteger -> Cast -> Mul(scale) -> Softmax -> TopK) are projections like any
    other: each layer's MoE is reported unfused, and the policy's count of MoE layers holds."""
    policy = write_policy("name: p\nmodel:\n  moe_layers: 2\n")
    found = lint_findings(EXPORTED / "quantdyn-olmoe" / "model.onnx", policy, select=["moe-not-fused"])
    assert [(f.rule, f.layer) for f in found] == [("moe-not-fused", 0), ("moe-not-fused", 1)]
    assert "8 experts" in found[0].message and "k=2" in found[0].message


def test_moe_layers_inferred_from_the_graph_never_judge_the_graph(make_model):
    # Without a policy the expected count comes from the graph itself: no count finding.
    assert lint_findings(make_model(layers=2), select=["moe-not-fused"]) == []


def test_dynamo_export_reports_every_moe_layer():
    found = by_rule(lint_findings(EXPORTED / "dynamo-qwen3_moe" / "model.onnx", select=["moe-not-fused"]),
                    "moe-not-fused")
    assert [f.layer for f in found] == [0, 1]


def _gate_up_through_split_to_sequence(path):
    """The generator's expert loop with each merged gate_up projection split by SplitToSequence -> SequenceAt (how
    torch.onnx writes a torch.chunk it cannot make static), as a torch.onnx export says it is."""
    import onnx
    from onnx import helper

    model = onnx.load(path)
    nodes = []
    for n in model.graph.node:
        if n.op_type != "Split" or "gate_up_proj" not in n.name:
            nodes.append(n)
            continue
        seq = f"{n.output[0]}_sequence"
        nodes.append(helper.make_node("SplitToSequence", list(n.input[:2]), [seq], name=f"{n.name}ToSequence",
                                      axis=next(a.i for a in n.attribute if a.name == "axis")))
        for i, out in enumerate(n.output):
            index = f"{n.name}/index_{i}"
            model.graph.initializer.append(helper.make_tensor(index, onnx.TensorProto.INT64, [], [i]))
            nodes.append(helper.make_node("SequenceAt", [seq, index], [out], name=f"{n.name}/SequenceAt_{i}"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.producer_name = "pytorch"
    onnx.save(model, path)
    return path


def test_a_gate_up_split_by_split_to_sequence_is_refused_naming_the_projection_and_what_works(make_model):
    model = _gate_up_through_split_to_sequence(make_model(moe="dense_loop"))
    found = by_rule(lint_findings(model, select=["moe-not-fused"]), "moe-not-fused")
    assert [f.layer for f in found] == [0, 1]
    fix = found[0].fix
    assert "computed by SequenceAt" not in fix
    assert "expert projection MatMul /model/layers.0/moe/experts.0/gate_up_proj/MatMul" in fix
    assert "SplitToSequence -> SequenceAt" in fix and "static split sizes" in fix and "`ortgate fix` rewrites" in fix


def test_an_undeclared_family_is_told_which_families_the_builder_refuses(make_model, write_policy):
    """A Qwen3-MoE user without a declared family reads that the genai builder refuses Qwen3-MoE; with the family
    declared the builder is not named at all."""
    model = make_model(moe="dense_loop", swiglu_fusion=1)
    found = by_rule(lint_findings(_gate_up_through_split_to_sequence(model), select=["moe-not-fused"]),
                    "moe-not-fused")
    assert "it refuses Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE" in found[0].fix
    declared = write_policy("name: p\nmodel: {family: qwen3_moe}\n")
    found = by_rule(lint_findings(model, declared, select=["moe-not-fused"]), "moe-not-fused")
    assert "onnxruntime_genai" not in found[0].fix and "static split sizes" in found[0].fix


# gqa-not-fused ----------------------------------------------------------------------------------------

def test_decomposed_attention_is_reported_per_layer(make_model):
    found = by_rule(lint_findings(make_model(attention="decomposed", layers=3), select=["gqa-not-fused"]),
                    "gqa-not-fused")
    assert [f.layer for f in found] == [0, 1, 2]
    assert all(f.op_type == "Softmax" for f in found)
    assert "K/V repeated" in found[0].message


def test_gqa_passes(make_model, write_policy):
    model = make_model(attention="gqa")
    assert by_rule(lint_findings(model, write_policy(TINY_POLICY), select=["gqa-not-fused"]), "gqa-not-fused") == []


def test_mha_with_fewer_kv_heads_is_reported(make_model):
    found = by_rule(lint_findings(make_model(attention="mha"), select=["gqa-not-fused"]), "gqa-not-fused")
    assert found and all(f.op_type == "com.microsoft.MultiHeadAttention" for f in found)


def test_mha_whose_kv_the_graph_does_not_show_expanded_is_said_as_the_policys_claim(make_model, write_policy):
    """MultiHeadAttention over as many kv heads as q heads in the graph, with a policy of 1 kv head: the finding says
    the policy declares it, and never that the graph expands K/V."""
    model = make_model(attention="mha", kv_num_heads=4)
    assert by_rule(lint_findings(model, select=["gqa-not-fused"]), "gqa-not-fused") == []
    policy = write_policy("name: p\nmodel: {num_heads: 4, kv_num_heads: 1}\n")
    found = by_rule(lint_findings(model, policy, select=["gqa-not-fused"]), "gqa-not-fused")
    assert found and all("the policy declares 4 q heads and 1 kv heads" in f.message for f in found)
    assert not [f for f in found if "while kv heads < q heads" in f.message]


def test_fewer_attention_layers_than_the_policy_declares(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  attention_layers: 4\n")
    found = by_rule(lint_findings(make_model(layers=2), policy, select=["attention-layer-count-mismatch"]),
                    "attention-layer-count-mismatch")
    assert [dict(f.properties) for f in found] == [{"expected": 4, "found": 2}]
    assert "2 GroupQueryAttention" in found[0].message


def test_decomposed_attention_layers_count_as_attention_layers(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  attention_layers: 2\n")
    found = lint_findings(make_model(layers=2, attention="decomposed", kv_cache=False), policy,
                          select=["gqa-not-fused"])
    assert sorted(f.rule for f in found) == ["gqa-not-fused", "gqa-not-fused"]


def test_gqa_heads_that_disagree_with_the_policy_are_a_config_mismatch(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  num_heads: 8\n  kv_num_heads: 2\n")
    found = lint_findings(make_model(num_heads=4, kv_num_heads=2), policy, select=["gqa-not-fused"])
    assert [(f.rule, dict(f.properties)["attribute"], dict(f.properties)["nodes"]) for f in found] == [
        ("gqa-config-mismatch", "num_heads", 2)]


def test_decomposed_attention_heads_are_the_graphs_and_a_policy_that_disagrees_is_a_finding(write_policy):
    """q_proj [64, 64] and k_proj [64, 32] at head size 16 are 4 q heads and 2 kv heads, whatever the policy says;
    a policy of 8 q heads and 1 kv head is what gqa-config-mismatch reports."""
    policy = write_policy("name: p\nmodel: {num_heads: 8, kv_num_heads: 1}\n")
    found = lint_findings(EXAMPLES / "qwen3-moe-tiny-unfused", policy,
                          select=["gqa-not-fused", "gqa-config-mismatch"])
    unfused = by_rule(found, "gqa-not-fused")
    assert unfused and all("4 q heads share 2 kv heads" in f.message and "head size 16" in f.message
                           for f in unfused)
    assert not [f for f in unfused if "8 q heads" in f.message or "1 kv heads" in f.message]
    mismatch = sorted((dict(f.properties)["attribute"], dict(f.properties)["found"], dict(f.properties)["expected"])
                      for f in by_rule(found, "gqa-config-mismatch"))
    assert mismatch == [("kv_num_heads", 2, 1), ("num_heads", 4, 8)]


def test_a_policy_that_agrees_with_the_decomposed_heads_is_no_mismatch(write_policy):
    policy = write_policy("name: p\nmodel: {num_heads: 4, kv_num_heads: 2, head_size: 16}\n")
    found = lint_findings(EXAMPLES / "qwen3-moe-tiny-unfused", policy, select=["gqa-config-mismatch"])
    assert by_rule(found, "gqa-config-mismatch") == []


def test_heads_the_graph_does_not_show_are_not_said(make_model, write_policy):
    """Without a policy and with heads the graph cannot show, gqa-not-fused states no head count at all."""
    found = by_rule(lint_findings(make_model(attention="decomposed"), select=["gqa-not-fused"]), "gqa-not-fused")
    assert found and all("q heads share" not in f.message or "head size" in f.message for f in found)


def test_hybrid_linear_attention_layers_are_not_missing_gqa(make_model):
    model = make_model(layers=4, layer_types=("linear_attention",) * 3 + ("full_attention",))
    assert by_rule(lint_findings(model, select=["gqa-not-fused"]), "gqa-not-fused") == []


def test_hybrid_with_declared_layers_expects_only_softmax_layers(make_model, write_policy):
    model = make_model(layers=4, layer_types=("linear_attention",) * 3 + ("full_attention",))
    policy = write_policy("name: p\nmodel:\n  layers: 4\n")
    assert by_rule(lint_findings(model, policy, select=["gqa-not-fused"]), "gqa-not-fused") == []


# fusedmatmul-missing ------------------------------------------------------------------------------------

def test_dump_below_extended_keeps_transposes_and_scales():
    model = EXPORTED / "dynamo-qwen3_moe" / "model.onnx"
    found = by_rule(lint_findings(model, optimized=EXPORTED / "dynamo-qwen3_moe" / "model.optimized-basic.onnx",
                                  select=["fusedmatmul-missing"]), "fusedmatmul-missing")
    assert found, "the BASIC dump still has MatMul + scale"
    assert all(f.file.endswith("model.optimized-basic.onnx") for f in found)


def test_dump_at_all_passes():
    model = EXPORTED / "dynamo-qwen3_moe" / "model.onnx"
    found = lint_findings(model, optimized=EXPORTED / "dynamo-qwen3_moe" / "model.optimized.onnx",
                          select=["fusedmatmul-missing"])
    assert found == []


def test_without_a_dump_fusedmatmul_is_not_judged(make_model):
    assert lint_findings(make_model(attention="decomposed"), select=["fusedmatmul-missing"]) == []


# required-ops ------------------------------------------------------------------------------------------

def test_required_ops_counts_against_the_policy(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  required_ops:\n    com.microsoft.MoE: 3\n"
                          "    com.microsoft.GroupQueryAttention: 2\n")
    found = by_rule(lint_findings(make_model(layers=2), policy, select=["required-ops"]), "required-ops")
    assert [dict(f.properties) for f in found] == [{"op": "com.microsoft.MoE", "expected": 3, "found": 2}]
    assert found[0].location.line == 4


def test_forbidden_ops_are_reported_per_node(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  forbidden_ops: [TopK]\n")
    found = by_rule(lint_findings(make_model(moe="dense_loop"), policy, select=["forbidden-op"]), "forbidden-op")
    assert [f.layer for f in found] == [0, 1] and all(f.op_type == "TopK" for f in found)
    assert by_rule(lint_findings(make_model(moe="fused"), policy, select=["forbidden-op"]), "forbidden-op") == []


def test_forbidden_op_findings_stop_at_twenty_and_count_the_rest(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  forbidden_ops: [MatMul]\n")
    found = by_rule(lint_findings(make_model(moe="dense_loop", layers=2), policy, select=["forbidden-op"]),
                    "forbidden-op")
    assert len(found) == 20
    [last] = [f for f in found if f.properties]
    more = dict(last.properties)["more"]
    assert more > 0 and f"{more} more MatMul nodes" in last.message
