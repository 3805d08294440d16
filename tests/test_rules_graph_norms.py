"""rmsnorm-not-fused, skip-rmsnorm-not-fused, norm-epsilon-default: this graph, this policy, these findings.

The RMSNorm forms ORT fuses are checked against a real ORT 1.31 CPU session's optimized dump, not only against
ortgate's table (ortgate/knowledge/ort_fusions.json).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortgate.findings import Severity
from tests.conftest import EXPORTED
from tests.helpers import rule_findings
from tests.models.qwen_moe import make_feeds

RMS = "rmsnorm-not-fused"
SKIP = "skip-rmsnorm-not-fused"
EPS = "norm-epsilon-default"


findings = rule_findings


def ort_dump(model: Path, level: str = "ORT_ENABLE_ALL") -> Path:
    """The optimized model a real ORT CPU session writes for `model` (and one forward pass to prove it runs)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.optimized_model_filepath = str(model.with_suffix(f".{level}.onnx"))
    options.log_severity_level = 3
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    session.run(None, make_feeds(str(model)))
    return Path(options.optimized_model_filepath)


# rmsnorm-not-fused -------------------------------------------------------------------------------------


def test_fused_norms_pass(make_model):
    assert findings(make_model(norm="fused", qk_norm=True), RMS) == []


def test_reciprocal_form_is_reported_per_layer_and_for_the_final_norm(make_model):
    found = findings(make_model(norm="decomposed", layers=3), RMS)
    assert [f.layer for f in found] == [0, 1, 2, None]
    assert all(f.severity == Severity.WARNING for f in found)
    assert "Reciprocal" in found[0].message and "does not match this form" in found[0].message
    # two per layer (input and post-attention norms), one final
    assert [dict(f.properties)["norms"] for f in found] == [2, 2, 2, 1]


def test_per_head_norms_are_rmsnorms_too(make_model):
    found = findings(make_model(norm="decomposed", qk_norm=True), RMS)
    assert [dict(f.properties)["head_norms"] for f in found] == [2, 2, 0]
    assert "2 per-head q/k" in found[0].message


def test_div_form_is_info_because_ort_fuses_it_on_cpu(make_model):
    found = findings(make_model(norm="decomposed_div"), "rmsnorm-fused-by-ort")
    assert found and all(f.severity == Severity.INFO for f in found)
    assert "SimplifiedLayerNormFusion" in found[0].message and "expected to rewrite" in found[0].message
    assert findings(make_model(norm="decomposed_div"), RMS) == []


def test_div_form_under_basic_optimization_is_a_warning(make_model, write_policy):
    policy = write_policy("name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_BASIC\n"
                          "execution_provider:\n  name: CPUExecutionProvider\n")
    found = findings(make_model(norm="decomposed_div"), RMS, policy)
    assert found and all(f.severity == Severity.WARNING for f in found)
    assert "does not run for CPUExecutionProvider at ORT_ENABLE_BASIC" in found[0].message


def test_fp16_cast_form_is_recognised(make_model):
    found = findings(make_model(norm="decomposed_cast", dtype="float16"), RMS)
    assert found and dict(found[0].properties)["forms"] == "pow_reciprocal_cast"


@pytest.mark.parametrize("norm, still_decomposed", [("decomposed_div", False), ("decomposed", True)])
def test_optimized_dump_is_judged_and_agrees_with_the_table(make_model, norm, still_decomposed):
    model = make_model(norm=norm)
    dump = ort_dump(model)
    fused_in_dump = sum(n.op_type == "SimplifiedLayerNormalization" for n in onnx.load(str(dump)).graph.node)
    assert (fused_in_dump == 0) == still_decomposed  # what ORT 1.31 really did
    found = findings(model, RMS, optimized=dump)
    assert bool(found) == still_decomposed
    assert all(f.file == str(dump) and "optimized dump" in f.message for f in found)


