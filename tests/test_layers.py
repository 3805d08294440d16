"""Layer attribution: node names and metadata first, the residual stream when names say nothing.

Each test builds (or loads) a graph and checks which decoder layer the nodes that findings point at land in.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from ortgate.graph import build_graph
from tests.conftest import EXPORTED
from tests.models.qwen_moe import ModelSpec, build_model

HYBRID = ("linear_attention", "linear_attention", "linear_attention", "full_attention")
UNFUSED = dict(norm="decomposed", moe="dense_loop", attention="decomposed", rotary="decomposed", qkv="separate")
# Ops whose layer the structural attribution must get right: every op a finding can point at.
JUDGED_OPS = {"MatMul", "Gemm", "Softmax", "TopK", "MoE", "QMoE", "GroupQueryAttention", "RotaryEmbedding",
              "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "Pow", "ReduceMean", "Neg",
              "LinearAttention", "CausalConvWithState", "Sigmoid", "ScatterElements"}


def layers_by_position(spec: dict, naming: str) -> tuple[str, list[tuple[str, int | None]]]:
    graph = build_graph(build_model(ModelSpec(naming=naming, **spec)), naming)
    return graph.layer_source, [(n.op_type, n.layer) for n in graph.nodes]


@pytest.mark.parametrize("naming", ["opaque", "none"])
@pytest.mark.parametrize("spec", [{}, UNFUSED, dict(layers=4, layer_types=HYBRID, shared_expert=True),
                                  dict(moe="gather_loop", gate_up="separate"), dict(control_flow=True),
                                  dict(residual="post", layers=3), dict(UNFUSED, residual="post", layers=3),
                                  dict(residual="post", residual_alpha=3.5565588200778455, layers=3),
                                  dict(UNFUSED, residual="post", residual_alpha=3.5565588200778455),
                                  dict(residual="sandwich", layers=3), dict(UNFUSED, residual="sandwich")],
                         ids=["fused", "unfused", "hybrid", "gather-loop", "control-flow", "post-norm",
                              "post-norm-unfused", "post-norm-scaled", "post-norm-scaled-unfused", "sandwich-norm",
                              "sandwich-norm-unfused"])
def test_structure_finds_the_layers_names_would_give(spec, naming):
    named_source, named = layers_by_position(spec, "genai")
    source, found = layers_by_position(spec, naming)
    assert (named_source, source) == ("names", "structure")
    judged = [(i, op, want) for i, (op, want) in enumerate(named) if op in JUDGED_OPS]
    assert judged, "the graph holds no node this test judges"
    wrong = [(i, op, want, found[i][1]) for i, op, want in judged if found[i][1] != want]
    assert wrong == []


def test_final_norm_and_lm_head_belong_to_no_layer_by_structure():
    graph = build_graph(build_model(ModelSpec(naming="none", layers=3)), "m")
    final_norm = list(graph.by_op("com.microsoft", "SkipSimplifiedLayerNormalization"))[-1]
    lm_head = graph.producer("logits")
    assert (final_norm.layer, lm_head.layer) == (None, None)
    assert graph.layer_count == 3


@pytest.mark.parametrize("naming", ["genai", "hf", "opaque"])
def test_final_norm_is_outside_the_layers_in_every_naming(naming):
    graph = build_graph(build_model(ModelSpec(naming=naming, norm="decomposed", layers=2)), "m")
    lm_head = graph.producer("logits")
    final_gamma_mul = graph.producer(lm_head.input(0))
    final_norm = [n for n in graph.nodes if n.op_type in ("Pow", "ReduceMean", "Sqrt")][-3:]
    assert [n.layer for n in (*final_norm, final_gamma_mul, lm_head)] == [None] * 5
    assert sorted(graph.layers) == [0, 1]


def test_prompt_branch_if_stays_outside_the_layers():
    graph = build_graph(build_model(ModelSpec(naming="opaque", control_flow=True)), "m")
    branch = graph.by_op_type("If")[0]
    inside = [n for n in graph.nodes if n.graph is not None]
    assert graph.layer_source == "structure"
    assert branch.layer is None and inside and all(n.layer is None for n in inside)
    assert sorted({n.layer for n in graph.by_op("com.microsoft", "GroupQueryAttention")}) == [0, 1]


def test_genai_final_norm_pseudo_layer_is_not_a_layer():
    model = onnx.load(str(EXPORTED / "genai-qwen3_5_moe-fp32-cpu" / "model.onnx"), load_external_data=False)
    graph = build_graph(model, "qwen")
    final = next(n for n in graph.nodes if "final_norm_layernorm" in n.name)
    assert final.layer is None
    assert sorted(graph.layers) == [0, 1, 2, 3]


def test_ort_dump_without_metadata_is_attributed_by_structure():
    """ORT's dump drops node metadata and merges identical norm weights (all named model.layers.0...):
    initializer names would put every norm in layer 0; the residual stream does not."""
    folder = EXPORTED / "dynamo-qwen3_moe"
    exported = build_graph(onnx.load(str(folder / "model.onnx")), "model")
    dump = build_graph(onnx.load(str(folder / "model.optimized.onnx")), "dump")
    assert (exported.layer_source, dump.layer_source) == ("names", "structure")
    truth = {n.name: n.layer for n in exported.nodes}
    judged = [n for n in dump.nodes if n.name in truth and n.op_type in JUDGED_OPS]
    assert len(judged) > 40
    assert [(n.name, n.layer) for n in judged if n.layer != truth[n.name]] == []
    # the final norm reads a gamma named model.layers.0.* yet is outside every layer
    final_pow = dump.producer(dump.producer(dump.producer("logits").input(0)).input(1))
    assert final_pow is not None and final_pow.layer is None


@pytest.mark.parametrize("residual", ["post", "sandwich"])
def test_generated_residual_forms_run_on_ort(residual):
    import numpy as np
    import onnxruntime as ort

    from tests.models.qwen_moe import make_feeds

    model = build_model(ModelSpec(residual=residual, residual_alpha=2.0, naming="none"))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], make_feeds(model))[0]
    assert np.isfinite(logits).all()


MINIMAX = EXPORTED / "dynamo-minimax"


def _truth_and_dump(folder, reference: bool):
    exported = build_graph(onnx.load(str(folder / "model.onnx")), "model")
    dump = build_graph(onnx.load(str(folder / "model.optimized.onnx")), "dump", role="optimized",
                       reference=exported if reference else None)
    return exported, dump


def test_post_norm_dump_is_attributed_by_its_residual_stream():
    """MiniMax takes the residual after the norm (n = norm(h); n * alpha + attn(n)): no addition reads the
    embedding itself, so the walk goes through the norm and the scale to reach the stream's first step."""
    exported, dump = _truth_and_dump(MINIMAX, reference=False)
    assert (exported.layer_source, dump.layer_source) == ("names", "structure")
    truth = {n.name: n.layer for n in exported.nodes}
    judged = [n for n in dump.nodes if n.name in truth and n.op_type in JUDGED_OPS | {"FusedMatMul", "Add"}]
    assert len(judged) > 60
    assert [(n.name, n.layer, truth[n.name]) for n in judged if n.layer != truth[n.name]] == []
    lm_head = dump.producer("logits")
    final_gamma = dump.producer(lm_head.input(0))
    assert (lm_head.layer, final_gamma.layer, dump.layer_count) == (None, None, 2)


