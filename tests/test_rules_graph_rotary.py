"""rotary-not-fused: this graph, these findings."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortgate.findings import Severity
from tests.conftest import EXPORTED
from tests.helpers import by_rule, lint_findings

ROTARY = "rotary-not-fused"


def findings(model, optimized=None):
    found = by_rule(lint_findings(model, optimized=optimized, select=[ROTARY]), ROTARY)
    return sorted(found, key=lambda f: (f.layer is None, f.layer or 0))


def test_decomposed_rotary_is_reported_once_per_layer(make_model):
    found = findings(make_model(rotary="decomposed", layers=3))
    assert [f.layer for f in found] == [0, 1, 2]
    assert all(f.severity == Severity.WARNING and f.op_type == "Neg" for f in found)
    assert dict(found[0].properties)["rotated_tensors"] == 2  # q and k
    assert "Sin/Cos computed in the graph" in found[0].message


@pytest.mark.parametrize("rotary", ["fused", "gqa"])
def test_fused_rotary_passes(make_model, rotary):
    assert findings(make_model(rotary=rotary)) == []


def test_decomposed_rotary_with_decomposed_attention_and_opaque_names(make_model):
    found = findings(make_model(rotary="decomposed", attention="decomposed", naming="none"))
    assert [f.layer for f in found] == [0, 1]
    assert all(f.node.startswith("<Neg#") for f in found)  # unnamed nodes get a stable synthetic name


def test_hybrid_model_rotates_only_its_attention_layers(make_model):
    model = make_model(layers=4, layer_types=("linear_attention",) * 3 + ("full_attention",), rotary="decomposed")
    assert [f.layer for f in findings(model)] == [3]


def test_dynamo_export_and_its_dump_report_every_layer():
    folder = EXPORTED / "dynamo-qwen3_moe"
    for dump in (None, folder / "model.optimized.onnx"):
        found = findings(folder / "model.onnx", dump)
        assert [f.layer for f in found] == [0, 1]
    # in the dump ORT turned the two Slices into one Split: still the same rotary
    dumped = findings(folder / "model.onnx", folder / "model.optimized.onnx")
    assert "Split" in dumped[0].message


def test_genai_mrope_is_fused():
    assert findings(EXPORTED / "genai-qwen3_5_moe-fp32-cpu") == []


def test_rotary_inside_an_if_branch_is_found(tmp_path):
    """x [batch, seq, heads, head_dim] rotated with cached cos/sin tables in the then-branch of an If."""
    half = [helper.make_tensor(name, TensorProto.INT64, [1], [v]) for name, v in
            (("zero", 0), ("four", 4), ("eight", 8), ("last", -1))]
    tables = [helper.make_tensor(name, TensorProto.FLOAT, [1, 2, 1, 8], [0.5] * 16) for name in ("cos", "sin")]
    body = [
        helper.make_node("Slice", ["x", "zero", "four", "last"], ["x1"]),
        helper.make_node("Slice", ["x", "four", "eight", "last"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["neg"]),
        helper.make_node("Concat", ["neg", "x1"], ["rotated"], axis=-1),
        helper.make_node("Mul", ["x", "cos"], ["x_cos"]),
        helper.make_node("Mul", ["rotated", "sin"], ["r_sin"]),
        helper.make_node("Add", ["x_cos", "r_sin"], ["then_out"]),
    ]
    then_graph = helper.make_graph(body, "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["else_out"])], "else", [],
                                   [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph)], "main",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 8]),
         helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 8])], initializer=half + tables)
    path = tmp_path / "if_rotary.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    found = findings(path)
    assert len(found) == 1 and found[0].graph == "branch/then_branch"
    assert "cached cos/sin tables" in found[0].message


def _ort_dump(model, tmp_path):
    """ORT's own optimized dump (ORT_ENABLE_ALL, CPU) of a committed export, written where a test can read it."""
    path = tmp_path / "model.optimized.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return path


def test_llama4_complex_rotary_is_interleaved_in_the_export_and_in_ort_dump(tmp_path):
    """Llama-4's rotary in real numbers: x viewed as pairs [..., d/2, 2], Gather 0 / 1 (ORT's dump: Split in two,
    Squeeze), x[2i] * cos - x[2i+1] * sin: interleaved pairs, whose fused op needs rotary_interleaved=1."""
    model = EXPORTED / "dynamo-llama4" / "model.onnx"
    for found in (findings(model), findings(model, optimized=_ort_dump(model, tmp_path))):
        assert [f.layer for f in found] == [0, 1]
        assert all(dict(f.properties)["pairing"] == "interleaved" for f in found)
        assert all("rotary_interleaved=1" in f.message and "rotate_half" not in f.message for f in found)


def test_a_rotary_no_form_reads_is_undecided_never_silent(tmp_path):
    """Sin / Cos tables applied to q through a pair swap written as a Gather of a permutation (no Neg, no halves):
    no rotary form reads it; the rule says so with the Mul and its table, never nothing."""
    from onnx import parser

    from ortgate.findings import Kind

    model = parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 21]>
    g (float[1, 4, 8] q, float[1, 4, 1] pos) => (float[1, 4, 8] y)
    <float[1, 1, 8] inv = {1.0, 1.0, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001}, int64[8] perm = {1, 0, 3, 2, 5, 4, 7, 6}>
    {
      freqs = Mul(pos, inv)
      cos = Cos(freqs)
      sin = Sin(freqs)
      swapped = Gather<axis = -1>(q, perm)
      a = Mul(q, cos)
      b = Mul(swapped, sin)
      y = Add(a, b)
    }
    """)
    path = tmp_path / "rotary.onnx"
    onnx.save(model, str(path))
    found = by_rule(lint_findings(path, select=[ROTARY]), ROTARY)
    assert [f.kind for f in found] == [Kind.UNDECIDED]
    assert found[0].message.startswith("could not decide:") and "Cos" in found[0].message
    assert dict(found[0].properties)["table_products"] == 2
