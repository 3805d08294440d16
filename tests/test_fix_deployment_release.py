"""`ortgate fix` writes for the deployment's ONNX Runtime release (the policy's execution_provider), never for the
release installed where it runs: the CPU MoE in-place workaround (knowledge/ort_moe.json cpu_inplace_defect) stays
unless every provider that can run the node is known fixed in that release.

The reproduction: fix run under onnxruntime 1.32.0 (whose CPU MoE is right in place) wrote MoE nodes without the
workaround, and the delivered OLMoE computed logits more than their scale off on onnxruntime-gpu 1.31.1. With
ORTGATE_OTHER_ORT_PYTHON naming a Python with a fixed release, fix runs there and the folder it writes is run here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from ortgate.fix.inplace import KEEP_SUFFIX, needs_keep_alive
from ortgate.knowledge.moe_op import moe_op_facts
from tests.conftest import EXPORTED, REPO
from tests.test_fix import fix_json

OLMOE = EXPORTED / "dynamo-olmoe" / "model.onnx"  # normalize_routing_weights=0: the node the defect hits
DEFECT = moe_op_facts().inplace_defect
INSTALLED_AFFECTED = DEFECT.status(ort.__version__) != "fixed"


def _other_python_release() -> tuple[str, str] | None:
    python = os.environ.get("ORTGATE_OTHER_ORT_PYTHON")
    if not python:
        return None
    done = subprocess.run([python, "-c", "import onnxruntime; print(onnxruntime.__version__)"], capture_output=True,
                          text=True, timeout=120, check=True)
    return python, done.stdout.strip()


def _keep_alive_wheres(folder: Path) -> list[onnx.NodeProto]:
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    return [n for n in graph.node if n.op_type == "Where" and n.input[1].endswith(KEEP_SUFFIX)]


def _logits(path: Path, feeds: dict) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(["logits"], feeds)[0]


def _feeds() -> dict:
    rng = np.random.default_rng(0)
    return {"input_ids": rng.integers(0, 100, (2, 16)).astype(np.int64),
            "attention_mask": np.ones((2, 16), dtype=np.int64)}


def test_fix_under_a_fixed_release_writes_a_model_that_computes_right_on_an_affected_one(tmp_path):
    other = _other_python_release()
    if other is None:
        pytest.skip("ORTGATE_OTHER_ORT_PYTHON names no other Python with onnxruntime")
    python, release = other
    if DEFECT.status(release) != "fixed" or not INSTALLED_AFFECTED:
        pytest.skip(f"needs fix under a release with the CPU MoE right in place ({release} there) and an affected "
                    f"one here ({ort.__version__})")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([python, "-m", "ortgate", "fix", str(OLMOE), "-o", str(out), "--select", "moe-not-fused",
                           "--format", "json"], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    feeds = _feeds()
    want, got = _logits(OLMOE, feeds), _logits(out / "model.onnx", feeds)
    assert np.abs(want - got).max() / np.abs(want).max() < 1e-4
    assert (want.argmax(-1) == got.argmax(-1)).all()
    report = json.loads(done.stdout)
    assert report["onnxruntime"]["installed"] == release
    assert report["onnxruntime"]["written_for"]["release"] is None
    assert report["onnxruntime"]["written_for"]["inplace_workaround"] is True
    assert len(_keep_alive_wheres(out)) == 2


def test_the_deployment_decides_the_workaround_not_the_installed_release(tmp_path, write_policy):
    def policy(provider: str, release: str | None) -> Path:
        pinned = f", onnxruntime_version: '{release}'" if release else ""
        return write_policy(f"name: t\nexecution_provider: {{name: {provider}{pinned}}}\n",
                            f"{provider}-{release}.yaml")

    cases = [  # (policy, workaround written)
        (None, True),  # no release named: written for any
        (policy("CPUExecutionProvider", "1.31.1"), True),
        (policy("CPUExecutionProvider", None), True),
        (policy("CUDAExecutionProvider", "1.32.0"), True),  # the CUDA kernel is not known right in place
        (policy("CPUExecutionProvider", "1.32.0"), False),
    ]
    for i, (given, kept) in enumerate(cases):
        out = tmp_path / f"out{i}"
        args = [OLMOE, "-o", out, "--select", "moe-not-fused"] + (["--policy", given] if given else [])
        code, report = fix_json(*args)
        assert code == 0, (given, report.get("failure"))
        assert len(_keep_alive_wheres(out)) == (2 if kept else 0), given
        written_for = report["onnxruntime"]["written_for"]
        assert written_for["inplace_workaround"] is kept
        v = report["verification"]
        assert v["passed"]
        # Written without the workaround for 1.32.0, verified here on an affected release: run with the inputs kept
        # alive, and the verdict says what that leaves unchecked.
        twin = not kept and INSTALLED_AFFECTED
        assert report["onnxruntime"]["verified_with_keep_alive"] is twin
        assert any("memory plan" in n for n in v["not_checked"]) is twin
        if not kept and INSTALLED_AFFECTED:  # what the deployment runs right would be wrong on this release
            feeds = _feeds()
            want, got = _logits(OLMOE, feeds), _logits(out / "model.onnx", feeds)
            assert np.abs(want - got).max() / np.abs(want).max() > 1e-2


def test_the_report_names_the_release_it_wrote_for(tmp_path, write_policy, capsys):
    from ortgate.cli import main

    policy = write_policy("name: t\nexecution_provider: {name: CUDAExecutionProvider, onnxruntime_version: '1.32.0'}\n")
    assert main(["fix", str(OLMOE), "-o", str(tmp_path / "a"), "--select", "moe-not-fused", "--no-verify",
                 "--policy", str(policy)]) == 0
    text = capsys.readouterr().out
    assert "written for: onnxruntime 1.32.0 on CUDAExecutionProvider: MoE inputs kept alive past the node" in text
    assert main(["fix", str(OLMOE), "-o", str(tmp_path / "b"), "--select", "moe-not-fused", "--no-verify"]) == 0
    text = capsys.readouterr().out
    assert "written for: any onnxruntime release (the policy names none): MoE inputs kept alive" in text
    assert "execution_provider.onnxruntime_version" in text


def test_keep_decision_reads_release_and_provider():
    assert needs_keep_alive(None, "CPUExecutionProvider").keep
    assert needs_keep_alive("1.31.1", "CPUExecutionProvider").keep
    assert needs_keep_alive("1.29.0", "CPUExecutionProvider").keep
    assert needs_keep_alive("1.32.0", None).keep
    cuda = needs_keep_alive("1.32.0", "CUDAExecutionProvider")
    assert cuda.keep and "CUDA" in cuda.reason
    assert not needs_keep_alive("1.32.0", "CPUExecutionProvider").keep
    assert not needs_keep_alive("1.33.1", "CPUExecutionProvider").keep
    assert needs_keep_alive("not a version", "CPUExecutionProvider").keep


def test_a_release_that_is_not_one_is_bad_input_naming_the_key(tmp_path, write_policy, capsys):
    from ortgate.cli import main

    policy = write_policy("name: t\nexecution_provider: {name: CPUExecutionProvider, onnxruntime_version: 'banana'}\n")
    code = main(["fix", str(OLMOE), "-o", str(tmp_path / "out"), "--policy", str(policy)])
    err = capsys.readouterr().err
    assert code == 2 and "execution_provider.onnxruntime_version" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
