"""`ortgate fix`: every MoE form the generator builds becomes com.microsoft.MoE, equal on ORT CPU to the model's fused
twin (the same spec built with moe="fused"), with the twin's exact fc1/fc2 bytes; the real dynamo export of Qwen3-MoE
is rewritten and verified; routers the op cannot express are left with their reason; bad input writes nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from ortgate.cli import main
from ortgate.engine.pipeline import LintRequest, load_inputs
from ortgate.knowledge.moe_op import moe_op_facts
from tests.conftest import EXPORTED
from tests.helpers import rule_findings, run_cli
from tests.models.qwen_moe import ModelSpec, build_model, make_feeds, save_model

DYNAMO_QWEN3_MOE = EXPORTED / "dynamo-qwen3_moe" / "model.onnx"


def fix_json(*args) -> tuple[int, dict]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["fix", *map(str, args), "--format", "json"])
    return code, (json.loads(out.getvalue()) if out.getvalue().strip() else {})


def run(path: Path, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], feeds)[0]


def moe_nodes(path: Path) -> list[onnx.NodeProto]:
    model = onnx.load(str(path), load_external_data=False)
    return [n for n in model.graph.node if n.op_type == "MoE" and n.domain == "com.microsoft"]


def initializer(path: Path, name: str) -> np.ndarray:
    model = onnx.load(str(path))
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


FORMS = [
    dict(moe="dense_loop"),
    dict(moe="dense_loop", gate_up="separate", router_order="topk_softmax"),
    dict(moe="dense_loop", normalize_routing_weights=0),
    dict(moe="dense_loop", renormalisation="l1"),  # DBRX: ReduceL1 -> Div
    dict(moe="gather_loop", renormalisation="clamped_sum"),  # ERNIE-4.5: ReduceSum -> Clip(min) -> Div
    dict(moe="dense_loop", shared_expert=True, naming="none"),
    dict(moe="dense_loop", naming="opaque", experts=8, top_k=2, hidden=32, moe_intermediate=32),
    dict(moe="gather_loop"),
    dict(moe="gather_loop", gate_up="separate", router_order="topk_softmax", naming="hf"),
    dict(moe="gather_loop", shared_expert=True),
    dict(moe="dense_loop", dtype="float16"),
]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_every_generated_moe_form_becomes_its_fused_twin(tmp_path, form):
    spec = ModelSpec(layers=2, **form)
    src = save_model(build_model(spec), tmp_path / "in" / "model.onnx", external_data=True)
    twin = save_model(build_model(ModelSpec(layers=2, **{**form, "moe": "fused"})), tmp_path / "twin" / "model.onnx")
    out = tmp_path / "out"
    code, report = fix_json(src, "-o", out, "--select", "moe-not-fused")
    assert code == 0, report
    assert report["written"] and report["verification"]["passed"]
    assert [r["layer"] for r in report["rewrites"]] == [0, 1] and not report["refusals"]
    fixed = out / "model.onnx"
    nodes = moe_nodes(fixed)
    assert len(nodes) == spec.layers
    attrs = {a.name: helper.get_attribute_value(a) for a in nodes[0].attribute}
    assert attrs["k"] == spec.top_k and attrs["swiglu_fusion"] == 1 and attrs["activation_type"] == b"swiglu"
    assert attrs["normalize_routing_weights"] == (1 if spec.router_order == "topk_softmax" else spec.normalize_routing_weights)
    assert len(nodes[0].input) == moe_op_facts().min_inputs and nodes[0].input[3] == ""
    # The twin stacks the same logical parameters: fc1 interleaved (g0, u0, g1, ...), fc2 [E, H, I].
    twin_moe = moe_nodes(twin)[0]
    np.testing.assert_array_equal(initializer(fixed, nodes[0].input[2]), initializer(twin, twin_moe.input[2]))
    np.testing.assert_array_equal(initializer(fixed, nodes[0].input[4]), initializer(twin, twin_moe.input[4]))
    feeds = make_feeds(src, seq=5)
    tol = 2e-2 if spec.dtype == "float16" else 1e-4
    # The original is the truth: the twin's own MoE nodes read an intermediate tensor last, which ORT's CPU kernel
    # computes wrongly with normalize_routing_weights=0 on the releases of knowledge/ort_moe.json cpu_inplace_defect.
    np.testing.assert_allclose(run(fixed, feeds).astype(np.float32), run(src, feeds).astype(np.float32),
                               rtol=tol, atol=tol)
    if not (attrs["normalize_routing_weights"] == 0 and moe_op_facts().inplace_defect.affects(ort.__version__)):
        np.testing.assert_allclose(run(fixed, feeds).astype(np.float32), run(twin, feeds).astype(np.float32),
                                   rtol=tol, atol=tol)
    assert not rule_findings(fixed, "moe-not-fused")
    assert report["rewrites"][0]["weight_bytes_per_decode_token"]["after"] < \
        report["rewrites"][0]["weight_bytes_per_decode_token"]["before"] or spec.moe == "gather_loop"


def test_dynamo_qwen3_moe_export_is_rewritten_verified_and_lints_clean(tmp_path):
    out = tmp_path / "out"
    code, report = fix_json(DYNAMO_QWEN3_MOE, "-o", out)
    assert code == 0, report.get("failure")
    assert len(report["rewrites"]) == 2 and report["verification"]["passed"]
    assert report["verification"]["max_abs_diff"] < 1e-4
    assert report["rewrites"][0]["pattern"] == "dense_loop"
    assert report["measurement"]["original_p50_ms"] > 0 and report["measurement"]["fixed_p50_ms"] > 0
    fixed = out / "model.onnx"
    assert len(moe_nodes(fixed)) == 2
    assert not rule_findings(fixed, "moe-not-fused")
    assert not rule_findings(fixed, "rmsnorm-not-fused")
    # The per-layer fusion report says what onnxscript fused and what it left, with a reason.
    layers = {entry["layer"]: entry for entry in report["fusions"]["layers"]}
    assert layers[0]["applied"]["rmsnorm"] >= 2
    assert all(m["reason"] for entry in layers.values() for m in entry["missed"].values())
    assert "moe-not-fused" not in report["lint"]["after"] and "OGF001" not in report["lint"]["after"]
    assert "OGF001" in report["lint"]["before"]
    # The input is untouched and still runs.
    assert DYNAMO_QWEN3_MOE.stat().st_size == 951036


FIXED_RUN_POLICY = """name: cpu-fixed
extends: builtin:cpu
model: {attention_layers: 2, moe_layers: 2}
throughput:
  device: cpu
  calibration: {bandwidth_gb_s: 4.77, kernel_us: 0.5, graph_kernel_us: 0.5, memory_efficiency: 1.0}
