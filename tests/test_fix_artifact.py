"""`ortgate fix` proves the folder it delivers: the written model.onnx and its external data loaded from disk into
plain ORT CPU sessions (no added outputs, the policy's session options), at several steps. And, independently of
fix's own verifier, no output of `fix` on a committed real MoE export computes differently from its original when
both are loaded from disk into fresh plain sessions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortgate.fix.inplace import KEEP_SUFFIX, KeepDecision
from ortgate.graph import build_graph
from ortgate.graph.load import load_model
from ortgate.knowledge.moe_op import moe_op_facts
from ortgate.runner.inputs import graph_signature, resolve_dims, synthesize, token_inputs
from ortgate.runner.settings import RunnerSettings
from tests.conftest import EXPORTED
from tests.test_fix import fix_json

# Every committed real export `fix` rewrites MoE in (the others have nothing it rewrites, or are refused).
REAL_MOE_EXPORTS = ("dynamo-mixtral", "dynamo-qwen2_moe", "dynamo-olmoe", "dynamo-qwen3_moe",
                    "dynamo-qwen3_moe-ortfusions", "olive-mixtral", "optimum-qwen3_moe-past")
AFFECTED = moe_op_facts().inplace_defect.affects(ort.__version__)


def _plain(path: Path, level: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _feeds(model: Path, batch: int, tokens: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    graph = build_graph(load_model(model), str(model))
    signature = graph_signature(graph)
    dims, step = resolve_dims(signature, RunnerSettings(batch_size=batch, sequence_length=tokens,
                                                        past_sequence_length=past), {},
                              window=None, head=None, policy_file=None)
    return synthesize(signature, dims, step, token_inputs(graph, None), seed=seed).arrays


def _present_to_past(session: ort.InferenceSession, outputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return {n.replace("present", "past_key_values", 1): v for n, v in zip(names, outputs) if n.startswith("present")}


def _logits_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b).max() / np.abs(b).max())


@pytest.mark.parametrize("folder", REAL_MOE_EXPORTS)
def test_fix_output_computes_as_its_original_in_plain_sessions_at_every_step(tmp_path, folder):
    model = EXPORTED / folder / "model.onnx"
    out = tmp_path / "out"
    code, report = fix_json(model, "-o", out)
    assert code == 0, report.get("failure")
    assert report["rewrites"], "the export is expected to have MoE blocks fix rewrites"
    fixed = out / "model.onnx"
    has_cache = any(i.name.startswith("past") for i in onnx.load(str(model), load_external_data=False).graph.input)
    for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
        original, rewritten = _plain(model, level), _plain(fixed, level)
        for batch, tokens in ((1, 1), (1, 16), (2, 1), (2, 16)):
            feeds = _feeds(model, batch, tokens, 0)
            want, got = original.run(None, feeds), rewritten.run(None, feeds)
            assert _logits_rel(got[0], want[0]) < 1e-5, (level, batch, tokens)
            if has_cache and tokens > 1:
                decode = _feeds(model, batch, 1, tokens, seed=1)
                step_want = original.run(None, {**decode, **_present_to_past(original, want)})
                step_got = rewritten.run(None, {**decode, **_present_to_past(rewritten, got)})
                assert _logits_rel(step_got[0], step_want[0]) < 1e-5, (level, batch, "decode")
    steps = report["verification"]["steps"]
    assert len(steps) >= 4 and all(s["passed"] for s in steps)
    assert any("decode" in s["step"] or "KV cache" in s["step"] for s in steps) == has_cache


def test_the_proof_fails_when_the_written_expert_bytes_are_altered(tmp_path, monkeypatch, capsys):
    """One expert's fc1 bytes altered in the staged external data, after writing and before verifying: the proof
    runs on those bytes, so fix exits 1 and leaves no OUT."""
    import ortgate.fix.pipeline as pipeline

    def alter(staged):
        model = onnx.load(str(staged.model_file), load_external_data=False)
        moe = next(n for n in model.graph.node if n.op_type == "MoE")
        tensor = next(t for t in model.graph.initializer if t.name == moe.input[2])
        info = {e.key: e.value for e in tensor.external_data}
        data = staged.folder / info["location"]
        offset = int(info.get("offset", 0))
        expert = int(info["length"]) // tensor.dims[0]
        with open(data, "r+b") as f:  # expert 1 of layer 0 gets expert 0's weights, negated
            f.seek(offset)
            first = np.frombuffer(f.read(expert), dtype=np.float32)
            f.seek(offset + expert)
            f.write((-first).tobytes())

    monkeypatch.setattr(pipeline, "after_write", alter)
    out = tmp_path / "out"
    code = pipeline_main(["fix", str(EXPORTED / "dynamo-mixtral" / "model.onnx"), "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 1 and "verification failed" in text and "DIFFERS" in text
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "ortgate-tmp" in p.name]


@pytest.mark.skipif(not AFFECTED, reason="the installed onnxruntime computes the in-place MoE case right")
def test_the_proof_sees_ort_miscompute_the_model_as_delivered(tmp_path, monkeypatch, capsys):
    """Without the keep-alive form, the rewritten Qwen2-MoE is right node by node but wrong as delivered on an
    affected release: the plain sessions see it (a verifier with probe outputs did not), nothing is written, and the
    report says the result depends on ORT's memory plan."""
    import ortgate.fix.pipeline as pipeline

    monkeypatch.setattr(pipeline, "needs_keep_alive", lambda release, provider: KeepDecision(False, release, provider, "t"))
    monkeypatch.setattr(pipeline, "_installed_affected", lambda result: False)  # the delivered file itself is run
    out = tmp_path / "out"
    code = pipeline_main(["fix", str(EXPORTED / "dynamo-qwen2_moe" / "model.onnx"), "-o", str(out)])
    text = capsys.readouterr().out
    assert code == 1 and "verification failed" in text and "memory plan" in text
    assert not out.exists()