def if_branch_norm_model() -> onnx.ModelProto:
    """x -> If(cond): then-branch computes a decomposed RMSNorm of x, else-branch passes x through."""
    body_nodes = [
        helper.make_node("Pow", ["x", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Reciprocal", ["rms"], ["inv"]),
        helper.make_node("Mul", ["x", "inv"], ["normed"]),
        helper.make_node("Mul", ["gamma", "normed"], ["branch_out"]),
    ]
    then_graph = helper.make_graph(body_nodes, "then", [], [helper.make_tensor_value_info("branch_out", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["else_out"])], "else", [],
                                   [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph)],
        "main",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8]), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        initializer=[helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
                     helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
                     helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]),
                     helper.make_tensor("gamma", TensorProto.FLOAT, [8], [1.0] * 8)],
    )
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])


def test_norm_inside_a_subgraph_is_reported(tmp_path):
    model = if_branch_norm_model()
    path = tmp_path / "if_norm.onnx"
    onnx.save(model, path)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # a valid graph ORT loads
    found = findings(path, RMS)
    assert len(found) == 1 and found[0].graph is not None and found[0].graph.endswith("then_branch")


def test_dynamo_export_and_its_dump_report_every_layer():
    folder = EXPORTED / "dynamo-qwen3_moe"
    for dump in (None, folder / "model.optimized.onnx"):
        found = findings(folder / "model.onnx", RMS, optimized=dump)
        assert [f.layer for f in found] == [0, 1, None]
        assert [dict(f.properties)["norms"] for f in found] == [4, 4, 1]


def test_onnxscript_fused_export_passes():
    assert findings(EXPORTED / "dynamo-qwen3_moe-ortfusions" / "model.onnx", RMS) == []


# skip-rmsnorm-not-fused ----------------------------------------------------------------------------------


def split_skip_norms(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite every SkipSimplifiedLayerNormalization into Add + SimplifiedLayerNormalization (same math)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for node in out.graph.node:
        if node.op_type != "SkipSimplifiedLayerNormalization":
            nodes.append(node)
            continue
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-6)
        total = node.output[3] if len(node.output) > 3 and node.output[3] else f"{node.name}/sum"
        nodes.append(helper.make_node("Add", [node.input[1], node.input[0]], [total], name=f"{node.name}/Add"))
        nodes.append(helper.make_node("SimplifiedLayerNormalization", [total, node.input[2]], [node.output[0]],
                                      name=f"{node.name}/Norm", axis=-1, epsilon=epsilon))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def test_fused_skip_norms_pass(make_model):
    assert findings(make_model(), SKIP) == []


def test_add_then_fused_norm_is_reported(make_model, tmp_path):
    model = split_skip_norms(onnx.load(str(make_model(layers=2))))
    path = tmp_path / "split.onnx"
    onnx.save(model, path)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, make_feeds(model))
    found = findings(path, SKIP)
    # post-attention norm of layer 0, input norm + post-attention norm of layer 1, final norm
    assert [f.layer for f in found] == [0, 1, None]
    assert [dict(f.properties)["residual_adds"] for f in found] == [1, 2, 1]
    assert "SimplifiedLayerNormalization" in found[0].message


def test_decomposed_norms_after_residual_adds_are_reported(make_model):
    found = findings(make_model(norm="decomposed", qk_norm=True), SKIP)
    assert [f.layer for f in found] == [0, 1, None]
    assert "decomposed RMSNorm" in found[0].message


def test_dynamo_dump_reports_residual_adds_by_structure():
    folder = EXPORTED / "dynamo-qwen3_moe"
    found = findings(folder / "model.onnx", SKIP, optimized=folder / "model.optimized.onnx")
    assert [f.layer for f in found] == [0, 1, None]


# norm-epsilon-default ----------------------------------------------------------------------------------


