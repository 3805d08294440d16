"""Graphs of producers beyond the exporters of test_exported_moe_families.py: ORT's own quantizer
(`quantize_dynamic`, tests/fixtures/exported/quantdyn-*, make_quantized_fixtures.py), a torch.onnx export whose
sequence length is the example's (dynamo-mamba) and DBRX's packed, clipped Wqkv (dynamo-dbrx; both
make_dynamo_moe_fixtures.py). Each fixture is first run on ORT CPU, then linted: what ORT runs must not be called
unrunnable, and what ORT refuses must be an error naming why.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortgate.findings import Kind
from ortgate.graph import build_graph
from ortgate.graph.load import load_model
from tests.conftest import EXPORTED
from tests.helpers import lint_findings

QUANTDYN = EXPORTED / "quantdyn-qwen3_moe" / "model.onnx"
MAMBA = EXPORTED / "dynamo-mamba" / "model.onnx"
DBRX = EXPORTED / "dynamo-dbrx" / "model.onnx"
REPO_POLICY = EXPORTED.parents[2] / "policies" / "tiny-moe-cpu.yaml"
CONTRACT_RULES = ["op-input-missing", "op-input-rank", "op-input-type", "op-attribute-missing", "op-attribute-type",
                  "op-attribute-value", "split-sizes-mismatch"]


def load_graph(path: str):
    return build_graph(load_model(path), path)


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _ids(length: int) -> np.ndarray:
    return np.arange(1, length + 1, dtype=np.int64).reshape(1, length)


# ---- types through quantization ops --------------------------------------------------------------------------


def test_quantize_dynamic_output_runs_and_breaks_no_contract():
    ids = _ids(5)
    logits = _session(QUANTDYN).run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})[0]
    assert logits.shape == (1, 5, 128) and np.isfinite(logits).all()
    found = lint_findings(QUANTDYN, select=CONTRACT_RULES)
    assert found == []


def test_types_of_quantization_ops_follow_their_schemas():
    graph = load_graph(str(QUANTDYN))
    quantizers = graph.by_op_type("DynamicQuantizeLinear")
    matmuls = graph.by_op_type("MatMulInteger")
    assert quantizers and matmuls
    for node in quantizers:  # y and y_zero_point: T2 = uint8; y_scale: tensor(float)
        assert [graph.dtype(o) for o in node.outputs] == ["uint8", "float", "uint8"]
    for node in matmuls:
        assert graph.dtype(node.inputs[0]) == "uint8"
        assert graph.dtype(node.inputs[1]) == "int8"  # the quantized weight (QInt8)
        assert graph.dtype(node.outputs[0]) == "int32"


def _untyped_index_model(tmp_path):
    """Multinomial's output type is its `dtype` attribute's (int32 by default): the schema leaves T2 open."""
    table = numpy_helper.from_array(np.arange(32, dtype=np.float32).reshape(8, 4), "table")
    nodes = [helper.make_node("Multinomial", ["probs"], ["picked"], sample_size=2, seed=1.0),
             helper.make_node("Gather", ["table", "picked"], ["rows"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, 2, 4])], [table])
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


def test_a_type_no_schema_implies_is_not_checked_never_guessed(tmp_path):
    path = _untyped_index_model(tmp_path)
    rows = _session(path).run(None, {"probs": np.full((1, 8), 1.0, np.float32)})[0]
    assert rows.shape == (1, 2, 4)
    assert load_graph(str(path)).dtype("picked") is None
    found = lint_findings(path, select=["op-input-type"])
    assert [f.kind for f in found] == [Kind.UNDECIDED]
    assert "not checked" in found[0].message and "Gather" in found[0].message


# ---- exports that cannot decode one token --------------------------------------------------------------------


def test_a_sequence_fixed_to_the_example_is_an_error_ort_confirms():
    sess = _session(MAMBA)
    assert sess.run(None, {"input_ids": _ids(7)})[0].shape == (1, 7, 128)
    with pytest.raises(Exception, match="Got: 1 Expected: 7"):
        sess.run(None, {"input_ids": _ids(1)})
    found = [f for f in lint_findings(MAMBA) if f.rule == "decode-shape-specialised"]
    assert len(found) == 1 and found[0].kind is Kind.VIOLATION and found[0].severity.label == "error"
    props = dict(found[0].properties)
    assert (props["input"], props["literal"]) == ("input_ids", 7)
    assert "'input_ids'" in found[0].message and "7" in found[0].message
    assert "dynamic_shapes" in (found[0].fix or "")


# ---- packing seen through elementwise ops --------------------------------------------------------------------


def test_dbrx_clamped_wqkv_is_one_packed_projection():
    """DBRX: Wqkv (one MatMul) -> Clip(clip_qkv) -> Split into q, k, v."""
    from ortgate.graph.patterns.projections import qkv_projections

    graph = load_graph(str(DBRX))
    assert graph.by_op_type("Clip") and graph.by_op_type("Split")
    found = qkv_projections(graph)
    assert len(found) == 2 and all(p.packed and p.traced for p in found)
    assert {p.layer for p in found} == {0, 1}


@pytest.mark.parametrize("fixture", ["qwen3_moe", "olmoe"])
def test_quantize_dynamic_projections_are_judged_as_their_float_twins(fixture):
    """quantize_dynamic's q, k and v: three MatMulIntegers of one DynamicQuantizeLinear output, each dequantized by
    Cast -> Mul(scale): the same three separate projections of one input as in the float export it was made from."""
    quantized = lint_findings(EXPORTED / f"quantdyn-{fixture}" / "model.onnx", select=["qkv-not-packed"])
    original = lint_findings(EXPORTED / f"dynamo-{fixture}" / "model.onnx", select=["qkv-not-packed"])
    assert [f.message for f in quantized if f.kind is not Kind.VIOLATION] == []  # decided
    assert [(f.layer, dict(f.properties)["projections"]) for f in quantized] == \
        [(f.layer, dict(f.properties)["projections"]) for f in original] == [(0, 3), (1, 3)]
    graph = load_graph(str(EXPORTED / f"quantdyn-{fixture}" / "model.onnx"))
    ops = {n.name: n.op_type for n in graph.nodes}
    assert {ops[f.node] for f in quantized} == {"MatMulInteger"}
    assert all("[64, 64]" in f.message and "[64, 32]" in f.message for f in quantized)


OUT = None
GRAPH_RULES = ["moe-not-fused", "gqa-not-fused", "rmsnorm-not-fused", "skip-rmsnorm-not-fused", "rotary-not-fused",
               "qkv-not-packed", "gate-up-not-merged", "decode-shape-specialised", "op-input-type"]
# fixture -> rule -> the layers it reports (read from the family's modeling code and the graph); a rule not named
# reports nothing
EXPECTED = {
    # LayerNorm without bias (no RMSNorm finding); one packed, clamped Wqkv; w1 and v1 apart
    "dynamo-dbrx": {"moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rotary-not-fused": [0, 1],
                    "gate-up-not-merged": [0, 1]},
    # GLM-4.5-MoE: layer 0 a dense MLP, layer 1 MoE; partial rotary (said in the rotary finding)
    "dynamo-glm4_moe": {"moe-not-fused": [1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
                        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1]},
    # the same with a head of 32, 16 dims rotated (a partial rotary GroupQueryAttention can fold in)
    "dynamo-glm4_moe-rotary16": {"moe-not-fused": [1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
                                 "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1],
                                 "qkv-not-packed": [0, 1]},
    # Jamba: layer 0 Mamba (no attention, no rotary) + dense MLP, layer 1 attention (no rotary in Jamba) + MoE;
    # fixed to 7 tokens
    "dynamo-jamba": {"moe-not-fused": [1], "gqa-not-fused": [1], "rmsnorm-not-fused": [0, 1, OUT],
                     "skip-rmsnorm-not-fused": [0, 1, OUT], "qkv-not-packed": [1], "decode-shape-specialised": [OUT]},
    # Qwen3-Next: layer 0 gated DeltaNet (no softmax attention, no rotary), layer 1 gated attention with partial
    # rotary; MoE in both; fixed to 7 tokens
    "dynamo-qwen3_next": {"moe-not-fused": [0, 1], "gqa-not-fused": [1], "rmsnorm-not-fused": [0, 1, OUT],
                          "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [1], "qkv-not-packed": [1],
                          "decode-shape-specialised": [OUT]},
    # no attention: RMSNorm before each mixer and the final one; the residual Add of layer 1 and the final norm
    "dynamo-mamba": {"rmsnorm-not-fused": [0, 1, OUT], "skip-rmsnorm-not-fused": [1, OUT],
                     "decode-shape-specialised": [OUT]},
}


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_every_finding_in_its_layer_and_nothing_else(fixture):
    everything = lint_findings(EXPORTED / fixture / "model.onnx", select=GRAPH_RULES)
    assert [f.message for f in everything if f.kind is not Kind.VIOLATION] == []  # no rule left undecided
    found = [f for f in everything if f.kind is Kind.VIOLATION]
    got: dict[str, list] = {}
    for f in found:
        got.setdefault(f.rule, []).append(f.layer)
    got = {rule: sorted(layers, key=lambda layer: (layer is None, layer or 0)) for rule, layers in got.items()}
    assert got == EXPECTED[fixture]


MIXTRAL_STATIC = EXPORTED / "dynamo-mixtral-static" / "model.onnx"


def test_block_verification_feeds_the_length_a_fixed_export_accepts():
    """dynamo-mixtral-static computes for 7 tokens everywhere: each MoE block run alone on ORT CPU gets a hidden
    state of 7 tokens (16, the verification's default, breaks its ScatterElements), and matches itself."""
    from ortgate.fix.verify import BlockCheck, verify_blocks
    from ortgate.graph.patterns.moe import moe_blocks

    model = load_model(str(MIXTRAL_STATIC))
    graph = build_graph(model, str(MIXTRAL_STATIC))
    blocks = [BlockCheck(b.combine.name, b.hidden, b.output, b.router.outputs[0], 2, 64) for b in moe_blocks(graph)]
    assert len(blocks) == 2
    result = verify_blocks(model, MIXTRAL_STATIC.parent, model, MIXTRAL_STATIC.parent, graph, blocks)
    assert result.passed, [p.note for p in result.probes]
    assert [c.mismatched for c in result.outputs] == [0, 0]
    assert result.feeds["input_ids"] == [1, 7] and result.feeds[blocks[-1].hidden][1] == 7


def test_run_names_an_export_that_cannot_decode_one_token():
    from tests.helpers import run_cli_json

    code, report = run_cli_json("run", MAMBA, "--policy", REPO_POLICY)
    assert code == 1
    assert any(f["rule"] == "decode-shape-specialised" for f in report["findings"])


def test_a_fix_that_recognises_no_moe_says_so(tmp_path):
    """A router whose top-k weights no expert: no MoE block is read; the report must not read as "MoE done", and
    names each router not read with the reason (what lint's moe-not-fused said of it)."""
    from tests.helpers import run_cli
    from tests.models.qwen_moe import ModelSpec, build_model
    from tests.test_moe_reading import _with_a_bare_router

    model = _with_a_bare_router(build_model(ModelSpec(moe="dense")))  # a dense MLP model with one bare router
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    code, out, err = run_cli("fix", path, "-o", tmp_path / "out", "--dry-run", "--no-verify")
    assert code in (0, 1), err
    line = next(x for x in out.splitlines() if x.startswith("MoE rewrites:"))
    assert "no MoE block recognised" in line and "could not read 1 router-like structure" in line
    assert "weights no expert output" in line and "unfused MoE layers (moe-not-fused)" not in line


def test_a_fix_of_quantize_dynamic_experts_says_each_block_it_leaves(tmp_path):
    """quantize_dynamic's int8 Qwen3-MoE: its MatMulInteger expert loops are read, and each one fix leaves is named."""
    from tests.helpers import run_cli

    code, out, err = run_cli("fix", QUANTDYN, "-o", tmp_path / "out", "--dry-run", "--no-verify")
    assert code in (0, 1), err
    lines = out.splitlines()
    first = next(i for i, x in enumerate(lines) if x.startswith("MoE rewrites:"))
    assert lines[first] == "MoE rewrites: 0 block(s) -> com.microsoft.MoE, 2 left unchanged"
    assert [x.split(" (")[0].strip() for x in lines[first + 1:first + 3]] == ["layer 0", "layer 1"]
    assert all("left unchanged: " in x for x in lines[first + 1:first + 3])


# ---- words that fit the model ----------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture, tool", [("quantdyn-qwen3_moe", "quantization tool"),
                                           ("optimum-llama-past-o2", "transformers optimizer")])