runner: {warmup: 1, iterations: 2}
"""


def test_fix_then_run_reports_each_layer_of_ort_s_dump(tmp_path, write_policy):
    """ORT's dump of a fixed model keeps the names of the MoE nodes fix wrote (/model/layers.N/moe/MoE) and drops
    every other node's metadata: the layers still come out one per decoder layer, in `run` and in `lint
    --optimized`, and the policy's layer counts hold."""
    from tests.helpers import run_cli_json

    out = tmp_path / "out"
    code, report = fix_json(DYNAMO_QWEN3_MOE, "-o", out)
    assert code == 0, report.get("failure")
    policy, dump = write_policy(FIXED_RUN_POLICY), tmp_path / "fixed.optimized.onnx"
    _, ran = run_cli_json("run", out, "--policy", policy, "--dump", dump)
    _, linted = run_cli_json("lint", out, "--policy", policy, "--optimized", dump)
    for report in (ran, linted):
        active = [f for f in report["findings"] if not f["suppressed"]]
        assert not [f for f in active if f["code"] in ("OGM008", "OGM009")], [f["message"] for f in active]
        dump_findings = [f for f in active if f["file"] == str(dump)]
        for rule in ("rotary-not-fused", "qkv-not-packed"):
            assert sorted(f["layer"] for f in dump_findings if f["rule"] == rule) == [0, 1], rule


def _routing_node(model: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == op_type and "/moe/" in n.name)


def test_deepseek_style_router_is_left_unchanged_with_its_reason(tmp_path):
    """Sigmoid scores plus a correction bias before TopK (DeepSeek-V3's noaux_tc router): not expressible."""
    model = build_model(ModelSpec(moe="dense_loop", layers=1))
    softmax = _routing_node(model, "Softmax")
    softmax.op_type = "Sigmoid"
    del softmax.attribute[:]
    topk = _routing_node(model, "TopK")
    bias = numpy_helper.from_array(np.linspace(-0.1, 0.1, 4).astype(np.float32), "e_score_correction_bias")
    model.graph.initializer.append(bias)
    corrected = helper.make_node("Add", [topk.input[0], bias.name], ["corrected_scores"], name="/model/layers.0/moe/Add_bias")
    topk.input[0] = "corrected_scores"
    nodes = list(model.graph.node)
    nodes.insert(nodes.index(topk), corrected)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    src = save_model(model, tmp_path / "deepseek.onnx")
    code, report = fix_json(src, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0
    assert not report["rewrites"] and not report["written"]
    assert "bias-corrected top-k" in report["refusals"][0]["reason"]
    assert not (tmp_path / "out").exists()


def test_sigmoid_router_is_refused(tmp_path):
    model = build_model(ModelSpec(moe="dense_loop", layers=1))
    softmax = _routing_node(model, "Softmax")
    softmax.op_type = "Sigmoid"
    del softmax.attribute[:]
    src = save_model(model, tmp_path / "sigmoid.onnx")
    code, report = fix_json(src, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and "sigmoid scoring" in report["refusals"][0]["reason"]


def test_dry_run_writes_nothing(tmp_path, make_model):
    src = make_model(moe="dense_loop")
    code, report = fix_json(src, "-o", tmp_path / "out", "--dry-run", "--select", "moe-not-fused")
    assert code == 0 and report["dry_run"] and len(report["rewrites"]) == 2
    assert report["verification"] is None and not (tmp_path / "out").exists()


def test_text_report_names_layers_patterns_and_bytes(tmp_path, make_model, capsys):
    src = make_model(moe="dense_loop")
    assert main(["fix", str(src), "-o", str(tmp_path / "out"), "--select", "moe-not-fused"]) == 0
    text = capsys.readouterr().out
    assert "layer 0: dense_loop (softmax_topk, 4 experts, k=2" in text
    assert "nodes removed" in text and "expert weight bytes per decode token" in text
    assert "verification on ORT CPU" in text and "PASSED" in text and "max rel diff" in text
    assert "measured (" in text and "speedup" in text
    assert "estimated by the cost model for cpu (figures probed on this machine), the same step" in text
    assert "(an estimate, not a measurement)" in text


def test_the_cost_models_estimate_of_the_measured_step_stands_beside_the_measurement(tmp_path, make_model):
    from ortgate.cost import CostSetup, StepShape, estimate
    from ortgate.engine.throughput import with_probe
    from ortgate.graph import build_graph
    from ortgate.knowledge.devices import find_device

    src = make_model(moe="dense_loop", experts=16, top_k=2)
    out = tmp_path / "out"
    code, report = fix_json(src, "-o", out, "--select", "moe-not-fused")
    assert code == 0, report.get("failure")
    m, p = report["measurement"], report["prediction"]
    # the runner's decode step: one sequence, one new token after 16 cached ones
    assert (m["batch_size"], m["new_tokens"], m["context_length"]) == (1, 1, 17)
    assert p["estimate"] is True and p["device"] == "cpu" and p["figures"] == "probe"
    # the same step, estimated here through the public cost API with the probe's figures for this machine
    setup = CostSetup(with_probe(find_device("cpu"), None), StepShape(1, 1, 17), "CPUExecutionProvider")
    expected = {}
    for which, path in (("original", src), ("fixed", out / src.name)):
        graph = build_graph(onnx.load(str(path), load_external_data=False), str(path))
        expected[which] = estimate(graph, setup).as_exported.expected_s * 1e3
    assert p["original_ms_per_step_expected"] == pytest.approx(expected["original"], rel=1e-5, abs=1e-6)
    assert p["fixed_ms_per_step_expected"] == pytest.approx(expected["fixed"], rel=1e-5, abs=1e-6)
    # the dense loop reads all 16 experts per token, the MoE node the 2 it routes to
    assert p["speedup"] == pytest.approx(expected["original"] / expected["fixed"], rel=1e-3) and p["speedup"] > 1
    assert m["predicted_speedup"] == pytest.approx(p["speedup"], rel=1e-3)


# ---- the ORT release gate ------------------------------------------------------------------------------------------


def test_swiglu_release_gate_versions():
    gate = moe_op_facts().swiglu_gate
    assert gate.affects("1.27.1") and gate.affects("1.22.0")
    assert not gate.affects("1.28.0") and not gate.affects("1.31.1")
    assert gate.affects("not a version") is None


def test_policy_target_on_an_affected_release_warns_and_refuses(tmp_path, make_model, write_policy):
    src = make_model(moe="dense_loop")
    policy = write_policy("name: old-ort\nexecution_provider:\n  name: CPUExecutionProvider\n"
                          "  onnxruntime_version: '1.27.1'\n")
    code, report = fix_json(src, "-o", tmp_path / "out", "--select", "moe-not-fused", "--policy", policy)
    assert code == 0
    assert any("1.27.1" in w and "#28738" in w for w in report["warnings"])
    # written for the deployment: a node its release computes wrongly is not written
    assert not report["rewrites"] and len(report["refusals"]) == 2 and not report["written"]
    assert all("deployment's onnxruntime 1.27.1" in r["reason"] for r in report["refusals"])


def test_installed_release_with_the_swiglu_bug_refuses_the_rewrite(tmp_path, make_model, monkeypatch):
    monkeypatch.setattr(ort, "__version__", "1.27.1")
    src = make_model(moe="dense_loop")
    code, report = fix_json(src, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and not report["rewrites"]
    assert all("1.27.1" in r["reason"] for r in report["refusals"]) and len(report["refusals"]) == 2


# ---- bad input, failures, interruption ---------------------------------------------------------------------------


def test_missing_external_weights_exit_2_naming_file_and_tensor(tmp_path, make_model, capsys):
    src = make_model(moe="dense_loop", external_data=True, drop_data=True)
    code = main(["fix", str(src), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and f"{src.name}.data" in err and "tensor '" in err and "missing" in err
    assert not (tmp_path / "out").exists()


def test_truncated_external_weights_exit_2(tmp_path, make_model, capsys):
    src = make_model(moe="dense_loop", external_data=True)
    data = src.with_name(src.name + ".data")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    code = main(["fix", str(src), "-o", str(tmp_path / "out"), "--select", "moe-not-fused"])
    err = capsys.readouterr().err
    assert code == 2 and "truncated" in err and "tensor '" in err and str(data.name) in err
    assert not (tmp_path / "out").exists()


def test_output_folder_rules(tmp_path, make_model, capsys):
    src = make_model(moe="dense_loop")
    existing = tmp_path / "exists"
    existing.mkdir()
    assert main(["fix", str(src), "-o", str(existing)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["fix", str(src), "-o", str(src)]) == 2  # the input itself
    assert "over an input" in capsys.readouterr().err
    assert main(["fix", str(src), "-o", str(tmp_path), "--force"]) == 2  # holds the input
    assert "holds an input" in capsys.readouterr().err
    assert src.exists()
    # --force replaces a folder that holds no input
    assert main(["fix", str(src), "-o", str(existing), "--force", "--select", "moe-not-fused"]) == 0
    assert len(moe_nodes(existing / src.name)) == 2


def test_verification_mismatch_writes_nothing_and_names_the_node(tmp_path, make_model, monkeypatch, capsys):
    """An fc1 written with gate and up swapped: ORT computes something else, and the fix refuses to write it."""
    import ortgate.fix.moe as moe

    original = moe.view_matrix

    def swapped(source, view):
        matrix = original(source, view)
        return matrix[::-1].copy() if view.rows is not None and view.rows[0] == 0 else matrix

    monkeypatch.setattr(moe, "view_matrix", swapped)
    src = make_model(moe="dense_loop")
    code = main(["fix", str(src), "-o", str(tmp_path / "out"), "--select", "moe-not-fused"])
    out = capsys.readouterr().out
    assert code == 1
    assert "verification failed" in out and "first rewritten node whose output diverges: /model/layers.0/moe/MoE" in out
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if "ortgate-tmp" in p.name]


def test_interrupted_fix_leaves_no_output(tmp_path, make_model, monkeypatch):
    import ortgate.fix.pipeline as pipeline

    calls = {"n": 0}
    original = pipeline.write_planned

    def interrupted(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(pipeline, "write_planned", interrupted)
    src = make_model(moe="dense_loop")
    assert main(["fix", str(src), "-o", str(tmp_path / "out")]) == 130
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if "ortgate-tmp" in p.name]


def test_unknown_or_unfixable_rule_is_an_input_error(tmp_path, make_model, capsys):
    src = make_model(moe="dense_loop")
    assert main(["fix", str(src), "-o", str(tmp_path / "o"), "--select", "moe-not-fusd"]) == 2
    assert "unknown rule" in capsys.readouterr().err
    assert main(["fix", str(src), "-o", str(tmp_path / "o"), "--select", "OGM003"]) == 2
    assert "no automatic fix" in capsys.readouterr().err


def test_folder_input_carries_genai_config_over(tmp_path):
    folder = tmp_path / "model"
    save_model(build_model(ModelSpec(moe="dense_loop")), folder / "model.onnx", external_data=True)
    (folder / "genai_config.json").write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
    code, report = fix_json(folder, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and report["written"]
    assert sorted(report["files"]) == ["genai_config.json", "model.onnx", "model.onnx.data"]
    assert (tmp_path / "out" / "genai_config.json").read_text() == (folder / "genai_config.json").read_text()


def test_a_fused_model_has_nothing_to_fix(tmp_path):
    code, report = fix_json(EXPORTED / "genai-qwen3_5_moe-fp32-cpu", "-o", tmp_path / "out", "--select", "OGF001")
    assert code == 0 and not report["rewrites"] and not report["refusals"] and not report["written"]
    assert not (tmp_path / "out").exists()


# ---- graphs too large for a whole-model session of the original ---------------------------------------------------


def test_large_graphs_are_verified_block_by_block(tmp_path, monkeypatch):
    """When ORT does not build a session of the original within the limit, each MoE rewrite runs against its own
    block, and the onnxscript fusions run whole-model against the MoE-only stage (small once the expert loops are
    gone)."""
    import ortgate.fix.verify as verify

    monkeypatch.setattr(verify, "SESSION_BUILD_LIMIT_S", 0.001)  # no child process starts this fast
    code, report = fix_json(DYNAMO_QWEN3_MOE, "-o", tmp_path / "out")
    assert code == 0, report.get("failure")
    v = report["verification"]
    assert v["passed"] and v["mode"] == "per block" and len(v["notes"]) == 2
    assert any("did not build a session of the original" in n and "within 0.001 s" in n for n in v["notes"])
    assert any("as a whole" in n and "own block" in n for n in v["not_checked"])  # labelled for what it is
    assert all("own block" in r["verification"] for r in report["rewrites"])
    assert report["measurement"]["original_p50_ms"] is None and "within 0.001 s" in report["measurement"]["note"]


def _padded(model: Path, nodes: int) -> Path:
    """`model` with its logits passed through `nodes` Identity nodes: a graph over 3,000 nodes whose session ORT
    builds in well under a second."""
    import onnx
    from onnx import helper

    proto = onnx.load(model)
    name = proto.graph.output[0].name
    for node in proto.graph.node:
        node.output[:] = [f"{name}/0" if o == name else o for o in node.output]
        node.input[:] = [f"{name}/0" if i == name else i for i in node.input]
    for i in range(1, nodes + 1):
        proto.graph.node.append(helper.make_node("Identity", [f"{name}/{i - 1}"], [name if i == nodes else f"{name}/{i}"],
                                                 name=f"/pad/Identity_{i}"))
    onnx.save(proto, model)
    return model


def test_whole_model_verification_is_decided_by_a_bounded_session_build_not_a_node_count(tmp_path, make_model):
    """A 3,000-node graph that ORT builds in a fraction of a second is verified whole and its original timed."""
    from ortgate.fix.verify import measure_session_build

    src = _padded(make_model(moe="dense_loop"), 3000)
    build = measure_session_build(src)
    assert build.seconds is not None and build.seconds < build.limit_s and not build.too_slow
    code, report = fix_json(src, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0, report.get("failure")
    assert report["verification"]["mode"] != "per block"
    assert report["measurement"]["original_p50_ms"] is not None


def test_a_session_build_over_the_limit_is_stopped(tmp_path, make_model):
    from ortgate.fix.verify import measure_session_build

    build = measure_session_build(make_model(moe="dense_loop"), limit_s=0.001)
    assert build.too_slow and build.seconds is None and build.limit_s == 0.001


def test_a_static_export_is_measured_at_its_own_shape_and_the_speedup_is_the_printed_ratio():
    """A [1, 7] export is fed 7 tokens: that is the step the measurement names. The speedup beside the two p50s is
    their ratio; the median of the per-round ratios is named as such."""
    from ortgate.engine.fix import FixOutcome
    from ortgate.evidence import Ratio, Stats
    from ortgate.fix.measure import Measurement, decode_step
    from ortgate.fix.pipeline import FixResult
    from ortgate.report.fix import render_fix_text

    graph = load_inputs(LintRequest(str(EXPORTED / "dynamo-mixtral-static"))).model
    _, _, step = decode_step(graph)
    assert (step.batch, step.new_tokens) == (1, 7)
    measured = Measurement(Stats(20, 2.0, 1.9, 2.0, 2.1, 2.2, 2.2), Stats(20, 1.85, 1.8, 1.852, 1.9, 2.0, 2.0),
                           "one step of 1 x 7 new token(s)", ratio=Ratio(1.52, 1.1, 2.0, 5, False))
    text = render_fix_text(FixOutcome(FixResult("m.onnx", "out", ("moe",)), measurement=measured))
    [line] = [x for x in text.splitlines() if x.startswith("measured")]
    assert "speedup 1.08x (original p50 / fixed p50)" in line and "median of the per-round ratios 1.52x" in line
    assert "speedup 1.52x" not in line


def test_block_verification_catches_a_wrong_rewrite(tmp_path, make_model, monkeypatch, capsys):
    import ortgate.fix.moe as moe
    import ortgate.fix.verify as verify

    monkeypatch.setattr(verify, "SESSION_BUILD_LIMIT_S", 0.001)
    original = moe.view_matrix

    def swapped(source, view):
        matrix = original(source, view)
        return matrix[::-1].copy() if view.rows is not None and view.rows[0] == 0 else matrix

    monkeypatch.setattr(moe, "view_matrix", swapped)
    src = make_model(moe="gather_loop")
    code = main(["fix", str(src), "-o", str(tmp_path / "out"), "--select", "moe-not-fused"])
    out = capsys.readouterr().out
    assert code == 1 and "first rewritten node whose output diverges: /model/layers.0/moe/MoE" in out
    assert not (tmp_path / "out").exists()


# ---- real torch.onnx (dynamo) exports of other MoE families -------------------------------------------------------

REAL_EXPORTS = {
    "dynamo-mixtral": "dense_loop",  # TopK -> Softmax router
    "dynamo-qwen2_moe": "dense_loop",  # shared expert + sigmoid gate stay outside the node
    "dynamo-olmoe": "batched_matmul",  # experts gathered from stacks by the top-k indices, batched MatMuls
    "olive-mixtral": "batched_matmul",  # the same expert form after Olive's OrtTransformersOptimization
    # the legacy TorchScript exporter's eager loop: Gather e on the expert axis of Transpose(OneHot(indices)),
    # NonZero of it for the tokens, x[None, tokens], routing_weights[tokens * k + choice], index_add_ as a scatter
    "optimum-qwen3_moe-past": "gather_loop",
}


@pytest.mark.parametrize("folder", sorted(REAL_EXPORTS))
def test_real_exports_are_rewritten_verified_and_lint_clean(tmp_path, folder):
    model = EXPORTED / folder / "model.onnx"
    if not model.exists():
        pytest.skip(f"{folder} fixture not committed")
    out = tmp_path / "out"
    code, report = fix_json(model, "-o", out)
    assert code == 0, report.get("failure")
    assert report["verification"]["passed"] and report["verification"]["mode"] == "whole model"
    assert [r["pattern"] for r in report["rewrites"]] == [REAL_EXPORTS[folder]] * len(report["rewrites"])
    assert report["rewrites"] and not report["refusals"]
    assert not rule_findings(out / "model.onnx", "moe-not-fused")


def test_real_deepseek_v3_export_is_refused_with_its_reasons(tmp_path):
    model = EXPORTED / "dynamo-deepseek_v3" / "model.onnx"
    if not model.exists():
        pytest.skip("dynamo-deepseek_v3 fixture not committed")
    code, report = fix_json(model, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and not report["rewrites"]
    reason = report["refusals"][0]["reason"]
    assert "sigmoid scoring" in reason and "bias-corrected" in reason and "group-limited" in reason


def test_hidden_equal_to_intermediate_is_written_in_the_layout_ort_reads(tmp_path, make_model):
    """hidden == intermediate makes fc2 square, which ORT's legacy-layout heuristic could misread: the rewrite says
    which layout it wrote, and the verification on the installed ORT proves it is read so."""
    src = make_model(moe="dense_loop", hidden=32, moe_intermediate=32, experts=4, top_k=2)
    code, report = fix_json(src, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and report["verification"]["passed"]
    assert any("fc2 [E, H, I] is square" in note for note in report["rewrites"][0]["notes"])


def test_a_fix_without_verification_never_claims_it_ran_the_model(tmp_path, make_model):
    src = make_model(moe="dense_loop", hidden=32, moe_intermediate=32, experts=4, top_k=2)
    for fmt in ("text", "json"):
        code, out, _ = run_cli("fix", src, "-o", tmp_path / fmt, "--select", "moe-not-fused", "--no-verify",
                               "--format", fmt)
        assert code == 0 and "is square" in out
        assert "confirmed by running" not in out
        if fmt == "text":  # bytes in estimate's unit family
            assert re.search(r"\d KiB -> [\d.]+ KiB", out) and " kB" not in out and " MB" not in out, out


def test_gpt_oss_clamped_swiglu_with_biases_keeps_its_constants(tmp_path):
    """GPT-OSS: gate/up interleaved in one biased projection, clamp(7), sigmoid(1.702 g), (up + 1): the node carries
    alpha, beta and limit from the graph, and fc1/fc2 biases in their slots."""
    model = EXPORTED / "dynamo-gpt_oss" / "model.onnx"
    if not model.exists():
        pytest.skip("dynamo-gpt_oss fixture not committed")
    out = tmp_path / "out"
    code, report = fix_json(model, "-o", out, "--select", "moe-not-fused")
    assert code == 0 and report["verification"]["passed"] and len(report["rewrites"]) == 2
    attrs = report["rewrites"][0]["attributes"]
    assert attrs["activation_alpha"] == pytest.approx(1.702) and attrs["activation_beta"] == 1.0
    assert attrs["swiglu_limit"] == 7.0
    node = moe_nodes(out / "model.onnx")[0]
    assert node.input[3] and node.input[5]  # fc1 and fc2 biases


def test_gpt_oss_batched_experts_with_gathered_biases_are_rewritten_and_verified(tmp_path):
    """GPT-OSS with transformers' batched_mm experts: each (token, choice) row gathers its expert's gate_up and down
    weights and biases from [E, ., .] / [E, N] stacks; both layers become one MoE node with both biases, verified."""
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-gpt_oss_batched" / "model.onnx", "-o", out, "--select", "moe-not-fused")
    assert code == 0 and report["verification"]["passed"] and not report["refusals"]
    assert [(r["layer"], r["pattern"], r["routing"]) for r in report["rewrites"]] == [
        (0, "batched_matmul", "topk_softmax"), (1, "batched_matmul", "topk_softmax")]
    attrs = report["rewrites"][0]["attributes"]
    assert attrs["swiglu_limit"] == 7.0 and attrs["normalize_routing_weights"] == 1
    nodes = moe_nodes(out / "model.onnx")
    assert len(nodes) == 2 and all(n.input[3] and n.input[5] for n in nodes)  # fc1 and fc2 biases


def test_dbrx_l1_renormalised_routing_is_rewritten_with_normalized_weights(tmp_path):
    """DBRX divides its top-k softmax weights by their L1 norm (torch.norm p=1: ReduceL1 -> Div): the same weights
    as dividing by their sum, so the node renormalises (normalize_routing_weights=1) and verifies."""
    code, report = fix_json(EXPORTED / "dynamo-dbrx" / "model.onnx", "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and report["verification"]["passed"] and not report["refusals"]
    assert [(r["layer"], r["attributes"]["normalize_routing_weights"]) for r in report["rewrites"]] == [(0, 1), (1, 1)]


def test_moe_behind_a_quantized_router_is_rewritten_and_verified(tmp_path):
    """quantize_dynamic's router (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scale)) is a projection to
    the expert logits like any other: the float experts become one MoE node fed the dequantized logits, the
    quantized router stays, and the rewrite verifies."""
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "quantdyn-olmoe" / "model.onnx", "-o", out, "--select", "moe-not-fused")
    assert code == 0 and report["verification"]["passed"] and not report["refusals"]
    assert [(r["layer"], r["pattern"], r["experts"], r["k"]) for r in report["rewrites"]] == [
        (0, "batched_matmul", 8, 2), (1, "batched_matmul", 8, 2)]
    fixed = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert sum(n.op_type == "MoE" for n in fixed.graph.node) == 2
    assert sum(n.op_type == "MatMulInteger" for n in fixed.graph.node) == 11  # every quantized projection kept


# ---- PhiMoE's sparsemixer router ---------------------------------------------------------------------------------

DYNAMO_PHIMOE = EXPORTED / "dynamo-phimoe" / "model.onnx"


def sparsemixer_reference(logits: np.ndarray, eps: float) -> np.ndarray:
    """[tokens, experts] routing weights of the sparsemixer (inference): pick the max, weight it by a softmax over the
    experts within 2 eps relative distance of it; pick the max of the rest, weight it the same way without the first."""
    weights = np.zeros_like(logits, dtype=np.float64)
    for t, row in enumerate(logits.astype(np.float64)):
        scores = row.copy()
        for _ in range(2):
            top = scores.max()
            pick = int(scores.argmax())
            out_of_band = (top - row) / np.maximum(np.abs(row), top) > 2 * eps
            masked = np.where(out_of_band, -np.inf, scores)
            p = np.exp(masked - top)
            weights[t, pick] = p[pick] / p.sum()
            scores[pick] = -np.inf
    return weights


def softmax_top2_reference(logits: np.ndarray) -> np.ndarray:
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    weights = np.zeros_like(p)
    for t, row in enumerate(p):
        top = np.argsort(-row)[:2]
        weights[t, top] = row[top]
    return weights


def test_phimoe_sparsemixer_is_refused_with_what_ort_cpu_computes_instead(tmp_path):
    code, report = fix_json(DYNAMO_PHIMOE, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and not report["rewrites"] and not report["written"]
    assert [r["layer"] for r in report["refusals"]] == [0, 1]
    reason = report["refusals"][0]["reason"]
    assert "sparsemixer routing (PhiMoE, jitter eps 0.01)" in reason
    assert "CPU kernel ignores it" in reason and "softmax over all experts" in reason
    assert "8 or 16 experts" in reason and "this block has 4 experts" in reason


def test_phimoe_graph_routes_by_sparsemixer_and_ort_cpu_moe_does_not(tmp_path):
    """The difference the refusal states, on real sessions: the export's routing matrix is the sparsemixer's with
    eps 0.01 (read from its Greater threshold 0.02), and ORT CPU's MoE with use_sparse_mixer=1 weights the experts
    exactly as use_sparse_mixer=0 (softmax over all experts, top-2), which is not that routing."""
    model = onnx.load(str(DYNAMO_PHIMOE))
    for name in ("linear_4", "scatter_1"):  # layer 0's router logits and the routing matrix the experts are weighted by
        model.graph.output.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.random.default_rng(0).integers(0, 128, size=(2, 7), dtype=np.int64)}
    feeds.update({i.name: np.ones((2, 7), dtype=np.int64) for i in session.get_inputs() if i.name != "input_ids"})
    logits, routing = session.run(["linear_4", "scatter_1"], feeds)
    np.testing.assert_allclose(routing, sparsemixer_reference(logits, 0.01), rtol=1e-5, atol=1e-6)
    assert (routing.sum(-1) > 1.05).any()  # weights that no softmax top-2 gives

    experts, hidden = logits.shape[-1], 8
    fc1 = np.stack([np.eye(hidden, dtype=np.float32)] * experts)
    fc2 = np.stack([np.eye(hidden, dtype=np.float32) * 10.0 ** e for e in range(experts)])  # y[0] = sum w_e 10^e

    def moe_weights(use_sparse_mixer: int) -> np.ndarray:
        node = helper.make_node("MoE", ["x", "router", "fc1", "", "fc2"], ["y"], domain="com.microsoft", k=2,
                                activation_type="identity", use_sparse_mixer=use_sparse_mixer)
        graph = helper.make_graph(
            [node], "moe", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None, hidden]),
                            helper.make_tensor_value_info("router", onnx.TensorProto.FLOAT, [None, experts])],
            [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [None, hidden])],
            [numpy_helper.from_array(fc1, "fc1"), numpy_helper.from_array(fc2, "fc2")])
        moe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("com.microsoft", 1)], ir_version=10)
        run = ort.InferenceSession(moe.SerializeToString(), providers=["CPUExecutionProvider"])
        x = np.ones((logits.shape[0], hidden), dtype=np.float32)
        return run.run(None, {"x": x, "router": logits})[0][:, 0]

    sparse, plain = moe_weights(1), moe_weights(0)
    np.testing.assert_array_equal(sparse, plain)  # the attribute is ignored on CPU
    decode = 10.0 ** np.arange(experts)
    np.testing.assert_allclose(sparse, softmax_top2_reference(logits) @ decode, rtol=1e-5)
    assert np.abs(sparse - routing @ decode).max() > 0.1


def test_phimoe_rewritten_anyway_fails_verification_at_its_first_moe_node(tmp_path, monkeypatch):
    """Were the knowledge to claim that ORT CPU implements use_sparse_mixer, the rewrite would be written with it and
    the whole-model verification on the installed ORT would catch the routing difference."""
    import dataclasses

    import ortgate.fix.moe as moe
    import ortgate.graph.patterns.moe_anatomy as anatomy

    facts = moe_op_facts()
    claimed = dataclasses.replace(facts, sparse_mixer=dataclasses.replace(facts.sparse_mixer, cpu_implemented=True))
    monkeypatch.setattr(moe, "moe_op_facts", lambda: claimed)
    monkeypatch.setattr(anatomy, "moe_op_facts", lambda: claimed)  # where the rewrite's refusals are decided
    code, report = fix_json(DYNAMO_PHIMOE, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 1 and not report["written"] and not (tmp_path / "out").exists()
    assert [r["attributes"]["use_sparse_mixer"] for r in report["rewrites"]] == [1, 1]
    assert not report["verification"]["passed"]
    assert "first rewritten node whose output diverges: /model/layers.0/moe/MoE" in report["failure"]


def test_sparsemixer_band_is_read_from_the_graph(tmp_path):
    """A band other than the kernel's 2 x 0.01 is named in the refusal."""
    model = onnx.load(str(DYNAMO_PHIMOE))
    thresholds = {n.input[1] for n in model.graph.node if n.op_type == "Greater"}
    for tensor in model.graph.initializer:
        if tensor.name in thresholds:
            tensor.CopyFrom(numpy_helper.from_array(np.array(0.04, dtype=np.float32), tensor.name))
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] in thresholds:
            node.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(0.04, dtype=np.float32)))
    src = tmp_path / "phimoe.onnx"
    onnx.save(model, str(src))
    code, report = fix_json(src, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0 and len(report["refusals"]) == 2
    assert "jitter eps 0.02" in report["refusals"][0]["reason"]
    assert "this block has 4 experts and jitter eps 0.02" in report["refusals"][0]["reason"]
