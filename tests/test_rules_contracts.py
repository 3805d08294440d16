"""Contract rules (OGX): models ORT refuses must not lint as valid. Each broken model here is first shown to be
refused by ORT itself (session creation or the first run on CPU), then ortgate must name the node, the input or
attribute, and the contract's source; the same model repaired must run and lint clean of these rules.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortgate.knowledge.contracts import op_contract
from tests.conftest import EXPORTED
from tests.helpers import lint_findings

CONTRACT_RULES = ["op-input-missing", "op-input-rank", "op-input-type", "op-attribute-missing", "op-attribute-type",
                  "op-attribute-value", "split-sizes-mismatch", "moe-expert-count-mismatch"]
MS = "com.microsoft"


def _save(tmp_path, nodes, inputs, outputs, inits=(), name="model.onnx"):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, ir_version=10,
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    path = tmp_path / name
    onnx.save(model, path)
    return path


def _ort_run(path, feed) -> str | None:
    """None when ORT creates the session and runs it; else ORT's error."""
    try:
        options = ort.SessionOptions()
        options.log_severity_level = 4
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        sess.run(None, feed)
    except Exception as exc:  # ORT raises its own exception types
        return str(exc)
    return None


def _rotary(tmp_path, position_dims, name):
    half = 4
    inits = [numpy_helper.from_array(np.ones((32, half), np.float32), "cos_cache"),
             numpy_helper.from_array(np.zeros((32, half), np.float32), "sin_cache")]
    node = helper.make_node("RotaryEmbedding", ["x", "position_ids", "cos_cache", "sin_cache"], ["y"], domain=MS,
                            name="/model/layers.0/attn/q_rotary/RotaryEmbedding", num_heads=2)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, position_dims)]
    return _save(tmp_path, [node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 16])], inits,
                 name)


def test_rank3_position_ids_into_rotary_embedding(tmp_path):
    """The onnxruntime-genai 0.18 Qwen3.5-MoE case: MRoPE positions [3, batch, seq] fed to RotaryEmbedding."""
    broken = _rotary(tmp_path, [3, 1, 3], "broken.onnx")
    x = np.ones((1, 3, 16), np.float32)
    assert _ort_run(broken, {"x": x, "position_ids": np.zeros((3, 1, 3), np.int64)}) is not None
    found = lint_findings(broken, select=CONTRACT_RULES)
    assert [f.rule for f in found] == ["op-input-rank"]
    assert "position_ids" in found[0].message and "rank 3" in found[0].message
    assert "ContribOperators.md" in found[0].message
    fixed = _rotary(tmp_path, [1, 3], "fixed.onnx")
    assert _ort_run(fixed, {"x": x, "position_ids": np.arange(3, dtype=np.int64)[None]}) is None
    assert lint_findings(fixed, select=CONTRACT_RULES) == []


def _split(tmp_path, sizes, name):
    inits = [numpy_helper.from_array(np.array(sizes, np.int64), "sizes")]
    outs = [f"e{i}" for i in range(len(sizes))]
    nodes = [helper.make_node("Split", ["probs", "sizes"], outs, axis=-1, name="/model/layers.0/mlp/Split")]
    nodes.append(helper.make_node("Concat", outs, ["y"], axis=-1, name="concat"))
    return _save(tmp_path, nodes, [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["tokens", 8])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", sum(sizes)])], inits, name)


def test_split_sizes_against_the_split_axis(tmp_path):
    """A legacy traced Mixtral keeps 7 of 8 experts and splits the router's 8 columns into 7."""
    probs = np.ones((2, 8), np.float32)
    broken = _split(tmp_path, [1] * 7, "broken.onnx")
    assert _ort_run(broken, {"probs": probs}) is not None
    found = lint_findings(broken, select=CONTRACT_RULES)
    assert [f.rule for f in found] == ["split-sizes-mismatch"]
    assert "add up to 7" in found[0].message and "has 8" in found[0].message
    fixed = _split(tmp_path, [1] * 8, "fixed.onnx")
    assert _ort_run(fixed, {"probs": probs}) is None
    assert lint_findings(fixed, select=CONTRACT_RULES) == []


def _gqa(tmp_path, name, **attrs):
    node = helper.make_node("GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total"], ["o", "pk", "pv"],
                            domain=MS, name="/model/layers.0/attn/GroupQueryAttention", **attrs)
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 3, 32]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 3, 16]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [1, 3, 16]),
              helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
              helper.make_tensor_value_info("total", TensorProto.INT32, [])]
    outputs = [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, 3, 32])]
    return _save(tmp_path, [node], inputs, outputs, name=name)


def _gqa_feed():
    return {"q": np.ones((1, 3, 32), np.float32), "k": np.ones((1, 3, 16), np.float32),
            "v": np.ones((1, 3, 16), np.float32), "seqlens_k": np.array([2], np.int32), "total": np.array(3, np.int32)}


def test_required_attribute_missing_and_of_the_wrong_type(tmp_path):
    missing = _gqa(tmp_path, "missing.onnx", num_heads=4)
    assert _ort_run(missing, _gqa_feed()) is not None
    found = lint_findings(missing, select=CONTRACT_RULES)
    assert [(f.rule, dict(f.properties)["attribute"]) for f in found] == [("op-attribute-missing", "kv_num_heads")]
    wrong = _gqa(tmp_path, "wrong.onnx", num_heads=4, kv_num_heads=2.0)
    assert _ort_run(wrong, _gqa_feed()) is not None
    assert [f.rule for f in lint_findings(wrong, select=CONTRACT_RULES)] == ["op-attribute-type"]
    good = _gqa(tmp_path, "good.onnx", num_heads=4, kv_num_heads=2)
    assert _ort_run(good, _gqa_feed()) is None
    assert lint_findings(good, select=CONTRACT_RULES) == []


