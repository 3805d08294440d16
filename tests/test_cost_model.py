"""Known answers for the decode cost model: bytes per step computed here, by hand, from each generated model's
config (never by calling the implementation), against what `ortgate.cost` counts from the graph alone."""

from __future__ import annotations

import dataclasses

import pytest

from ortgate.cost import CostSetup, StepShape, estimate, step_model
from ortgate.graph import build_graph
from ortgate.knowledge.devices import find_device
from tests.conftest import EXPORTED
from tests.models.qwen_moe import ModelSpec, build_model

H100 = find_device("h100-sxm")
BF16 = 2

# Qwen3-30B-A3B: 48 layers, 128 experts, top-8, hidden 2048, expert intermediate 768, 32 q / 4 kv heads of 128.
QWEN3_30B = dict(
    layers=48, experts=128, top_k=8, hidden=2048, num_heads=32, kv_num_heads=4, head_dim=128,
    moe_intermediate=768, vocab=151936, qk_norm=True, dtype="bfloat16", weights="external_stub", max_position=4096,
)
FUSED = dict(moe="fused", attention="gqa", rotary="fused", norm="fused", naming="genai")
DENSE_LOOP = dict(moe="dense_loop", gate_up="separate", attention="decomposed", rotary="decomposed",
                  norm="decomposed", naming="hf")


def graph_of(**spec):
    return build_graph(build_model(ModelSpec(**spec)), "model.onnx")


@pytest.fixture(scope="module")
def qwen3_fused():
    return graph_of(**QWEN3_30B, **FUSED)


@pytest.fixture(scope="module")
def qwen3_dense_loop():
    return graph_of(**QWEN3_30B, **DENSE_LOOP)


def qwen3_hand_counts(context: int) -> dict[str, float]:
    """Bytes one batch-1 decode step reads, from the config alone."""
    h, inter, e, k, heads, kv, hd, vocab = 2048, 768, 128, 8, 32, 4, 128, 151936
    qkv = h * (heads + 2 * kv) * hd
    o_proj = heads * hd * h
    attention = (qkv + o_proj) * BF16
    router = h * e * BF16
    one_expert = (2 * inter * h + h * inter) * BF16  # gate+up (fc1) and down (fc2)
    kv_cache = 2 * kv * hd * BF16 * 1 * context
    embedding_row = h * BF16
    lm_head = h * vocab * BF16
    return {"attention": attention, "router": router, "one_expert": one_expert, "kv": kv_cache,
            "embedding_row": embedding_row, "lm_head": lm_head, "layers": 48, "top_k": k, "experts": e}


def test_fused_qwen3_30b_at_batch_1_reads_attention_router_eight_experts_embedding_row_and_lm_head(qwen3_fused):
    context = 4096
    hand = qwen3_hand_counts(context)
    per_layer = hand["attention"] + hand["router"] + hand["top_k"] * hand["one_expert"] + hand["kv"]
    expected = hand["layers"] * per_layer + hand["embedding_row"] + hand["lm_head"]
    est = estimate(qwen3_fused, CostSetup(H100, StepShape(1, 1, context), provider="CUDAExecutionProvider"))
    counted = est.as_exported.totals.bytes
    assert counted == pytest.approx(expected, rel=0.01)
    components = est.as_exported.components
    assert components["embedding"].bytes == pytest.approx(hand["embedding_row"], rel=0.01)
    assert components["lm_head"].bytes == pytest.approx(hand["lm_head"], rel=0.01)
    experts = hand["layers"] * (hand["router"] + hand["top_k"] * hand["one_expert"])
    assert components["moe"].bytes == pytest.approx(experts, rel=0.01)
    assert {f.form for f in est.model.moe_forms} == {"fused"}
    assert all(f.experts_read == pytest.approx(8.0, abs=1e-6) for f in est.model.moe_forms)
    # the ceiling is the bytes at the catalog's 3.35 TB/s, and nothing can be faster
    assert est.as_exported.ceiling_s == pytest.approx(expected / 3.35e12, rel=0.01)
    assert est.as_exported.expected_s > est.as_exported.ceiling_s