def test_affected_releases_get_the_keep_alive_form_and_fixed_ones_do_not(tmp_path, write_policy):
    model = EXPORTED / "dynamo-qwen2_moe" / "model.onnx"  # normalize_routing_weights=0 (softmax -> top-k)
    code, report = fix_json(model, "-o", tmp_path / "out", "--select", "moe-not-fused")
    assert code == 0, report.get("failure")
    wheres = [n for n in onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph.node
              if n.op_type == "Where" and n.input[1].endswith(KEEP_SUFFIX)]
    # No policy: written for any release, whatever is installed here.
    assert len(wheres) == 2
    assert all("kept alive" in " ".join(r["notes"]) for r in report["rewrites"])
    # A CPU deployment on a release seen fixed lifts the guard, whatever release is installed here.
    policy = write_policy("name: t\nexecution_provider: {name: CPUExecutionProvider, onnxruntime_version: '1.32.0'}\n")
    code, report = fix_json(model, "-o", tmp_path / "out2", "--select", "moe-not-fused", "--policy", policy)
    assert code == 0 and not any("kept alive" in " ".join(r["notes"]) for r in report["rewrites"])
    # Mixtral renormalises the top-k (normalize_routing_weights=1): the kernel copies its input first, no guard.
    code, report = fix_json(EXPORTED / "dynamo-mixtral" / "model.onnx", "-o", tmp_path / "mix", "--select",
                            "moe-not-fused")
    assert code == 0 and not [n for n in onnx.load(str(tmp_path / "mix" / "model.onnx"),
                                                   load_external_data=False).graph.node
                                   if n.op_type == "Where" and n.input[1].endswith(KEEP_SUFFIX)]


def test_verification_uses_the_policys_session_options_and_its_pinned_shapes(tmp_path, write_policy):
    policy = write_policy("name: t\nexecution_provider: {name: CPUExecutionProvider}\n"
                          "session:\n  graph_optimization_level: ORT_ENABLE_BASIC\n"
                          "  free_dimension_overrides: {batch_size: 1}\n")
    code, report = fix_json(EXPORTED / "dynamo-qwen3_moe" / "model.onnx", "-o", tmp_path / "out", "--policy", policy)
    assert code == 0, report.get("failure")
    v = report["verification"]
    assert "ORT_ENABLE_BASIC" in v["session"]
    assert [s["step"] for s in v["steps"]] == ["batch 1, 1 new token", "batch 1, 16 new tokens"]
    assert len(v["not_checked"]) == 2 and all("pinned" in n for n in v["not_checked"])


def pipeline_main(argv: list[str]) -> int:
    from ortgate.cli import main

    return main(argv)


def test_lint_tells_a_cpu_deployment_on_an_affected_release_about_the_unguarded_form(tmp_path, monkeypatch,
                                                                                     write_policy):
    """moe-cpu-kernel-miscomputes fires on each MoE layer of the rewrite written without the keep-alive form (what
    the fix without it delivered) and not on what fix delivers now."""
    import ortgate.fix.pipeline as pipeline
    from tests.helpers import rule_findings

    policy = write_policy("name: t\nexecution_provider: {name: CPUExecutionProvider, onnxruntime_version: '1.31.1'}\n")
    model = EXPORTED / "dynamo-qwen2_moe" / "model.onnx"
    assert fix_json(model, "-o", tmp_path / "guarded", "--select", "moe-not-fused", "--no-verify")[0] == 0
    monkeypatch.setattr(pipeline, "needs_keep_alive", lambda release, provider: KeepDecision(False, release, provider, "t"))
    assert fix_json(model, "-o", tmp_path / "plain", "--select", "moe-not-fused", "--no-verify")[0] == 0
    found = rule_findings(tmp_path / "plain" / "model.onnx", "moe-cpu-kernel-miscomputes", policy)
    assert [f.layer for f in found] == [0, 1]  # one finding per layer, each about its own MoE node
    assert all(dict(f.properties)["nodes"] == 1 and "1.31.1" in f.message for f in found)
    assert not rule_findings(tmp_path / "guarded" / "model.onnx", "moe-cpu-kernel-miscomputes", policy)


def test_per_block_verification_of_a_normalize_0_export_passes_and_says_what_it_did_not_check(tmp_path,
                                                                                              monkeypatch):
    """When the original's session does not build within the limit, the fusions are proven against the MoE-only
    stage: that reference gets the keep-alive form too, or ORT's defect in it would fail a correct rewrite."""
    import ortgate.fix.verify as verify

    monkeypatch.setattr(verify, "SESSION_BUILD_LIMIT_S", 0.001)
    code, report = fix_json(EXPORTED / "dynamo-qwen2_moe" / "model.onnx", "-o", tmp_path / "out")
    assert code == 0, report.get("failure")
    v = report["verification"]
    assert v["passed"] and v["mode"] == "per block" and v["not_checked"]