def test_missing_epsilon_is_reported_against_the_family(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  family: qwen3_moe\n")
    found = findings(make_model(norm_epsilon=None), EPS, policy)
    by_op = {f.op_type: f for f in found}
    assert set(by_op) == {"com.microsoft.SkipSimplifiedLayerNormalization", "SimplifiedLayerNormalization"}
    skip = by_op["com.microsoft.SkipSimplifiedLayerNormalization"]
    assert dict(skip.properties)["epsilon"] == pytest.approx(1e-12)
    assert "qwen3_moe family uses 1e-06" in skip.message


def test_missing_epsilon_matching_the_policy_passes_for_simplified_norm(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  rms_norm_eps: 1.0e-5\n")
    found = findings(make_model(norm_epsilon=None), EPS, policy)
    assert [f.op_type for f in found] == ["com.microsoft.SkipSimplifiedLayerNormalization"]
    assert found[0].location.file.endswith(".onnx") and "policy expects 1e-05" in found[0].message


def test_missing_skip_epsilon_is_reported_without_any_family(make_model):
    found = findings(make_model(norm_epsilon=None), EPS)
    assert [f.op_type for f in found] == ["com.microsoft.SkipSimplifiedLayerNormalization"]


def test_explicit_epsilon_other_than_the_family(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  family: gpt_oss\n")
    found = findings(make_model(norm_epsilon=1e-6), EPS, policy)
    assert found and all(dict(f.properties)["expected"] == pytest.approx(1e-5) for f in found)


def test_explicit_family_epsilon_passes(make_model, write_policy):
    assert findings(make_model(norm_epsilon=1e-6), EPS, write_policy("name: p\nmodel:\n  family: qwen3_moe\n")) == []


def test_gpu_only_form_says_so_on_cpu(tmp_path, write_policy):
    """x -> Cast(float) -> Pow/ReduceMean/Add/Sqrt/Div -> Cast(float16) -> Mul(gamma): ORT fuses it on CUDA only."""
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("axes", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]), helper.make_tensor("gamma", TensorProto.FLOAT16, [8], [1.0] * 8)]
    nodes = [
        helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
        helper.make_node("Pow", ["xf", "two"], ["sq"]),
        helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
        helper.make_node("Add", ["ms", "eps"], ["mse"]),
        helper.make_node("Sqrt", ["mse"], ["rms"]),
        helper.make_node("Div", ["xf", "rms"], ["normed"]),
        helper.make_node("Cast", ["normed"], ["normed16"], to=TensorProto.FLOAT16),
        helper.make_node("Mul", ["gamma", "normed16"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 8])], initializer=inits)
    path = tmp_path / "cast_div.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    cpu = findings(path, RMS, write_policy("name: p\nexecution_provider:\n  name: CPUExecutionProvider\n"))
    assert [f.severity for f in cpu] == [Severity.WARNING] and "only on CUDA/ROCm" in cpu[0].message
    cuda = write_policy("name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n", "c.yaml")
    assert [f.severity for f in findings(path, "rmsnorm-fused-by-ort", cuda)] == [Severity.INFO]
    assert findings(path, RMS, cuda) == []


def test_epsilon_defaults_in_the_table_are_ort_s():
    """ortgate/knowledge/ort_fusions.json's attribute defaults against the schemas the installed ORT registers."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    from ortgate.knowledge.fusions import attribute_default

    checked = 0
    for schema in ort_state.get_all_operator_schema():
        domain = schema.domain or ""
        for attr_name in ("epsilon", "activation_alpha", "activation_beta", "k", "normalize_routing_weights"):
            ours = attribute_default(domain, schema.name, attr_name)
            if ours is None or attr_name not in schema.attributes:
                continue
            proto = onnx.AttributeProto()
            proto.ParseFromString(schema.attributes[attr_name]._default_value)
            assert helper.get_attribute_value(proto) == pytest.approx(ours), (schema.name, attr_name)
            checked += 1
    assert checked >= 10