def test_the_dense_loop_twin_reads_every_expert_sixteen_times_the_fused_expert_bytes(qwen3_fused, qwen3_dense_loop):
    shape = StepShape(1, 1, 4096)
    hand = qwen3_hand_counts(4096)
    fused = step_model(qwen3_fused, shape, gpu=True)
    dense = step_model(qwen3_dense_loop, shape, gpu=True)
    fused_experts = sum(f.expert_bytes * f.experts_read / f.experts for f in fused.moe_forms)
    dense_experts = sum(f.expert_bytes * f.experts_read / f.experts for f in dense.moe_forms)
    assert dense_experts / fused_experts == pytest.approx(128 / 8, rel=0.01)
    assert dense_experts == pytest.approx(48 * 128 * hand["one_expert"], rel=0.01)
    assert {f.form for f in dense.moe_forms} == {"dense-loop"}
    est = estimate(qwen3_dense_loop, CostSetup(H100, shape, provider="CUDAExecutionProvider"))
    # every fix applied: the MoE layers read top-8 experts like the fused export does
    moe_fixed = est.with_fixes.components["moe"].bytes
    assert moe_fixed == pytest.approx(48 * (hand["router"] + 8 * hand["one_expert"]), rel=0.01)
    assert est.with_fixes.tokens_per_s_expected > 10 * est.as_exported.tokens_per_s_expected


def test_a_sliding_window_layer_reads_min_of_context_and_window_of_its_kv_cache():
    window, context, kv, hd = 16, 1000, 2, 16
    g = graph_of(layers=2, layer_types=("full_attention", "sliding_attention"), sliding_window=window,
                 kv_num_heads=kv, head_dim=hd, num_heads=4)
    model = step_model(g, StepShape(1, 1, context), gpu=True)
    fp32 = 4
    assert model.kv[0]["bytes"] == 2 * kv * hd * fp32 * context
    assert model.kv[1]["bytes"] == 2 * kv * hd * fp32 * min(context, window)
    assert model.kv[1]["window"] == window


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_qmoe_reads_the_packed_expert_bytes_plus_their_scales(bits):
    hidden, inter, experts, k = 256, 128, 16, 2
    g = graph_of(moe="qmoe", qmoe_bits=bits, hidden=hidden, moe_intermediate=inter, experts=experts, top_k=k,
                 dtype="float16", num_heads=4, kv_num_heads=2, head_dim=64)
    pack = 8 // bits
    fp16 = 2
    fc1 = 2 * inter * hidden // pack + 2 * inter * fp16  # uint8 packed gate+up rows, one scale per row
    fc2 = hidden * inter // pack + hidden * fp16
    model = step_model(g, StepShape(1, 1, 64), gpu=True)
    (qmoe, *_rest) = [nc for nc in model.costs.values() if nc.op == "QMoE"]
    assert qmoe.cost.bytes == pytest.approx(k * (fc1 + fc2), rel=1e-9)
    assert {f.form for f in model.moe_forms} == {"fused-quantized"}


def test_a_batch_of_64_touches_the_expected_distinct_experts():
    experts, k, batch = 128, 4, 64
    touched = experts * (1 - (1 - k / experts) ** batch)  # GPT-OSS-120B's shape: about 111 of 128
    assert touched == pytest.approx(111.2, abs=0.05)
    hidden, inter = 64, 32
    g = graph_of(experts=experts, top_k=k, hidden=hidden, moe_intermediate=inter, layers=1)
    model = step_model(g, StepShape(batch, 1, 16), gpu=True)
    (form,) = model.moe_forms
    assert form.experts_read == pytest.approx(touched, rel=1e-9)
    fp32 = 4
    one_expert = (2 * inter * hidden + hidden * inter + 2 * inter + hidden) * fp32  # fc1, fc2 and their biases
    moe_node = model.costs[form.anchor.index]
    assert moe_node.cost.bytes == pytest.approx(touched * one_expert, rel=1e-9)
    # and each token goes through k experts: 2 x MACs x tokens x k
    assert moe_node.cost.flops == pytest.approx(2 * batch * k * (2 * inter * hidden + hidden * inter), rel=1e-9)


def test_the_gather_loop_reads_min_of_tokens_times_k_and_experts_without_dedup():
    experts, k, hidden, inter = 8, 2, 64, 32
    g = graph_of(moe="gather_loop", experts=experts, top_k=k, hidden=hidden, moe_intermediate=inter, layers=1,
                 gate_up="separate")
    fp32 = 4
    one_expert = 3 * hidden * inter * fp32
    for batch in (1, 2, 16):
        model = step_model(g, StepShape(batch, 1, 16), gpu=True)
        (form,) = model.moe_forms
        assert form.form == "gather-loop"
        read = min(batch * k, experts)
        assert form.experts_read == read
        linears = sum(model.costs[n.index].cost.bytes for n in form.nodes
                      if n.index in model.costs and model.costs[n.index].cost.flops)
        assert linears == pytest.approx(read * one_expert, rel=1e-9)
        # NonZero per expert: a host synchronisation each
        assert sum(model.costs[n.index].cost.syncs for n in form.nodes if n.index in model.costs) == experts


