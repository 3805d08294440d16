"""`ortgate fix` fuses every norm spelling the lint recognises: RMSNorm (Div, Reciprocal, Div(1, .), Pow -0.5; Pow or
Mul squares; fp16 Casts around it; q/k per-head norms) -> SimplifiedLayerNormalization, residual Add + RMSNorm ->
SkipSimplifiedLayerNormalization with the sum passed on to the next residual Add, a LayerNorm without bias ->
LayerNormalization. Each fixed model is verified on ORT CPU by fix itself and lints clean of the norm rules; a norm
no rule can take is left with the closest rule's reason."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import EXPORTED
from tests.helpers import lint_findings
from tests.test_fix import fix_json
from tests.test_rmsnorm_forms import NORM_RULES, NORMALIZES, SQUARES, rmsnorm_model


def ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def fixed(tmp_path, model: onnx.ModelProto) -> tuple[int, dict, object]:
    source = tmp_path / "in" / "model.onnx"
    source.parent.mkdir()
    onnx.save(model, source)
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out)
    return code, report, out / "model.onnx"


@pytest.mark.parametrize("square", SQUARES)
@pytest.mark.parametrize("normalize", NORMALIZES)
@pytest.mark.parametrize("cast", [False, True])
def test_every_rmsnorm_spelling_becomes_simplified_layer_normalization(tmp_path, square, normalize, cast):
    code, report, path = fixed(tmp_path, rmsnorm_model(square, normalize, cast=cast))
    assert code == 0 and report["verification"]["passed"], report
    assert ops(path) == ["SimplifiedLayerNormalization"]
    assert not lint_findings(path, select=NORM_RULES)
    assert report["fusions"]["layers"][0]["became"] == {"SimplifiedLayerNormalization": 1}


def _two_residual_norms() -> onnx.ModelProto:
    """h1 = x + r; y1 = rms(h1); h2 = h1 + y1 @ W; y2 = rms(h2) (Div(1, Sqrt) form): the second Add reads the first
    sum, which the fused node must pass on (its 4th output)."""
    base = rmsnorm_model("pow", "div_one", residual=True)
    nodes = list(base.graph.node)
    rng = np.random.default_rng(0)
    inits = list(base.graph.initializer) + [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32),
                                                                    "w")]
    nodes.append(helper.make_node("MatMul", ["y", "w"], ["p"], name="proj"))
    nodes.append(helper.make_node("Add", ["h", "p"], ["h2"], name="residual_add_2"))
    for node in base.graph.node:
        if node.name == "residual_add":
            continue
        twin = onnx.NodeProto()
        twin.CopyFrom(node)
        twin.name = node.name + "_2"
        rename = {"h": "h2", "y": "y2"}
        twin.input[:] = [rename.get(i, i if i in {t.name for t in inits} else i + "_2") for i in node.input]
        twin.output[:] = [rename.get(o, o + "_2") for o in node.output]
        nodes.append(twin)
    graph = helper.make_graph(nodes, "residual", list(base.graph.input),
                              [helper.make_tensor_value_info("y2", TensorProto.FLOAT, [1, 4, 16])], inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def test_residual_adds_become_skip_norms_passing_the_sum_on(tmp_path):
    model = _two_residual_norms()
    onnx.checker.check_model(model)
    code, report, path = fixed(tmp_path, model)
    assert code == 0 and report["verification"]["passed"], report
    out = onnx.load(str(path))
    skips = [n for n in out.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert len(skips) == 2
    # the first fused node's sum (output 3) is what the second reads as its residual
    assert skips[0].output[3] and skips[0].output[3] in skips[1].input
    assert not lint_findings(path, select=NORM_RULES)
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 4, 16)).astype(np.float32),
             "r": np.random.default_rng(2).standard_normal((1, 4, 16)).astype(np.float32)}
    run = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
           for p in (tmp_path / "in" / "model.onnx", path)]
    np.testing.assert_allclose(run[0], run[1], rtol=1e-4, atol=1e-5)


def layer_norm_model(normalize: str) -> onnx.ModelProto:
    """x - mean(x), then the RMS chain, times gamma, no bias: a LayerNorm written out by hand."""
    inits = [numpy_helper.from_array(np.linspace(0.5, 1.5, 16).astype(np.float32), "gamma"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
             numpy_helper.from_array(np.array(1.0, np.float32), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [helper.make_node("ReduceMean", ["x", "axes"], ["mu"], keepdims=1, name="mean_x"),
             helper.make_node("Sub", ["x", "mu"], ["d"], name="center"),
             helper.make_node("Pow", ["d", "two"], ["sq"], name="square"),
             helper.make_node("ReduceMean", ["sq", "axes"], ["var0"], keepdims=1, name="variance"),
             helper.make_node("Add", ["var0", "eps"], ["var"], name="add_eps"),
             helper.make_node("Sqrt", ["var"], ["std"], name="sqrt")]
    if normalize == "div":
        nodes.append(helper.make_node("Div", ["d", "std"], ["n"], name="normalize"))
    else:
        nodes += [helper.make_node("Div", ["one", "std"], ["inv"], name="inverse"),
                  helper.make_node("Mul", ["d", "inv"], ["n"], name="normalize")]
    nodes.append(helper.make_node("Mul", ["gamma", "n"], ["y"], name="scale"))
    graph = helper.make_graph(nodes, "layernorm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])], inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("normalize", ["div", "div_one"])
def test_layer_norm_without_bias_becomes_layer_normalization(tmp_path, normalize):
    code, report, path = fixed(tmp_path, layer_norm_model(normalize))
    assert code == 0 and report["verification"]["passed"], report
    assert ops(path) == ["LayerNormalization"]
    assert report["fusions"]["counts"]["layer_norm_no_bias"] == 1


def test_a_norm_no_rule_takes_is_left_with_the_closest_rules_reason(tmp_path):
    model = rmsnorm_model("pow", "div_one")
    axes = next(t for t in model.graph.initializer if t.name == "axes")
    axes.CopyFrom(numpy_helper.from_array(np.array([1], np.int64), "axes"))  # the mean over the sequence, not the width
    code, report, _ = fixed(tmp_path, model)
    assert code == 0
    (layer,) = report["fusions"]["layers"]
    reason = layer["missed"]["rmsnorm"]["reason"]
    assert "MatchingTracer" in reason and "not over the last axis" in reason, reason


@pytest.mark.parametrize("folder", ["optimum-qwen3_moe-past", "optimum-llama-past"])
def test_torchscript_exports_norms_all_fused_q_k_head_norms_included(tmp_path, folder):
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / folder, "-o", out)
    assert code == 0 and report["verification"]["passed"]
    assert not lint_findings(out / "model.onnx", select=NORM_RULES)
    became: dict[str, int] = {}
    for layer in report["fusions"]["layers"]:
        for op, n in layer["became"].items():
            became[op] = became.get(op, 0) + n
    assert became.get("SkipSimplifiedLayerNormalization", 0) >= 3, became


@pytest.mark.parametrize("normalize", NORMALIZES)
def test_a_norm_without_gamma_becomes_simplified_layer_normalization_scaled_by_ones(tmp_path, normalize):
    """Llama-4's q/k L2 norm: the RMS chain with no scale Mul after it."""
    model = rmsnorm_model("pow", normalize)
    del model.graph.node[-1]  # the gamma Mul
    model.graph.output[0].name = "n"
    code, report, path = fixed(tmp_path, model)
    assert code == 0 and report["verification"]["passed"], report
    out = onnx.load(str(path))
    assert [n.op_type for n in out.graph.node if n.op_type != "Constant"] == ["SimplifiedLayerNormalization"]
    assert not lint_findings(path, select=NORM_RULES)


def test_the_real_llama4_export_s_unscaled_q_k_norms_are_fused(tmp_path):
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-llama4", "-o", out)
    assert code == 0 and report["verification"]["passed"]
    assert not lint_findings(out / "model.onnx", select=["rmsnorm-not-fused"])
