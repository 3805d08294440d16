"""qkv-not-packed, gate-up-not-merged, swiglu-not-fused: this graph, this policy, these findings."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortgate.findings import Severity
from tests.conftest import EXPORTED
from tests.helpers import rule_findings
from tests.models.qwen_moe import make_feeds

QKV = "qkv-not-packed"
GATE_UP = "gate-up-not-merged"
SWIGLU = "swiglu-not-fused"
CUDA_POLICY = "name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n"
CPU_POLICY = "name: p\nexecution_provider:\n  name: CPUExecutionProvider\n"
BASIC_POLICY = "name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_BASIC\n"


findings = rule_findings


# qkv-not-packed ------------------------------------------------------------------------------------------


def test_separate_projections_into_decomposed_attention(make_model):
    found = findings(make_model(qkv="separate", attention="decomposed", layers=3), QKV)
    assert [f.layer for f in found] == [0, 1, 2]
    assert all(f.severity == Severity.WARNING for f in found)
    assert "3 separate projections" in found[0].message and "q_proj" in found[0].node
    assert any("k_proj" in n for n in found[0].related_nodes) and any("v_proj" in n for n in found[0].related_nodes)


@pytest.mark.parametrize("spec", [dict(qkv="packed", attention="decomposed"), dict(qkv="packed"),
                                  dict(qkv="packed", rotary="gqa"), dict(qkv="packed", qk_norm=True)],
                         ids=["decomposed", "gqa", "gqa-packed-input", "split-after-q-k-norm"])
def test_packed_projection_passes(make_model, spec):
    assert findings(make_model(**spec), QKV) == []


def test_gqa_fed_by_separate_projections(make_model):
    found = findings(make_model(qkv="separate", rotary="gqa"), QKV)
    assert [f.layer for f in found] == [0, 1]
    assert "com.microsoft.GroupQueryAttention" in found[0].message and "ORT cannot repack" in found[0].message


def test_mha_fed_by_separate_projections(make_model):
    found = findings(make_model(qkv="separate", attention="mha"), QKV)
    assert found and "MultiHeadAttention" in found[0].message


@pytest.mark.parametrize("spec", [dict(dtype="float16"), dict(matmul_nbits=True, dtype="float16")],
                         ids=["fp16-matmul", "int4-matmulnbits"])
def test_form_ort_repacks_on_cuda_is_info(make_model, write_policy, spec):
    model = make_model(qkv="separate", rotary="fused", **spec)
    on_cuda = findings(model, "qkv-packed-by-ort", write_policy(CUDA_POLICY))
    assert on_cuda and all(f.severity == Severity.INFO for f in on_cuda)
    assert findings(model, QKV, write_policy(CUDA_POLICY, "cuda2.yaml")) == []
    assert "GroupQueryAttentionFusion" in on_cuda[0].message and "expected to rewrite" in on_cuda[0].message
    on_cpu = findings(model, QKV, write_policy(CPU_POLICY, "cpu.yaml"))
    assert on_cpu and all(f.severity == Severity.WARNING for f in on_cpu)


def test_fp32_projections_are_not_repacked_even_on_cuda(make_model, write_policy):
    found = findings(make_model(qkv="separate", rotary="fused"), QKV, write_policy(CUDA_POLICY))
    assert found and all(f.severity == Severity.WARNING for f in found)


def test_linear_attention_projections_are_not_qkv(make_model):
    model = make_model(layers=4, layer_types=("linear_attention",) * 3 + ("full_attention",), qkv="separate")
    assert [f.layer for f in findings(model, QKV)] == [3]


def test_dynamo_export_and_its_dump():
    folder = EXPORTED / "dynamo-qwen3_moe"
    for dump in (None, folder / "model.optimized.onnx"):
        assert [f.layer for f in findings(folder / "model.onnx", QKV, optimized=dump)] == [0, 1]


# gate-up-not-merged --------------------------------------------------------------------------------------


def test_moe_with_separate_fc3_is_reported(make_model):
    found = findings(make_model(swiglu_fusion=0), GATE_UP)
    assert [f.layer for f in found] == [0, 1]
    assert found[0].op_type == "com.microsoft.MoE" and "swiglu_fusion=0" in found[0].message


def test_qmoe_with_separate_fc3_is_reported(make_model):
    found = findings(make_model(moe="qmoe", swiglu_fusion=0), GATE_UP)
    assert found and found[0].op_type == "com.microsoft.QMoE"


@pytest.mark.parametrize("spec", [dict(), dict(moe="qmoe"), dict(moe="dense_loop"), dict(moe="gather_loop")],
                         ids=["moe", "qmoe", "dense-loop-merged", "gather-loop-merged"])
def test_merged_gate_up_passes(make_model, spec):
    assert findings(make_model(**spec), GATE_UP) == []


@pytest.mark.parametrize("moe", ["dense_loop", "gather_loop"])
def test_expert_loop_with_separate_gate_and_up(make_model, moe):
    found = findings(make_model(moe=moe, gate_up="separate", experts=4, shared_expert=True), GATE_UP)
    assert [f.layer for f in found] == [0, 1]
    # the shared expert (scaled by its sigmoid gate, not by a routing weight) is not counted
    assert dict(found[0].properties) == {"experts_separate": 4, "experts": 4}


def test_dense_mlp_with_separate_gate_and_up_is_not_reported(make_model):
    assert findings(make_model(moe="dense", gate_up="separate"), GATE_UP) == []


def test_dynamo_experts_are_merged():
    assert findings(EXPORTED / "dynamo-qwen3_moe" / "model.onnx", GATE_UP) == []


# swiglu-not-fused ----------------------------------------------------------------------------------------


def test_moe_silu_with_fc3_is_one_finding_of_gate_up_not_merged(make_model, tmp_path):
    """activation_type=silu with a separate fc3 has no Sigmoid / Mul node: its one problem (gate and up in two GEMMs
    where activation_type=swiglu, swiglu_fusion=1 merges them) is gate-up-not-merged's, once per layer."""
    model = onnx.load(str(make_model(swiglu_fusion=0)))
    for node in model.graph.node:
        if node.op_type == "MoE":
            for attr in node.attribute:
                if attr.name == "activation_type":
                    attr.s = b"silu"
    path = tmp_path / "silu_fc3.onnx"
    onnx.save(model, path)
    assert findings(path, SWIGLU) == []
    found = findings(path, GATE_UP)
    assert [f.layer for f in found] == [0, 1]
    assert "activation_type=silu" in found[0].message and "activation_type=swiglu" in found[0].fix