def test_symbolic_hidden_sizes_and_unknown_dtypes_are_said_not_guessed():
    import onnx

    proto = build_model(ModelSpec(layers=1))
    known = estimate(build_graph(proto, "known.onnx"), CostSetup(H100, StepShape(1, 1, 128)))
    kv_bytes = 0
    for vi in proto.graph.input:
        if vi.name.startswith("past_key_values"):
            _, kv_heads, _, head_dim = (d.dim_value for d in vi.type.tensor_type.shape.dim)
            assert vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
            kv_bytes += kv_heads * head_dim * 4 * 1 * 128  # one of K or V: heads x head size x fp32 x batch x context
            vi.type.tensor_type.shape.dim[3].dim_param = "head_dim_sym"
    weight = next(t for t in proto.graph.initializer if "qkv_proj" in t.name)
    assert weight.data_type == onnx.TensorProto.FLOAT
    weight_bytes = 4 * weight.dims[0] * weight.dims[1]
    weight.data_type = 999  # not a dtype ONNX knows
    g = build_graph(proto, "odd.onnx")
    est = estimate(g, CostSetup(H100, StepShape(1, 1, 128)))
    said = " | ".join(u.what for u in est.uncounted)
    assert "head_dim_sym" in said and "unknown dtype" in said
    assert {u.component for u in est.uncounted} == {"attention"}  # said per component
    # Left out, never guessed: exactly the weight and the KV cache are missing from attention, nothing else moved.
    odd, whole = est.as_exported.components, known.as_exported.components
    assert odd["attention"].bytes == whole["attention"].bytes - weight_bytes - kv_bytes
    assert all(odd[c].bytes == whole[c].bytes for c in whole if c != "attention")
    assert est.as_exported.totals.bytes > 0  # what is known is still counted
    assert est.as_exported.tokens_per_s_expected is not None


def test_an_estimate_never_opens_the_weights(tmp_path):
    """The skeleton's external data file does not exist: counting its bytes reads only the protobuf."""
    spec = dataclasses.replace(ModelSpec(**QWEN3_30B, **FUSED), layers=2)
    g = build_graph(build_model(spec), str(tmp_path / "model.onnx"))
    est = estimate(g, CostSetup(H100, StepShape(1, 1, 64)))
    assert est.as_exported.totals.bytes > 2 * 8 * 9_000_000


# ---- the batched (gather-per-token) form with a shared expert -----------------------------------------------------

OLMOE = EXPORTED / "dynamo-olmoe" / "model.onnx"
OLMOE_E, OLMOE_K, OLMOE_H, OLMOE_I = 8, 2, 64, 32  # BUILD_INFO.json: 8 experts, top-2, hidden 64, intermediate 32
SHARED_I = 48


