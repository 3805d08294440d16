"""rotary-not-fused: this graph, these findings."""

from __future__ import annotations

import pytest

from ortgate.lint.findings import Severity
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
