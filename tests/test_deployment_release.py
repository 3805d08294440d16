"""The deployment's ONNX Runtime release has one source: `--ort-version`, else the policy's
`execution_provider.onnxruntime_version`, else the release ortgate assumes in every install (knowledge/
ort_releases.json). The same model and policy give byte-identical reports whatever onnxruntime is installed: here the
linter-only install is simulated by running ortgate in a subprocess where `import onnxruntime` fails and
importlib.metadata finds no onnxruntime package, the `[gpu]` install is this test environment's onnxruntime-gpu, and
the `[cpu]` install is ORTGATE_OTHER_ORT_PYTHON's onnxruntime (1.32.0) when that Python also has the linter's
dependencies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import onnx
import onnx.parser
import pytest

from ortgate.knowledge.releases import assumed_release, covered_range
from tests.conftest import REPO
from tests.helpers import run_cli

MOE_TEXT = """
<ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
moe_layer (float[T, 8] h, float[T, 8] residual) => (float[T, 8] y)
<float[8, 4] router_w, float[4, 32, 8] fc1, float[4, 8, 16] fc2, float[8] norm_w>
{
  x = Mul(h, norm_w)
  logits = MatMul(x, router_w)
  moe = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 0>(
      x, logits, fc1, , fc2)
  y = Add(moe, residual)
}
"""

# Run ortgate as the linter-only install would: no onnxruntime module, no onnxruntime distribution.
BLOCKED = r"""
import importlib.abc, importlib.metadata as md, runpy, sys

