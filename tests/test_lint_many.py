"""Several models in one call (`ortgate lint A B C`, globs): one combined report, one exit code; and the
pre-commit hook that passes every staged model to that call."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import EXAMPLES, POLICIES, REPO
from tests.helpers import run_cli

POLICY = POLICIES / "tiny-moe-cpu.yaml"
SELECT = ("--select", "moe-not-fused,gqa-not-fused,OGW")


@pytest.fixture
def models(tmp_path):
    for name in ("qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused"):
        shutil.copytree(EXAMPLES / name, tmp_path / "models" / name)
    return tmp_path / "models"


def json_report(*argv) -> tuple[int, dict]:
    code, out, err = run_cli("lint", *argv, "--format", "json")
    assert err == "", err
    return code, json.loads(out)


def test_one_failing_model_fails_the_combined_gate_and_every_model_is_reported(models):
    fused, unfused = models / "qwen3-moe-tiny-fused", models / "qwen3-moe-tiny-unfused"
    code_fused, alone = json_report(fused, "--policy", POLICY, *SELECT)
    code_unfused, other = json_report(unfused, "--policy", POLICY, *SELECT)
    assert (code_fused, code_unfused) == (0, 1)
    code, both = json_report(fused, unfused, "--policy", POLICY, *SELECT)
    assert code == 1 and both["verdict"]["passed"] is False
    assert [m["model"] for m in both["inputs"]["models"]] == [str(fused / "model.onnx"), str(unfused / "model.onnx")]
    assert both["inputs"]["nodes"] == alone["inputs"]["nodes"] + other["inputs"]["nodes"]

    def key(f):
        return (f["code"], f["file"], f["node"], f["key_path"], f["message"])

    # Every finding of each model, once: a fact about the shared policy is not repeated per model.
    assert sorted(map(key, both["findings"])) == sorted(set(map(key, alone["findings"] + other["findings"])))
    assert both["verdict"]["counts"]["error"] == len([f for f in both["findings"] if f["severity"] == "error"])


def test_a_quoted_glob_is_expanded_and_a_glob_matching_nothing_is_an_error(models, tmp_path):
    code, report = json_report(str(models / "*" / "model.onnx"), "--policy", POLICY, *SELECT)
    assert code == 1 and len(report["inputs"]["models"]) == 2
    code, report = json_report(str(models / "**" / "*.onnx"), str(models / "qwen3-moe-tiny-fused"),
                               "--policy", POLICY, *SELECT)
    assert len(report["inputs"]["models"]) == 2  # each model once, however it is named
    code, out, err = run_cli("lint", str(tmp_path / "nowhere" / "*.onnx"))
    assert (code, out) == (2, "") and "no file or folder matches this pattern" in err and err.count("\n") == 1


def test_the_text_report_says_how_many_models_and_a_waiver_is_unused_only_if_no_model_uses_it(models, tmp_path):
    policy = tmp_path / "waivers.yaml"
    policy.write_text(f"name: w\nextends: {POLICY}\nwaivers:\n"
                      "  - {rule: moe-not-fused, node: 'model.layers.0.*', reason: tracked}\n")
    code, out, err = run_cli("lint", models / "qwen3-moe-tiny-fused", models / "qwen3-moe-tiny-unfused",
                             "--policy", policy, *SELECT)
    assert code == 1 and err == ""
    assert "(2 models, " in out.splitlines()[-1]
    assert "waiver-unused" not in out  # the unfused model uses it; the fused one alone would not
    code, out, _ = run_cli("lint", models / "qwen3-moe-tiny-fused", "--policy", policy, *SELECT)
    assert "waiver-unused" in out


def test_optimized_and_config_belong_to_one_model(models):
    for flag in ("--optimized", "--config"):
        code, out, err = run_cli("lint", models / "qwen3-moe-tiny-fused", models / "qwen3-moe-tiny-unfused",
                                 flag, models / "qwen3-moe-tiny-fused" / "model.onnx")
        assert code == 2 and f"{flag} belongs to one model" in err


def test_no_output_replaces_any_of_the_models(models):
    target = models / "qwen3-moe-tiny-unfused" / "model.onnx"
    before = target.read_bytes()
    code, _, err = run_cli("lint", models / "qwen3-moe-tiny-fused", models / "qwen3-moe-tiny-unfused",
                           "--sarif", target)
    assert code == 2 and "refusing to write the SARIF report over an input file" in err
    assert target.read_bytes() == before


def test_the_pre_commit_hook_lints_the_models_it_names_in_one_call(models):
    [hook] = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "ortgate-lint" and hook["language"] == "python" and hook["pass_filenames"] is False
    assert hook["entry"].split()[0] in _console_scripts()
    assert "rev: v" not in (REPO / ".pre-commit-hooks.yaml").read_text()  # no release tag exists yet
    import re

    # A commit that changes a model, only the policy, or only a genai_config.json runs the hook.
    changed = [models / "qwen3-moe-tiny-fused" / "model.onnx", POLICY, models / "qwen3-moe-tiny-fused" / "genai_config.json"]
    assert all(re.search(hook["files"], str(p)) for p in changed)
    assert not re.search(hook["files"], "src/train.py")
    # pre-commit runs `entry args...` (no file names): the args name the models, a quoted glob for several.
    argv = [sys.executable, "-m", "ortgate", *hook["entry"].split()[1:], str(models / "*" / "model.onnx"),
            "--policy", str(POLICY), *SELECT]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the unfused model fails the commit
    assert "(2 models, " in proc.stdout.splitlines()[-1]


def _console_scripts() -> set[str]:
    import tomllib

    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
