"""RMSNorm in every algebraic spelling exporters write, and what ORT's own fusion makes of each.

x * rsqrt(mean(x^2) + eps) * gamma is written as Div(x, Sqrt), Mul(x, Reciprocal(Sqrt)), Mul(x, Div(1, Sqrt))
(the legacy TorchScript exporter), Mul(x, Pow(., -0.5)), with Pow(x, 2) or Mul(x, x), and with fp16 models'
Casts around it. Each must be found; and whether ortgate says ORT fuses it is checked against ORT itself: the
optimized dump of a real CPU session.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.helpers import lint_findings

NORM_RULES = ["rmsnorm-not-fused", "rmsnorm-fused-by-ort", "skip-rmsnorm-not-fused"]
SQUARES = ("pow", "mul")
NORMALIZES = ("div", "reciprocal", "div_one", "rsqrt_pow")


def rmsnorm_model(square: str, normalize: str, *, cast: bool = False, residual: bool = False) -> onnx.ModelProto:
    dtype, np_dtype = (TensorProto.FLOAT16, np.float16) if cast else (TensorProto.FLOAT, np.float32)
    inits = [
        numpy_helper.from_array(np.linspace(0.5, 1.5, 16).astype(np_dtype), "gamma"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(-0.5, np.float32), "minus_half"),
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
    ]
    nodes = []
    x = "x"
    if residual:
        nodes.append(helper.make_node("Add", ["x", "r"], ["h"], name="residual_add"))
        x = "h"
    if cast:
        nodes.append(helper.make_node("Cast", [x], ["xf"], to=TensorProto.FLOAT, name="upcast"))
        x = "xf"
    if square == "pow":
        nodes.append(helper.make_node("Pow", [x, "two"], ["sq"], name="square"))
    else:
        nodes.append(helper.make_node("Mul", [x, x], ["sq"], name="square"))
    nodes += [helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1, name="mean"),
              helper.make_node("Add", ["ms", "eps"], ["var"], name="add_eps")]
    if normalize == "rsqrt_pow":
        nodes += [helper.make_node("Pow", ["var", "minus_half"], ["inv"], name="rsqrt"),
                  helper.make_node("Mul", [x, "inv"], ["n"], name="normalize")]
    else:
        nodes.append(helper.make_node("Sqrt", ["var"], ["std"], name="sqrt"))
        if normalize == "div":
            nodes.append(helper.make_node("Div", [x, "std"], ["n"], name="normalize"))
        else:
            inverse = (helper.make_node("Reciprocal", ["std"], ["inv"], name="inverse") if normalize == "reciprocal"
                       else helper.make_node("Div", ["one", "std"], ["inv"], name="inverse"))
            nodes += [inverse, helper.make_node("Mul", [x, "inv"], ["n"], name="normalize")]
    n = "n"
    if cast:
        nodes.append(helper.make_node("Cast", ["n"], ["nh"], to=TensorProto.FLOAT16, name="downcast"))
        n = "nh"
    nodes.append(helper.make_node("Mul", [n, "gamma"], ["y"], name="scale"))
    inputs = [helper.make_tensor_value_info("x", dtype, [1, 4, 16])]
    if residual:
        inputs.append(helper.make_tensor_value_info("r", dtype, [1, 4, 16]))
    graph = helper.make_graph(nodes, "rmsnorm", inputs, [helper.make_tensor_value_info("y", dtype, [1, 4, 16])], inits)
    return helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 18)])


def _ort_fuses(path, tmp_path) -> bool:
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return any(n.op_type == "SimplifiedLayerNormalization" for n in onnx.load(options.optimized_model_filepath).graph.node)


@pytest.mark.parametrize("square", SQUARES)
@pytest.mark.parametrize("normalize", NORMALIZES)
def test_every_spelling_is_found_and_ort_fusion_is_told_right(square, normalize, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(rmsnorm_model(square, normalize), path)
    found = [f for f in lint_findings(path, select=NORM_RULES) if f.rule != "skip-rmsnorm-not-fused"]
    assert len(found) == 1, [f.message for f in found]
    says_fused = found[0].rule == "rmsnorm-fused-by-ort"
    assert says_fused == _ort_fuses(path, tmp_path)


@pytest.mark.parametrize("normalize", NORMALIZES)
def test_fp16_casts_around_the_norm_are_still_an_rmsnorm(normalize, tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(rmsnorm_model("pow", normalize, cast=True), path)
    found = [f for f in lint_findings(path, select=NORM_RULES) if f.rule != "skip-rmsnorm-not-fused"]
    assert len(found) == 1


@pytest.mark.parametrize("normalize", NORMALIZES)
def test_residual_add_before_any_spelling_is_skip_rmsnorm_not_fused(normalize, tmp_path):
    """ORT never builds SkipSimplifiedLayerNormalization, so the residual Add + norm is reported for every form."""
    path = tmp_path / "model.onnx"
    onnx.save(rmsnorm_model("pow", normalize, residual=True), path)
    assert [f.rule for f in lint_findings(path, select=["skip-rmsnorm-not-fused"])] == ["skip-rmsnorm-not-fused"]
