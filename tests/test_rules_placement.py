"""Placement rules (OGK): this graph, this provider, these findings.

ORT's optimized dumps only hold Memcpy nodes when a GPU provider ran the session, which this machine cannot
do; the dumps with copies below are built the way ORT writes them (a MemcpyToHost before the CPU node's float
input, a MemcpyFromHost after its output).
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from ortgate.knowledge import kernel_table
from tests.conftest import EXPORTED
from tests.helpers import by_rule, lint_findings

TABLE = kernel_table().ort_version
CUDA = "name: p\nexecution_provider: {name: CUDAExecutionProvider}\n"
CUDA_GRAPH = ('name: p\nsession:\n  free_dimension_overrides: {batch_size: 1, sequence_length: 1}\n'
              'execution_provider:\n  name: CUDAExecutionProvider\n  options: {enable_cuda_graph: "1"}\n')
TRT_GRAPH = ('name: p\nexecution_provider:\n  name: TensorrtExecutionProvider\n'
             '  options: {trt_cuda_graph_enable: "True"}\n')


def findings(model, policy=None, *, optimized=None, config=None, rule: str):
    return by_rule(lint_findings(model, policy, optimized=optimized, config=config, select=["OGK"]), rule)


def errors(found):
    return [f for f in found if f.severity.label == "error"]


def dump_with_copies(model_path, out_path, op_type: str, input_index: int = 0):
    """An optimized dump of `model_path` as ORT writes it when `op_type` nodes run on CPU beside a GPU provider."""
    model = onnx.load(model_path)
    graph = model.graph
    nodes = []
    for i, node in enumerate(graph.node):
        if node.op_type != op_type:
            nodes.append(node)
            continue
        copied_in = f"{node.input[input_index]}_on_host_{i}"
        nodes.append(helper.make_node("MemcpyToHost", [node.input[input_index]], [copied_in], name=f"Memcpy_{i}"))
        node.input[input_index] = copied_in
        produced = node.output[0]
        node.output[0] = f"{produced}_on_host"
        nodes.append(node)
        nodes.append(helper.make_node("MemcpyFromHost", [node.output[0]], [produced], name=f"Memcpy_token_{i}"))
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.save(model, out_path)
    return out_path


# op-not-on-ep ----------------------------------------------------------------------------------------------

def test_fp32_gqa_and_qmoe_under_cuda_run_on_cpu(make_model, write_policy):
    found = findings(make_model(layers=3, moe="qmoe", dtype="float32"), write_policy(CUDA), rule="op-not-on-ep")
    assert [(f.op_type, f.layer, f.severity.label) for f in found] == [
        ("com.microsoft.GroupQueryAttention", None, "error"), ("com.microsoft.QMoE", None, "error")]  # every layer's
    gqa = found[0]
    assert "input 'query' of type float: T accepts bfloat16, float16" in gqa.message
    assert "3 nodes in layers 0-2 run on CPUExecutionProvider" in gqa.message and TABLE in gqa.message
    assert gqa.related_nodes == ("/model/layers.1/attn/GroupQueryAttention", "/model/layers.2/attn/GroupQueryAttention")


def test_forty_layers_read_as_one_finding_per_op_kind(make_model, write_policy):
    model = make_model(layers=40, moe="qmoe", weights="external_stub")
    found = errors(findings(model, write_policy(CUDA), rule="op-not-on-ep"))
    assert [(f.op_type, dict(f.properties)["nodes"]) for f in found] == [
        ("com.microsoft.GroupQueryAttention", 40), ("com.microsoft.QMoE", 40)]
    assert "in layers 0-39" in found[1].message


def test_fp16_model_under_cuda_passes(make_model, write_policy):
    assert findings(make_model(moe="qmoe", dtype="float16"), write_policy(CUDA), rule="op-not-on-ep") == []


def test_cpu_policy_is_not_judged(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider: {name: cpu}\n")
    assert findings(make_model(dtype="float16"), policy, rule="op-not-on-ep") == []


def test_real_genai_fp32_export_under_cuda(write_policy):
    model = EXPORTED / "genai-qwen3_5_moe-int4-cpu"
    found = findings(model, write_policy(CUDA), rule="op-not-on-ep")
    by_op = {f.op_type: f for f in found}
    assert by_op["com.microsoft.GroupQueryAttention"].layer == 3
    assert by_op["com.microsoft.QMoE"].severity.label == "error" and "4 nodes in layers 0-3" in by_op[
        "com.microsoft.QMoE"].message
    # The ops newer than OperatorKernels.md have their CUDA kernels from the 1.31.1 binary's kernel classes.
    assert "com.microsoft.LinearAttention" not in by_op


def test_real_genai_fp16_cuda_export_has_a_kernel_for_every_op(write_policy):
    # LpNormalization (the linear-attention q/k l2 norm) got its CUDA kernel after the table's commit; the
    # linear-attention ops the builder writes are decided from the 1.31.1 CUDA binary's kernel classes.
    found = findings(EXPORTED / "genai-qwen3_5_moe-fp16-cuda", write_policy(CUDA), rule="op-not-on-ep")
    assert found == []


def test_real_gpt_oss_fp16_cuda_export_passes(write_policy):
    assert findings(EXPORTED / "genai-gpt_oss-fp16-cuda", write_policy(CUDA), rule="op-not-on-ep") == []


def test_integer_only_node_is_a_warning(tmp_path, write_policy):
    graph = helper.make_graph(
        [helper.make_node("Shape", ["input_ids"], ["shape"], name="shape"),
         helper.make_node("ReduceProd", ["shape"], ["tokens"], name="tokens", keepdims=0)],
        "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
        [helper.make_tensor_value_info("tokens", TensorProto.INT64, [])])
    path = tmp_path / "tokens.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    [found] = findings(path, write_policy(CUDA), rule="index-op-not-on-ep")
    assert found.severity.label == "warning" and "ReduceProd kernel for input 'data' of type int64" in found.message
    assert findings(path, write_policy(CUDA, "p2.yaml"), rule="op-not-on-ep") == []


def test_provider_without_kernel_table_is_undecided(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider: {name: TensorrtExecutionProvider}\n")
    [found] = findings(make_model(), policy, rule="op-not-on-ep")
    assert found.severity.label == "info" and "no kernel table for TensorrtExecutionProvider" in found.message


# cuda-graph-blocker ----------------------------------------------------------------------------------------

def test_control_flow_blocks_capture(make_model, write_policy):
    [found] = findings(make_model(control_flow=True, dtype="float16"), write_policy(CUDA_GRAPH),
                       rule="cuda-graph-blocker")
    assert found.op_type == "If" and "control-flow node" in found.message
    assert dict(found.properties)["blocker"] == "control_flow"


def test_nonzero_expert_loop_has_data_dependent_shapes(make_model, write_policy):
    [found] = findings(make_model(moe="gather_loop", dtype="float16"), write_policy(CUDA_GRAPH),
                       rule="cuda-graph-blocker")
    assert found.op_type == "NonZero" and dict(found.properties)["nodes"] == 8
    assert "depends on tensor values" in found.message and "layers 0-1" in found.message


def test_fp32_gqa_under_capture_is_one_error_that_says_capture_fails(make_model, write_policy):
    found = lint_findings(make_model(dtype="float32", moe="qmoe"), write_policy(CUDA_GRAPH), select=["OGK", "OGM"])
    gqa = [f for f in found if f.op_type == "com.microsoft.GroupQueryAttention"]
    assert [(f.rule, f.severity.label) for f in gqa] == [("op-not-on-ep", "error")]
    assert "enable_cuda_graph is on, so ORT refuses to create the session" in gqa[0].message


def test_memcpy_in_dump_blocks_capture(make_model, write_policy, tmp_path):
    model = make_model(dtype="float16")
    dump = dump_with_copies(model, tmp_path / "model.optimized.onnx", "SimplifiedLayerNormalization")
    found = findings(model, write_policy(CUDA_GRAPH), optimized=dump, rule="cuda-graph-blocker")
    assert [dict(f.properties)["blocker"] for f in found] == ["memcpy"]
    assert "MemcpyToHost x1, MemcpyFromHost x1" in found[0].message


def test_tensorrt_graph_needs_every_node_on_tensorrt(make_model, write_policy):
    found = findings(make_model(dtype="float16"), write_policy(TRT_GRAPH), rule="cuda-graph-blocker")
    ops = [f.op_type for f in found]
    assert "com.microsoft.MoE" in ops and "com.microsoft.GroupQueryAttention" in ops
    assert all("TensorRT does not take" in f.message for f in found)


def test_shape_derived_sizes_and_fused_fp16_model_pass(make_model, write_policy):
    # Range / Expand sizes here come from Shape of the inputs: fixed under pinned dims.
    assert findings(make_model(dtype="float16"), write_policy(CUDA_GRAPH), rule="cuda-graph-blocker") == []


def test_blockers_are_not_reported_without_cuda_graph(make_model, write_policy):
    assert findings(make_model(control_flow=True, moe="gather_loop"), write_policy(CUDA),
                    rule="cuda-graph-blocker") == []


# memcpy-in-graph -------------------------------------------------------------------------------------------

def test_copies_around_fp32_attention(make_model, tmp_path):
    model = make_model(dtype="float32")
    dump = dump_with_copies(model, tmp_path / "model.optimized.onnx", "GroupQueryAttention")
    [found] = findings(model, optimized=dump, rule="memcpy-in-graph")
    assert found.severity.label == "error" and found.file == str(dump)
    assert "around com.microsoft.GroupQueryAttention x2 in layers 0-1" in found.message
    assert dict(found.properties)["copies"] == 4


def test_integer_copies_are_a_warning(make_model, tmp_path):
    model = make_model(dtype="float16")
    dump = dump_with_copies(model, tmp_path / "model.optimized.onnx", "ReduceSum")
    [found] = findings(model, optimized=dump, rule="index-memcpy-in-graph")
    assert found.severity.label == "warning" and "ReduceSum" in found.message
    assert findings(model, optimized=dump, rule="memcpy-in-graph") == []


def test_copies_around_a_node_without_a_kernel_are_that_findings(make_model, write_policy, tmp_path):
    model = make_model(dtype="float32")
    dump = dump_with_copies(model, tmp_path / "model.optimized.onnx", "GroupQueryAttention")
    found = lint_findings(model, write_policy(CUDA), optimized=dump, select=["OGK"])
    gqa = [f for f in found if "GroupQueryAttention" in f.message]
    assert [f.rule for f in gqa] == ["op-not-on-ep"] and "Memcpy to and from the GPU around them" in gqa[0].message


@pytest.mark.parametrize("dump", ["model.optimized.onnx", "model.optimized-basic.onnx"])
def test_real_cpu_dump_has_no_copies(dump):
    folder = EXPORTED / "dynamo-qwen3_moe"
    assert findings(folder / "model.onnx", optimized=folder / dump, rule="memcpy-in-graph") == []