class _NoOrt(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None

sys.meta_path.insert(0, _NoOrt())
_version, _distribution = md.version, md.distribution

def _no_ort(name):
    if name.replace("_", "-").lower().startswith("onnxruntime"):
        raise md.PackageNotFoundError(name)

def version(name):
    _no_ort(name)
    return _version(name)

def distribution(name):
    _no_ort(name)
    return _distribution(name)

md.version, md.distribution = version, distribution
sys.argv = ["ortgate", *sys.argv[1:]]
runpy.run_module("ortgate", run_name="__main__")
"""

POLICY = "name: cpu\nexecution_provider: {name: CPUExecutionProvider%s}\n"


@pytest.fixture
def moe_model(tmp_path) -> Path:
    path = tmp_path / "model.onnx"
    onnx.save(onnx.parser.parse_model(MOE_TEXT), path)
    return path


def _lint(python: str, *args: str | Path, blocked: bool = False) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [python, "-c", BLOCKED] if blocked else [python, "-m", "ortgate"]
    done = subprocess.run([*command, "lint", *map(str, args), "--format", "json"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, done.stdout


def _other_python_with_linter() -> str | None:
    other = os.environ.get("ORTGATE_OTHER_ORT_PYTHON")
    if not other:
        return None
    done = subprocess.run([other, "-c", "import onnx, yaml, jsonschema, rich, google.protobuf"], capture_output=True)
    return other if done.returncode == 0 else None


@pytest.mark.parametrize("pin", ["", ", onnxruntime_version: '1.31.1'", ", onnxruntime_version: '1.32.0'"])
def test_the_same_model_and_policy_give_the_same_report_in_every_install(moe_model, tmp_path, pin):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY % pin)
    installed = _lint(sys.executable, moe_model, "--policy", policy)
    linter_only = _lint(sys.executable, moe_model, "--policy", policy, blocked=True)
    assert linter_only == installed
    other = _other_python_with_linter()
    if other is not None:
        assert _lint(other, moe_model, "--policy", policy) == installed
    # without a pin the assumed release decides, and the finding says which and how to pin it
    if not pin:
        assert installed[0] == 1 and "OGK006" in installed[1]
        assert f"ortgate assumes {assumed_release()}" in installed[1]
        assert "execution_provider.onnxruntime_version" in installed[1]
    elif "1.32.0" in pin:
        assert "OGK006" not in installed[1]


def test_ort_version_flag_judges_the_deployment_on_another_release(moe_model, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY % ", onnxruntime_version: '1.31.1'")
    code, out, _ = run_cli("lint", moe_model, "--policy", policy, "--select", "OGK006")
    assert code == 1 and "OGK006" in out
    code, out, _ = run_cli("lint", moe_model, "--policy", policy, "--select", "OGK006", "--ort-version", "1.32.0")
    assert code == 0 and "OGK006" not in out
    code, out, _ = run_cli("lint", moe_model, "--policy", policy, "--select", "OGK006", "--ort-version", "1.30.0")
    assert code == 1 and "onnxruntime 1.30.0 (--ort-version" in out


@pytest.mark.parametrize("value, problem", [
    ("abc", "is not an ONNX Runtime release"),
    ("1.19.2", "is older than ortgate's knowledge covers"),
])
def test_a_release_that_is_not_one_or_too_old_is_bad_input(moe_model, tmp_path, value, problem):
    oldest, newest = covered_range()
    policy = tmp_path / "policy.yaml"
    if value[0].isdigit():
        policy.write_text(POLICY % f", onnxruntime_version: '{value}'")
        code, out, err = run_cli("lint", moe_model, "--policy", policy)
        assert code == 2 and "execution_provider.onnxruntime_version" in err and str(policy) in err
        assert problem in err and f"{oldest} to {newest}" in err and "Traceback" not in err
    policy.write_text(POLICY % "")
    code, out, err = run_cli("lint", moe_model, "--policy", policy, "--ort-version", value)
    assert code == 2 and "--ort-version" in err and problem in err and f"{oldest} to {newest}" in err
    assert len(err.strip().splitlines()) == 1


def test_a_release_newer_than_the_knowledge_is_judged_by_the_newest_known_and_says_so(moe_model, tmp_path):
    newest = covered_range()[1]
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY % "")
    code, out, err = run_cli("lint", moe_model, "--policy", policy, "--select", "OGS007", "--ort-version", "9.1.0",
                             "--format", "json")
    assert code == 0 and f"onnxruntime 9.1.0 is newer than ortgate's knowledge covers; judged as {newest}" in err
    from ortgate.config.deployment import resolve_release

    ort = resolve_release(None, "9.1.0")
    assert ort.judged_as == newest and f"judged as {newest}" in ort.origin


UPGRADE_MODEL = """
<ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
moe_layer (float[T, 8] h, float[T, 8] residual, float[T, 8] lg) => (float[T, 8] y, float[T, 8] p)
<float[8, 4] router_w, float[4, 32, 8] fc1, float[4, 8, 16] fc2, float[8] norm_w, float[8] bias>
{
  x = Mul(h, norm_w)
  logits = MatMul(x, router_w)
  moe = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 0>(
      x, logits, fc1, , fc2)
  y = Add(moe, residual)
  p = com.microsoft.MoEGroupRouter<top_k = 2, n_group = 2, topk_group = 1>(lg, bias)
}
"""


def test_upgrade_lists_what_changes_between_two_releases(tmp_path):
    model = tmp_path / "model.onnx"
    onnx.save(onnx.parser.parse_model(UPGRADE_MODEL), model)
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: cpu\nexecution_provider: {name: CPUExecutionProvider}\nsession:\n  config_entries:\n"
                      "    session.moe.offload.gpu_budget_byte: '1'\n")
    code, out, err = run_cli("upgrade", model, "--policy", policy, "--to", "1.32.0", "--format", "json")
    assert code == 1, err  # the misspelt offload key is refused on 1.32.0
    import json

    report = json.loads(out)
    assert report["from"]["onnxruntime"] == assumed_release() and report["to"]["onnxruntime"] == "1.32.0"
    assert [e["code"] for e in report["appear"]] == ["OGS013"]
    gone = {e["code"] for e in report["disappear"]}
    assert {"OGK006", "OGX010", "OGS007"} <= gone  # the CPU MoE defect fixed, MoEGroupRouter known, key read
    assert any(k["prefix"] == "session.moe.offload." for k in report["config_keys_added"])
    code, out, err = run_cli("upgrade", model, "--policy", policy, "--to", "1.32.0", "--from", "1.32.0")
    assert code == 2 and "same release" in err
    code, out, err = run_cli("upgrade", model, "--policy", policy, "--to", "1.2")
    assert code == 2 and "--to:" in err and "older than" in err


def test_run_says_when_the_installed_release_differs_from_the_deployments(moe_model, tmp_path):
    import onnxruntime

    from ortgate.engine.pipeline import LintRequest, load_inputs
    from ortgate.runner.collect import release_note, start_evidence

    policy = tmp_path / "policy.yaml"
    installed = onnxruntime.__version__
    other = "1.32.0" if installed != "1.32.0" else "1.31.1"
    policy.write_text(POLICY % f", onnxruntime_version: '{other}'")
    inputs = load_inputs(LintRequest(str(moe_model), str(policy)))
    note = release_note(inputs)
    assert note is not None and f"measured on onnxruntime {installed}" in note and f"judge onnxruntime {other}" in note
    assert note in start_evidence(inputs).notes
    policy.write_text(POLICY % f", onnxruntime_version: '{installed}'")
    assert release_note(load_inputs(LintRequest(str(moe_model), str(policy)))) is None


def test_a_compared_base_is_judged_on_the_models_release(moe_model, tmp_path):
    from ortgate.engine.compare import load_base
    from ortgate.engine.pipeline import LintRequest, load_inputs

    base = tmp_path / "base.onnx"
    base.write_bytes(moe_model.read_bytes())
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY % "")
    model = load_inputs(LintRequest(str(moe_model), str(policy), ort_version="1.32.0"))
    assert load_base(str(base), model, str(policy)).deployment.ort.version == "1.32.0"
    model = load_inputs(LintRequest(str(moe_model), str(policy)))
    assert load_base(str(base), model, str(policy)).deployment.ort == model.deployment.ort


def test_the_report_says_which_release_it_assumed_and_how_to_pin_it(moe_model, tmp_path):
    import json

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY % "")
    code, out, _ = run_cli("lint", moe_model, "--policy", policy, "--format", "json")
    release = json.loads(out)["inputs"]["deployment"]["onnxruntime_version"]
    assert release == {"version": assumed_release(), "source": "assumed", "assumed": True,
                       "judged_as": assumed_release(),
                       "pin": "execution_provider.onnxruntime_version or --ort-version"}
    code, out, _ = run_cli("lint", moe_model, "--policy", policy)
    assert (f"release: onnxruntime {assumed_release()}, assumed (pin it with "
            "execution_provider.onnxruntime_version or --ort-version)") in out
    # pinned (in the policy or by --ort-version): the JSON says where from, the text report adds no line
    policy.write_text(POLICY % ", onnxruntime_version: '1.32.0'")
    code, out, _ = run_cli("lint", moe_model, "--policy", policy, "--format", "json")
    release = json.loads(out)["inputs"]["deployment"]["onnxruntime_version"]
    assert release["assumed"] is False and release["source"] == "policy" and release["version"] == "1.32.0"
    assert release["pin"] is None
    code, out, _ = run_cli("lint", moe_model, "--policy", policy, "--ort-version", "1.30.0")
    assert "release: onnxruntime" not in out