def test_outputs_of_orts_own_tools_say_the_tool_fuses_none_of_it(fixture, tool):
    found = [f for f in lint_findings(EXPORTED / fixture / "model.onnx", select=["gqa-not-fused", "rotary-not-fused"])
             if f.kind is Kind.VIOLATION]
    assert {f.rule for f in found} == {"gqa-not-fused", "rotary-not-fused"}
    for f in found:
        assert tool in f.fix and "fuses none of the reported ops" in f.fix and "onnxruntime-genai" in f.fix


def _one(fixture: str, rule: str, layer: int):
    return next(f for f in lint_findings(EXPORTED / fixture / "model.onnx", select=[rule])
                if f.kind is Kind.VIOLATION and f.layer == layer)


def test_mamba_dt_b_c_norms_are_not_called_q_k():
    """Jamba's mixer normalises dt (then dt_proj) and B, C (then the scan) over x_proj's outputs."""
    f = _one("dynamo-jamba", "rmsnorm-not-fused", 0)
    assert "q/k" not in f.message.replace("MLA's q/kv latent", "")
    assert "1 over a projection's whole output feeding another projection" in f.message
    assert "2 over a projection's whole output feeding neither attention nor a projection" in f.message
    assert "per-head q/k" in _one("dynamo-qwen3_moe", "rmsnorm-not-fused", 0).message  # q_norm / k_norm stay q/k
    assert "feeding attention (q/k)" in _one("dynamo-olmoe", "rmsnorm-not-fused", 0).message


def test_qwen3_next_gated_norm_is_not_called_q_k():
    """Qwen3-Next's gated DeltaNet normalises each value head's output (then gates it): per-head, but not q/k."""
    f = _one("dynamo-qwen3_next", "rmsnorm-not-fused", 0)
    assert "per-head q/k" not in f.message and "1 per-head, feeding no attention" in f.message
    assert "2 per-head q/k" in _one("dynamo-qwen3_next", "rmsnorm-not-fused", 1).message  # its attention's q/k norms


@pytest.mark.parametrize("fixture, layer, rotated, head", [("dynamo-glm4_moe", 1, 8, 16),
                                                                 ("dynamo-glm4_moe-rotary16", 1, 16, 32),
                                                                 ("dynamo-qwen3_next", 1, 4, 16)])
def test_partial_rotary_says_the_rotated_dims(fixture, layer, rotated, head):
    f = _one(fixture, "rotary-not-fused", layer)
    assert f"rotary_embedding_dim={rotated}" in f.message and f"partial rotary, factor {rotated / head:g}" in f.message
    assert (dict(f.properties)["rotary_dim"], dict(f.properties)["head_dim"]) == (rotated, head)
    assert "partial" not in _one("dynamo-qwen3_moe", "rotary-not-fused", 1).message