def _moe(tmp_path, name, activation):
    e, h, i = 4, 8, 8
    inits = [numpy_helper.from_array(np.full((e, 2 * i, h), 0.01, np.float32), "fc1"),
             numpy_helper.from_array(np.full((e, h, i), 0.01, np.float32), "fc2")]
    node = helper.make_node("MoE", ["x", "router", "fc1", "", "fc2"], ["y"], domain=MS, name="/model/layers.0/moe/MoE",
                            k=2, activation_type=activation, swiglu_fusion=1)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, h]),
              helper.make_tensor_value_info("router", TensorProto.FLOAT, [3, e])]
    return _save(tmp_path, [node], inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, h])], inits, name)


def test_attribute_value_outside_its_documented_domain(tmp_path):
    feed = {"x": np.ones((3, 8), np.float32), "router": np.ones((3, 4), np.float32)}
    broken = _moe(tmp_path, "broken.onnx", "swish")
    assert _ort_run(broken, feed) is not None
    found = lint_findings(broken, select=CONTRACT_RULES)
    assert [f.rule for f in found] == ["op-attribute-value"]
    assert "swiglu" in found[0].message and "ContribOperators.md" in found[0].message
    fixed = _moe(tmp_path, "fixed.onnx", "swiglu")
    assert _ort_run(fixed, feed) is None
    assert lint_findings(fixed, select=CONTRACT_RULES) == []


def test_input_type_outside_the_type_constraint(tmp_path):
    path = _rotary(tmp_path, [1, 3], "int32.onnx")
    model = onnx.load(path)
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.INT32
    onnx.save(model, path)
    x = np.ones((1, 3, 16), np.float32)
    assert _ort_run(path, {"x": x, "position_ids": np.zeros((1, 3), np.int32)}) is not None
    found = lint_findings(path, select=CONTRACT_RULES)
    assert [(f.rule, dict(f.properties)["dtype"]) for f in found] == [("op-input-type", "int32")]


def test_an_op_without_a_contract_is_not_checked_never_valid(tmp_path):
    node = helper.make_node("BrandNewOp", ["x"], ["y"], domain=MS, name="new")
    path = _save(tmp_path, [node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    assert op_contract(MS, "BrandNewOp", 1) is None
    found = lint_findings(path, select=["op-contract-unknown"])
    assert len(found) == 1 and "not checked" in found[0].message and "com.microsoft.BrandNewOp" in found[0].message
    assert found[0].layer is None


def test_legacy_trace_missing_an_expert_is_an_error_whatever_else(tmp_path):
    """A router of width 4 with only 3 experts computed (the traced export kept the experts its input hit)."""
    h = 8
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((h, 4)).astype(np.float32), "router_w"),
             numpy_helper.from_array(np.array([2], np.int64), "k")]
    nodes = [helper.make_node("MatMul", ["x", "router_w"], ["logits"], name="/model/layers.0/mlp/gate/MatMul"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="/model/layers.0/mlp/Softmax"),
             helper.make_node("TopK", ["probs", "k"], ["w", "idx"], name="/model/layers.0/mlp/TopK"),
             helper.make_node("ReduceSum", ["w"], ["wsum"], keepdims=1, name="/model/layers.0/mlp/ReduceSum")]
    total = None
    for e in (0, 1, 3):  # expert 2 was not traced
        inits += [numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32), f"up{e}"),
                  numpy_helper.from_array(rng.standard_normal((h, h)).astype(np.float32), f"down{e}")]
        scope = f"/model/layers.0/mlp/experts.{e}"
        nodes += [helper.make_node("MatMul", ["x", f"up{e}"], [f"u{e}"], name=f"{scope}/up/MatMul"),
                  helper.make_node("Relu", [f"u{e}"], [f"a{e}"], name=f"{scope}/Relu"),
                  helper.make_node("MatMul", [f"a{e}", f"down{e}"], [f"d{e}"], name=f"{scope}/down/MatMul"),
                  helper.make_node("Mul", [f"d{e}", "wsum"], [f"m{e}"], name=f"{scope}/Mul")]
        if total is None:
            total = f"m{e}"
        else:
            nodes.append(helper.make_node("Add", [total, f"m{e}"], [f"s{e}"], name=f"{scope}/Add"))
            total = f"s{e}"
    nodes.append(helper.make_node("Identity", [total], ["y"], name="out"))
    path = _save(tmp_path, nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, h])],
                 [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, h])], inits)
    found = lint_findings(path, select=CONTRACT_RULES)
    assert [f.rule for f in found] == ["moe-expert-count-mismatch"]
    props = dict(found[0].properties)
    assert (props["router_width"], props["routed_experts"], props["missing"]) == (4, 3, [])
    assert found[0].layer == 0


@pytest.mark.parametrize("fixture", sorted(p.name for p in EXPORTED.iterdir() if p.is_dir()))
def test_every_real_export_meets_its_contracts(fixture):
    """Every committed real-export fixture runs on ORT CPU (MANIFEST.json): no contract violation may be reported."""
    for model in sorted((EXPORTED / fixture).glob("*.onnx")):
        assert lint_findings(model, select=CONTRACT_RULES) == [], model.name


def test_contract_data_is_what_its_generator_writes():
    """op_contracts.json is generated, never edited: the committed file is what the script makes of the reference."""
    import subprocess
    import sys

    from tests.conftest import REPO

    script = REPO / "scripts" / "gen_op_contracts.py"
    spec = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    if spec.returncode == 2:
        pytest.skip(f"reference not found: {spec.stderr.strip()}")
    assert spec.returncode == 0, "ortgate/knowledge/op_contracts.json is stale: run python scripts/gen_op_contracts.py"