def olmoe_with_shared_expert(gather: str):
    """The real OLMoE export's layer 0, with a Qwen2-MoE shared expert (SwiGLU of width SHARED_I) and its sigmoid
    gate added to the routed sum; `gather` "Gather" swaps the export's GatherND(stack, idx[..., None]) for the
    equivalent Gather(stack, idx) on axis 0 (the other form exporters write)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    proto = onnx.load(str(OLMOE), load_external_data=False)
    nodes = list(proto.graph.node)
    router = next(n for n in nodes if n.op_type == "Gemm" and n.input[1] == "model.layers.0.mlp.gate.weight")
    x = router.input[0]
    reduce = next(n for n in nodes if n.op_type == "ReduceSum" and n.name == "node_sum_1")
    routed = reduce.output[0]
    rng = np.random.default_rng(0)
    pre = "model.layers.0.mlp.shared_expert"
    shapes = {f"{pre}.gate_proj.weight": (OLMOE_H, SHARED_I), f"{pre}.up_proj.weight": (OLMOE_H, SHARED_I),
              f"{pre}.down_proj.weight": (SHARED_I, OLMOE_H), "model.layers.0.mlp.shared_expert_gate.weight": (OLMOE_H, 1)}
    for name, shape in shapes.items():
        proto.graph.initializer.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    added = [
        helper.make_node("MatMul", [x, f"{pre}.gate_proj.weight"], ["se_g"], name="se_gate_proj"),
        helper.make_node("MatMul", [x, f"{pre}.up_proj.weight"], ["se_u"], name="se_up_proj"),
        helper.make_node("Sigmoid", ["se_g"], ["se_gs"], name="se_sigmoid"),
        helper.make_node("Mul", ["se_g", "se_gs"], ["se_act"], name="se_silu"),
        helper.make_node("Mul", ["se_act", "se_u"], ["se_h"], name="se_mul"),
        helper.make_node("MatMul", ["se_h", f"{pre}.down_proj.weight"], ["se_out"], name="se_down_proj"),
        helper.make_node("MatMul", [x, "model.layers.0.mlp.shared_expert_gate.weight"], ["sg"], name="se_gate"),
        helper.make_node("Sigmoid", ["sg"], ["sg_s"], name="se_gate_sigmoid"),
        helper.make_node("Mul", ["sg_s", "se_out"], ["se_scaled"], name="se_scale"),
        helper.make_node("Add", [routed, "se_scaled"], ["moe_sum"], name="se_join"),
    ]
    for n in nodes:
        for i, name in enumerate(n.input):
            if name == routed:
                n.input[i] = "moe_sum"
    if gather == "Gather":
        for n in nodes:
            if n.op_type == "GatherND" and n.name in ("node_GatherND_212", "node_GatherND_221"):
                unsqueeze = next(u for u in nodes if u.output[0] == n.input[1])
                n.op_type, n.input[1] = "Gather", unsqueeze.input[0]
                del n.attribute[:]
    at = nodes.index(reduce) + 1
    del proto.graph.node[:]
    proto.graph.node.extend(nodes[:at] + added + nodes[at:])
    return build_graph(proto, str(OLMOE))


@pytest.mark.parametrize("gather", ["GatherND", "Gather"])
@pytest.mark.parametrize("batch", [1, 16])
def test_a_gathered_stack_block_reads_the_chosen_experts_and_its_shared_expert_whole(gather, batch):
    g = olmoe_with_shared_expert(gather)
    # the export has no KV cache: at context 1 a step is one token per sequence (at a longer context it recomputes
    # every position, and its top-k picks cover every expert)
    model = step_model(g, StepShape(batch, 1, 1), gpu=False)
    form = next(f for f in model.moe_forms if f.layer == 0)
    fp32 = 4
    stacks = OLMOE_E * (2 * OLMOE_I * OLMOE_H + OLMOE_H * OLMOE_I) * fp32  # fc1 [E, 2I, H] and fc2 [E, H, I]
    shared = (3 * OLMOE_H * SHARED_I + OLMOE_H) * fp32  # gate, up, down and the [H, 1] shared-expert gate
    read = min(batch * OLMOE_K, OLMOE_E)
    assert form.form == "gather-per-token" and form.experts_read == read
    assert form.expert_bytes == stacks and form.shared_bytes == shared and form.shared_linears == 4
    assert form.expert_macs == 2 * OLMOE_I * OLMOE_H + OLMOE_H * OLMOE_I
    gathers = [n for n in form.nodes if n.op_type == gather and n.input(0) in g.initializers]
    assert len(gathers) == 2
    routed_bytes = sum(model.costs[n.index].cost.bytes for n in gathers)
    assert routed_bytes == pytest.approx(stacks * read / OLMOE_E, rel=1e-12)
    assert sum(model.costs[n.index].cost.flops for n in gathers) == pytest.approx(
        2 * batch * OLMOE_K * (2 * OLMOE_I * OLMOE_H + OLMOE_H * OLMOE_I), rel=1e-12)
    linears = [n for n in form.nodes if n.name.startswith("se_") and n.op_type == "MatMul"]
    assert sum(model.costs[n.index].cost.bytes for n in linears) == shared


@pytest.mark.parametrize("fixture", ["genai-gpt_oss-fp32-cpu", "genai-qwen3_5_moe-fp16-cuda", "genai-lfm2_moe-fp32-cpu"])
def test_a_kv_cache_whose_head_size_is_symbolic_is_counted_from_the_attention_node(fixture):
    # onnxruntime-genai names the KV cache's head size `kv_cache_dim`; the config beside the export says what it is.
    import json

    from ortgate.graph.load import load_model

    folder = EXPORTED / fixture
    path = str(folder / "model.onnx")
    g = build_graph(load_model(path), path)
    decoder = json.loads((folder / "genai_config.json").read_text())["model"]["decoder"]
    window = decoder.get("sliding_window") or {}
    context, batch = 1000, 2
    model = step_model(g, StepShape(batch, 1, context), gpu=True)
    assert model.kv and not [u for u in model.uncounted if "KV cache" in u.what]
    for layer, info in model.kv.items():
        dtype_bytes = {"float": 4, "float16": 2, "bfloat16": 2}[info["dtype"]]
        positions = min(context, window["window_size"]) if layer in window.get("layers", ()) else context
        expected = 2 * decoder["num_key_value_heads"] * decoder["head_size"] * dtype_bytes * batch * positions
        assert info["bytes"] == expected, (layer, info)
