"""Valid but odd graphs never crash the graph rules (the suite runs with ORTGATE_STRICT=1: an exception fails).

No node names, the same name on every node, contrib ops moved to an unknown domain, a custom op in the middle of
the residual stream, truncated patterns. A rule that cannot decide says so as an info finding.
"""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto, helper

from ortgate.findings import Severity
from tests.helpers import lint_findings
from tests.models.qwen_moe import ModelSpec, build_model

MY_RULES = ["rmsnorm-not-fused", "skip-rmsnorm-not-fused", "rotary-not-fused", "qkv-not-packed",
            "gate-up-not-merged", "swiglu-not-fused", "moe-routing-mismatch", "gqa-config-mismatch",
            "norm-epsilon-default", "tensor-parallel-split"]
UNFUSED = dict(norm="decomposed", moe="dense_loop", attention="decomposed", rotary="decomposed", qkv="separate",
               gate_up="separate")
POLICY = "name: p\nmodel:\n  family: qwen3_moe\n  head_size: 16\n  top_k: 2\n  tensor_parallel: 2\n"


def blank_names(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        node.name = ""


def same_names(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        node.name = "node"


def unknown_domain(model: onnx.ModelProto) -> None:
    for node in model.graph.node:
        if node.domain == "com.microsoft":
            node.domain = "example.custom"
    model.opset_import.append(helper.make_opsetid("example.custom", 1))


def custom_op_in_stream(model: onnx.ModelProto) -> None:
    """Every residual Add becomes a custom op: no residual stream, no Add -> norm pairs."""
    for node in model.graph.node:
        if node.op_type == "Add" and "input_layernorm" in node.name:
            node.op_type, node.domain = "ResidualAdd", "example.custom"
    model.opset_import.append(helper.make_opsetid("example.custom", 1))


def truncate_patterns(model: onnx.ModelProto) -> None:
    """Cut each decomposed norm after its ReduceMean and each rotary after its Neg: half-patterns stay behind."""
    keep = []
    for node in model.graph.node:
        if node.op_type in ("Sqrt", "Concat") and len(keep) % 2 == 0:
            node.op_type = "Identity"
            del node.input[1:]
            del node.attribute[:]
        keep.append(node)


MUTATIONS = {"blank-names": blank_names, "same-names": same_names, "unknown-domain": unknown_domain,
             "custom-op-in-stream": custom_op_in_stream, "truncated": truncate_patterns}


@pytest.mark.parametrize("spec", [{}, UNFUSED, dict(layers=4, layer_types=("linear_attention",) * 3 + ("full_attention",))],
                         ids=["fused", "unfused", "hybrid"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_odd_graphs_do_not_crash(tmp_path, write_policy, spec, mutation):
    model = build_model(ModelSpec(**spec))
    MUTATIONS[mutation](model)
    path = tmp_path / "odd.onnx"
    onnx.save(model, path)
    for policy in (None, write_policy(POLICY)):
        found = lint_findings(path, policy, select=MY_RULES)
        assert all(f.code.startswith(("OGF", "OGM")) and f.message for f in found)


def test_attention_without_projections_is_undecided(tmp_path):
    """q, k and v straight from graph inputs: nothing says whether they were one projection."""
    shape = ["batch_size", "sequence_length", 64]
    kv_shape = ["batch_size", 2, "past_sequence_length", 16]
    gqa = helper.make_node(
        "GroupQueryAttention", ["q", "k", "v", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=4, kv_num_heads=2, name="attn")
    graph = helper.make_graph(
        [gqa], "attention_only",
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("k", TensorProto.FLOAT, ["batch_size", "sequence_length", 32]),
         helper.make_tensor_value_info("v", TensorProto.FLOAT, ["batch_size", "sequence_length", 32]),
         helper.make_tensor_value_info("past_key", TensorProto.FLOAT, kv_shape),
         helper.make_tensor_value_info("past_value", TensorProto.FLOAT, kv_shape),
         helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch_size"]),
         helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                   helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "attention_only.onnx"
    onnx.save(model, path)
    found = lint_findings(path, select=["qkv-not-packed"])
    assert [(f.severity, f.node) for f in found] == [(Severity.INFO, "attn")]
    assert "could not decide" in found[0].message