def test_dense_silu_is_left_to_ort_at_extended(make_model):
    assert findings(make_model(moe="dense"), SWIGLU) == []


def test_dense_silu_under_basic_optimization(make_model, write_policy):
    found = findings(make_model(moe="dense", layers=3), SWIGLU, write_policy(BASIC_POLICY))
    assert [f.layer for f in found] == [0, 1, 2]
    assert "QuickGeluFusion" in found[0].message and "ORT_ENABLE_BASIC" in found[0].message


def test_real_ort_dumps_decide(make_model, tmp_path):
    model = make_model(moe="dense")
    dumps = {}
    for level in ("ORT_ENABLE_BASIC", "ORT_ENABLE_ALL"):
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        options.optimized_model_filepath = str(tmp_path / f"{level}.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"]).run(None, make_feeds(str(model)))
        dumps[level] = options.optimized_model_filepath
    assert [f.layer for f in findings(model, SWIGLU, optimized=dumps["ORT_ENABLE_BASIC"])] == [0, 1]
    assert findings(model, SWIGLU, optimized=dumps["ORT_ENABLE_ALL"]) == []


def test_dynamo_dumps():
    folder = EXPORTED / "dynamo-qwen3_moe"
    basic = findings(folder / "model.onnx", SWIGLU, optimized=folder / "model.optimized-basic.onnx")
    assert [f.layer for f in basic] == [0, 1] and dict(basic[0].properties)["gated_mlps"] == 4
    assert findings(folder / "model.onnx", SWIGLU, optimized=folder / "model.optimized.onnx") == []