@pytest.mark.parametrize("folder", ["dynamo-minimax", "dynamo-qwen3_moe"])
def test_dump_nodes_keep_the_layer_their_name_has_in_the_model(folder):
    exported, dump = _truth_and_dump(EXPORTED / folder, reference=True)
    assert dump.layer_source == "model"
    truth = {n.name: n.layer for n in exported.nodes}
    kept = [n for n in dump.nodes if n.name in truth]
    assert len(kept) > 0.8 * len(dump.nodes)
    assert [(n.name, n.layer, truth[n.name]) for n in kept if n.layer != truth[n.name]] == []
    # nodes ORT made (a fused MatMul, a Split from Gather/Slice) take their layer from the original's name or
    # the stream: every layer still holds its attention softmax and its router
    assert sorted(n.layer for n in dump.by_op_type("TopK")) == [0, 1]


def test_a_few_layer_names_among_opaque_ones_do_not_decide_the_layers():
    """`ortgate fix` names its com.microsoft.MoE nodes /model/layers.N/moe/MoE; ORT's dump of the fixed model
    keeps those names and drops every other node's metadata. Two named nodes must not put the rest in layer 0."""
    model = onnx.load(str(EXPORTED / "dynamo-qwen3_moe" / "model.optimized.onnx"))
    topks = [n for n in model.graph.node if n.op_type == "TopK"]
    for layer, node in enumerate(topks):
        node.name = f"/model/layers.{layer}/moe/router/TopK"
    graph = build_graph(model, "dump", role="optimized")
    assert graph.layer_source == "structure"
    assert sorted(n.layer for n in graph.by_op_type("TopK")) == [0, 1]
    assert sorted({n.layer for n in graph.by_op_type("Softmax")} - {None}) == [0, 1]


def _tiny(nodes, initializers, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=initializers)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])


def test_initializer_names_are_the_last_resort():
    w = helper.make_tensor("model.layers.3.mlp.up_proj.weight", TensorProto.FLOAT, [4, 4], [0.0] * 16)
    model = _tiny([helper.make_node("MatMul", ["x", w.name], ["y"])], [w],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    graph = build_graph(model, "m")
    assert graph.layer_source == "initializers" and graph.nodes[0].layer == 3


def test_graph_without_names_or_stream_has_no_layers():
    model = _tiny([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], [],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])])
    graph = build_graph(model, "m")
    assert graph.layer_source == "none" and graph.layers == {}
