"""`ortgate fix` rewrites sigmoid, bias-corrected, group-limited routing (DeepSeek-V3 `noaux_tc`, GLM-4.5-MoE) into
com.microsoft.MoEGroupRouter + MoE for a deployment on onnxruntime 1.32 or later (knowledge/ort_group_router.json),
and refuses it for an older one naming 1.32.0. The proof: the delivered folder, loaded from disk into plain
onnxruntime 1.32.0 sessions (ORTGATE_OTHER_ORT_PYTHON, scripts/ort_compare_models.py), computes what the original
does. Routings the pair does not compute (weights not renormalised, a mask that is not -inf) and routers no MoE node
can take (k <= 0, k > experts, a softmax on the wrong axis) are refused with the reason, with or without --no-verify.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from ortgate.knowledge.moe_op import parse_version
from tests.conftest import EXPORTED, REPO
from tests.test_fix import fix_json

COMPARE = REPO / "scripts" / "ort_compare_models.py"
CHECK = REPO / "scripts" / "ort_group_router_check.py"
DEEPSEEK = EXPORTED / "dynamo-deepseek_v3" / "model.onnx"  # n_group 2, topk_group 1, bias, scale 2.5
GLM = EXPORTED / "dynamo-glm4_moe" / "model.onnx"  # n_group 1, bias, no scale
CPU_132 = "name: t\nexecution_provider: {name: CPUExecutionProvider, onnxruntime_version: '1.32.0'}\n"
CPU_131 = "name: t\nexecution_provider: {name: CPUExecutionProvider, onnxruntime_version: '1.31.1'}\n"


def _ort132() -> str | None:
    """A Python whose onnxruntime has MoEGroupRouter (ORTGATE_OTHER_ORT_PYTHON), else None."""
    python = os.environ.get("ORTGATE_OTHER_ORT_PYTHON")
    if not python:
        return None
    done = subprocess.run([python, "-c", "import onnxruntime; print(onnxruntime.__version__)"], capture_output=True,
                          text=True, timeout=120, check=True)
    version = parse_version(done.stdout.strip())
    return python if version is not None and version >= (1, 32, 0) else None


needs_132 = pytest.mark.skipif(_ort132() is None, reason="ORTGATE_OTHER_ORT_PYTHON names no onnxruntime >= 1.32")


def _nodes(folder: Path, op: str) -> list[onnx.NodeProto]:
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    return [n for n in graph.node if n.op_type == op]


def _attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _compare_on_132(original: Path, fixed: Path) -> dict:
    python = _ort132()
    assert python is not None
    done = subprocess.run([python, str(COMPARE), str(original), str(fixed)], capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_equal_on_132(original: Path, fixed: Path) -> None:
    result = _compare_on_132(original, fixed)
    assert result["onnxruntime"].startswith("1.32") or parse_version(result["onnxruntime"]) >= (1, 32, 0)
    assert {"MoE", "MoEGroupRouter"} <= set(result["ops"])
    for step, seen in result["steps"].items():
        assert seen["max_rel"] < 1e-5 and seen["argmax_equal"], (step, seen)


@needs_132
def test_the_pair_computes_renormalised_sigmoid_weights_and_nothing_else():
    """What ort_group_router.json (with_moe) claims, run: MoEGroupRouter + MoE weight each picked expert by its
    sigmoid score over the sum of the picked scores, whatever normalize_routing_weights says; a router that does
    not renormalise computes another model (why fix refuses it)."""
    python = _ort132()
    assert python is not None
    done = subprocess.run([python, str(CHECK)], capture_output=True, text=True, timeout=300, check=True)
    errors = json.loads(done.stdout.strip().splitlines()[-1])["errors"]
    for normalize in (0, 1):
        assert errors[f"renormalised_n{normalize}"] < 1e-5
        assert errors[f"not_renormalised_n{normalize}"] > 1e-2


@needs_132
@pytest.mark.parametrize("model,scale,n_group", [(DEEPSEEK, 2.5, 2), (GLM, None, 1)], ids=["deepseek_v3", "glm4_moe"])
def test_fix_under_1_32_rewrites_group_routing_and_the_folder_equals_the_original_on_1_32(tmp_path, write_policy,
                                                                                        model, scale, n_group):
    python = _ort132()
    assert python is not None
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([python, "-m", "ortgate", "fix", str(model), "-o", str(out), "--select", "moe-not-fused",
                           "--policy", str(write_policy(CPU_132)), "--format", "json"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["written"] and report["verification"]["passed"] and not report["refusals"]
    (router,) = _nodes(out, "MoEGroupRouter")
    assert _attrs(router)["n_group"] == n_group and _attrs(router)["top_k"] == 2
    (moe,) = _nodes(out, "MoE")
    assert moe.input[1] == router.output[0] and _attrs(moe)["k"] == 2
    scaled = [n for n in _nodes(out, "Mul") if n.input[0] == moe.output[0]]
    assert len(scaled) == (1 if scale else 0)
    _assert_equal_on_132(model, out / "model.onnx")


@needs_132
def test_no_verify_here_writes_the_same_form_and_it_computes_right_on_1_32(tmp_path, write_policy):
    """The onnxruntime installed here may lack MoEGroupRouter: --no-verify writes for the deployment anyway."""
    out = tmp_path / "out"
    code, report = fix_json(DEEPSEEK, "-o", out, "--select", "moe-not-fused", "--no-verify", "--policy",
                            write_policy(CPU_132))
    assert code == 0 and report["written"], report
    assert len(_nodes(out, "MoEGroupRouter")) == 1
    _assert_equal_on_132(DEEPSEEK, out / "model.onnx")


def test_a_deployment_before_1_32_is_refused_naming_the_release_that_adds_moegrouprouter(tmp_path, write_policy):
    for policy, said in ((write_policy(CPU_131, "131.yaml"), "onnxruntime 1.31.1"),
                         (None, "names no onnxruntime release")):
        args = [DEEPSEEK, "-o", tmp_path / f"out-{said[:5]}", "--select", "moe-not-fused", "--no-verify"]
        code, report = fix_json(*args, *(["--policy", policy] if policy else []))
        assert code == 0 and not report["written"] and not report["rewrites"]
        (refusal,) = report["refusals"]
        assert "MoEGroupRouter" in refusal["reason"] and "1.32.0 adds" in refusal["reason"]
        assert said in refusal["reason"]


def test_verification_here_without_moegrouprouter_refuses_and_says_how_to_prove_it(tmp_path, write_policy):
    import onnxruntime as ort

    if parse_version(ort.__version__) >= (1, 32, 0):
        pytest.skip("the installed onnxruntime has MoEGroupRouter")
    code, report = fix_json(GLM, "-o", tmp_path / "out", "--select", "moe-not-fused", "--policy",
                            write_policy(CPU_132))
    assert code == 0 and not report["written"]
    (refusal,) = report["refusals"]
    assert "could not be proven here" in refusal["reason"] and "--no-verify" in refusal["reason"]


# ---- routings the pair does not compute, and routers no MoE node takes ---------------------------------------


def _mutated(tmp_path: Path, source: Path, change) -> Path:
    model = onnx.load(str(source))
    change(model)
    path = tmp_path / "in" / "model.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def _set_constant(model: onnx.ModelProto, node: onnx.NodeProto, position: int, value: np.ndarray) -> None:
    name = f"{node.name}/input{position}"
    model.graph.initializer.append(numpy_helper.from_array(value, name))
    node.input[position] = name


def _no_renormalisation(model: onnx.ModelProto) -> None:
    div = _node(model, "node_div")  # DeepSeek-V3 norm_topk_prob: gather / sum(gather); now gather / 1
    _set_constant(model, div, 1, np.array(1.0, dtype=np.float32))


def _zero_fill(model: onnx.ModelProto) -> None:
    _set_constant(model, _node(model, "node_masked_fill"), 1, np.array(0.0, dtype=np.float32))


def _inverted_mask(model: onnx.ModelProto) -> None:
    where = _node(model, "node_masked_fill")  # -inf in the chosen groups instead of outside them
    where.input[0] = _node(model, "node_bitwise_not").input[0]


def _gathered_biased(model: onnx.ModelProto) -> None:
    gather = _node(model, "node_gather")
    gather.input[0] = _node(model, "node_add_921").output[0]


def _expert_k(k: int):
    def change(model: onnx.ModelProto) -> None:
        _set_constant(model, _node(model, "node_topk_2__1"), 1, np.array([k], dtype=np.int64))
    return change


REFUSED = [
    (_no_renormalisation, "not renormalised"),
    (_zero_fill, "not -inf"),
    (_inverted_mask, "not built from the chosen groups"),
    (_gathered_biased, "bias-corrected scores"),
    (_expert_k(0), "k=0"),
    (_expert_k(5), "k=5 of 4"),
]


@pytest.mark.parametrize("change,why", REFUSED, ids=["not-renormalised", "zero-fill", "inverted-mask", "biased-weights", "k0",
                                                   "k5"])
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_what_the_pair_does_not_compute_is_refused_with_the_reason(tmp_path, write_policy, change, why, verify):
    source = _mutated(tmp_path, DEEPSEEK, change)
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out, "--select", "moe-not-fused", "--policy", write_policy(CPU_132),
                            *([] if verify else ["--no-verify"]))
    assert code == 0 and not report["written"] and not report["rewrites"], report
    (refusal,) = report["refusals"]
    assert why in refusal["reason"], refusal["reason"]
    assert not out.exists()


def _softmax_model(make_model, change) -> Path:
    path = make_model(layers=1, moe="dense_loop")
    model = onnx.load(str(path))
    change(model)
    onnx.save(model, str(path))
    return path


def _softmax_k(k: int):
    def change(model: onnx.ModelProto) -> None:
        topk = next(n for n in model.graph.node if n.op_type == "TopK")
        _set_constant(model, topk, 1, np.array([k], dtype=np.int64))
    return change


def _softmax_axis(model: onnx.ModelProto) -> None:
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax" and any(
        c.op_type == "TopK" for c in model.graph.node if n.output[0] in c.input))
    for a in softmax.attribute:
        if a.name == "axis":
            softmax.attribute.remove(a)
            break
    softmax.attribute.append(helper.make_attribute("axis", 0))


@pytest.mark.parametrize("change,why", [(_softmax_k(0), "k=0"), (_softmax_k(99), "k=99"),
                                        (_softmax_axis, "not over the expert axis")], ids=["k0", "k99", "axis"])
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_softmax_routers_no_moe_node_takes_are_refused(tmp_path, make_model, change, why, verify):
    source = _softmax_model(make_model, change)
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out, "--select", "moe-not-fused", *([] if verify else ["--no-verify"]))
    assert code == 0 and not report["rewrites"] and not out.exists(), report
    assert report["refusals"] and all(why in r["reason"] for r in report["refusals"]), report["refusals"]


def test_moe_not_fused_advice_follows_the_policys_release(write_policy):
    from tests.helpers import rule_findings

    (on_132,) = rule_findings(DEEPSEEK, "moe-not-fused", write_policy(CPU_132, "132.yaml"))
    assert on_132.fix.startswith("Run `ortgate fix MODEL -o OUT --policy P`") and "MoEGroupRouter" in on_132.fix
    (on_131,) = rule_findings(DEEPSEEK, "moe-not-fused", write_policy(CPU_131, "131.yaml"))
    assert "1.32.0 adds" in on_131.fix and "waive" in on_131.fix
    assert "onnxruntime 1.31.1" in on_131.fix