def test_genai_shared_expert_silu_counts_on_ort(write_policy):
    model = EXPORTED / "genai-qwen3_5_moe-fp32-cpu"
    assert findings(model, SWIGLU) == []
    found = findings(model, SWIGLU, write_policy(BASIC_POLICY))
    assert [f.layer for f in found] == [0, 1, 2, 3]


def test_gated_mlp_inside_an_if_branch_is_found(tmp_path, write_policy):
    weights = [helper.make_tensor(name, TensorProto.FLOAT, [8, 8], [0.01] * 64) for name in ("w_gate", "w_up", "w_down")]
    body = [
        helper.make_node("MatMul", ["x", "w_gate"], ["gate"]),
        helper.make_node("MatMul", ["x", "w_up"], ["up"]),
        helper.make_node("Sigmoid", ["gate"], ["sig"]),
        helper.make_node("Mul", ["gate", "sig"], ["silu"]),
        helper.make_node("Mul", ["silu", "up"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "w_down"], ["then_out"]),
    ]
    then_graph = helper.make_graph(body, "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["else_out"])], "else", [],
                                   [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph)], "main",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], initializer=weights)
    path = tmp_path / "if_mlp.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    found = findings(path, SWIGLU, write_policy(BASIC_POLICY))
    assert len(found) == 1 and found[0].graph == "branch/then_branch" and found[0].op_type == "Sigmoid"


def _qdq_attention(tmp_path, *, packed: bool):
    """MultiHeadAttention fed by QDQ-wrapped MatMuls (QuantizeLinear -> DequantizeLinear around the activations and
    the int8 weights, as a static QDQ quantizer writes them): three of one input, or one packed and Split."""
    import numpy as np
    from onnx import numpy_helper

    def init(name, value, dtype):
        return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)

    inits = [init("s", 0.05, np.float32), init("zp", 0, np.int8)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "zp"], ["xd"])]
    widths = [24] if packed else [8, 8, 8]
    outs = []
    for i, width in enumerate(widths):
        inits.append(init(f"w{i}", np.ones((8, width)), np.int8))
        nodes += [helper.make_node("DequantizeLinear", [f"w{i}", "s", "zp"], [f"wd{i}"]),
                  helper.make_node("MatMul", ["xd", f"wd{i}"], [f"y{i}"]),
                  helper.make_node("QuantizeLinear", [f"y{i}", "s", "zp"], [f"yq{i}"]),
                  helper.make_node("DequantizeLinear", [f"yq{i}", "s", "zp"], [f"yd{i}"])]
        outs.append(f"yd{i}")
    if packed:
        inits.append(init("sizes", [8, 8, 8], np.int64))
        nodes.append(helper.make_node("Split", ["yd0", "sizes"], ["q", "k", "v"], axis=-1))
        outs = ["q", "k", "v"]
    nodes.append(helper.make_node("MultiHeadAttention", outs, ["out"], domain="com.microsoft", num_heads=2))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 8])], inits)
    model = helper.make_model(graph, ir_version=10,
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / ("packed.onnx" if packed else "separate.onnx")
    onnx.save(model, path)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # ORT takes it as it is
    return path


def test_qdq_wrapped_projections_are_projections(tmp_path):
    found = findings(_qdq_attention(tmp_path, packed=False), QKV)
    assert [f.kind.name for f in found] == ["VIOLATION"], [f.message for f in found]
    assert "3 separate projections" in found[0].message and "[8, 8]" in found[0].message
    assert findings(_qdq_attention(tmp_path, packed=True), QKV) == []
