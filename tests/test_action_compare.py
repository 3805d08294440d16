"""The Action's compare-ref on a real git repository made here: two commits of a model (fused -> unfused, and
unfused -> fused), the Action's steps run locally as tests/test_action.py runs them, the job summary's comparison
table and its Mermaid chart checked; no comparison where there is nothing to compare with, said in the summary."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO
from tests.test_action import run_action
from tests.test_compare import MERMAID_BLOCK, _mermaid_cli, check_xychart, mermaid_renders

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_SYSTEM": os.devnull}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env={**os.environ, **GIT_ENV},
                          check=True)
    return done.stdout


def put_model(repo: Path, example: str) -> None:
    """models/qwen holds this example's files (and only them)."""
    target = repo / "models" / "qwen"
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(EXAMPLES / example, target)


def two_commits(tmp_path: Path, before: str, after: str, policy: str | None = None) -> Path:
    """A repository whose `main` holds `before` at models/qwen and whose checked-out branch `change` holds `after`."""
    repo = tmp_path / "workspace"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    (repo / "deploy").mkdir()
    (repo / "deploy" / "policy.yaml").write_text(policy or (REPO / "policies" / "tiny-moe-cpu.yaml").read_text())
    put_model(repo, before)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the model")
    git(repo, "checkout", "-q", "-b", "change")
    put_model(repo, after)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the change")
    return repo


def pull_request(repo: Path, tmp_path: Path, **inputs: str):
    return run_action({"model": "models/qwen", "policy": "deploy/policy.yaml", "python": sys.executable, **inputs},
                      repo, tmp_path / "run", github={"base_ref": "main", "event_name": "pull_request"})


def chart_of(summary: str) -> dict:
    (block,) = MERMAID_BLOCK.findall(summary)
    return check_xychart(block)


@pytest.mark.parametrize(("before", "after"), [("qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused"),
                                               ("qwen3-moe-tiny-unfused", "qwen3-moe-tiny-fused")])
def test_a_pull_request_is_compared_with_its_base_branch(tmp_path, before, after):
    repo = two_commits(tmp_path, before, after)
    head = git(repo, "rev-parse", "HEAD")
    run = pull_request(repo, tmp_path, sarif="")  # no SARIF: the step then writes nothing into the workspace
    slower = after.endswith("unfused")
    assert run.exit_code == (1 if slower else run.exit_code), run.steps[-1]["stderr"]
    summary = run.summary
    assert "### Compared with `main:models/qwen`" in summary
    # the fused example brings its genai_config.json (whose CUDA provider drifts from the CPU policy): both ways,
    # findings appear and disappear
    assert "| Findings that appeared |" in summary and "| Findings that disappeared |" in summary
    section = summary[summary.index("### Compared with"):]
    appeared = section[section.index("| Findings that appeared |"):section.index("| Findings that disappeared |")]
    disappeared = section[section.index("| Findings that disappeared |"):].split("\n\n")[0]
    assert ("`OGF001` moe-not-fused" in appeared) == slower and ("`OGF001` moe-not-fused" in disappeared) != slower
    assert ("`OGC001` config-drift" in disappeared) == slower
    chart = chart_of(summary)
    assert "attention base" in chart["x"] and "moe change" in chart["x"]
    change = re.search(r"\| tokens/s \(expected\) \| [\d,]+ \| [\d,]+ \| ([+-][\d.]+)% \|", summary)
    assert change and (float(change.group(1)) < 0) == slower
    # nothing written into the repository: no file changed, none added, HEAD where it was
    assert git(repo, "status", "--porcelain") == "" and git(repo, "rev-parse", "HEAD") == head
    assert not (repo / "ortgate-base").exists()


def test_max_regression_fails_the_step_on_the_slower_change(tmp_path):
    policy = (REPO / "policies" / "tiny-moe-cpu.yaml").read_text().replace(
        "throughput:\n  device: cpu\n", "throughput:\n  device: cpu\n  max_regression: 0.05\n")
    repo = two_commits(tmp_path, "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused", policy)
    run = pull_request(repo, tmp_path, args="--select throughput-regression")
    assert run.exit_code == 1 and run.outputs["errors"] == "1"
    assert "`OGT006` throughput-regression" in run.summary
    assert "dropped 81.0% against the base main:models/qwen (35,571 -> 6,757 tokens/s" in run.summary
    sarif = json.loads((repo / "ortgate.sarif").read_text())
    (result,) = [r for r in sarif["runs"][0]["results"] if r["ruleId"] == "OGT006"]
    assert result["level"] == "error" and result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == \
        "deploy/policy.yaml"
    # the other direction passes the same gate
    repo = two_commits(tmp_path / "other", "qwen3-moe-tiny-unfused", "qwen3-moe-tiny-fused", policy)
    run = pull_request(repo, tmp_path / "other", args="--select throughput-regression")
    assert run.exit_code == 0 and "### Compared with `main:models/qwen`" in run.summary


def test_no_comparison_is_said_and_the_lint_runs_as_without_one(tmp_path):
    repo = two_commits(tmp_path, "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused")
    plain = pull_request(repo, tmp_path / "plain", **{"compare-ref": ""})
    assert "Compared with" not in plain.summary and "No comparison" not in plain.summary
    cases = {
        "no-such-branch": "**No comparison:** compare-ref 'no-such-branch' names no commit, branch or tag",
    }
    for ref, said in cases.items():
        run = pull_request(repo, tmp_path / ref, **{"compare-ref": ref})
        assert said in run.summary, run.summary[:600]
        assert run.exit_code == plain.exit_code and run.outputs["errors"] == plain.outputs["errors"]
        assert "Compared with" not in run.summary
    # a new model: the base branch does not hold it (normal, not an error)
    shutil.copytree(repo / "models" / "qwen", repo / "models" / "new")
    run = run_action({"model": "models/new", "policy": "deploy/policy.yaml", "python": sys.executable}, repo,
                     tmp_path / "new", github={"base_ref": "main"})
    assert "**No comparison:** models/new does not exist at main (a new model)" in run.summary
    assert run.exit_code == plain.exit_code
    shutil.rmtree(repo / "models" / "new")
    # a push (no base ref): nothing to compare with, nothing said
    run = run_action({"model": "models/qwen", "policy": "deploy/policy.yaml", "python": sys.executable}, repo,
                     tmp_path / "push")
    assert "Compared with" not in run.summary and "No comparison" not in run.summary


def test_a_base_lint_cannot_read_is_no_comparison(tmp_path):
    # The base branch holds a Git LFS pointer (the checkout fetched no LFS object) or a file that is no model.
    repo = two_commits(tmp_path, "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused")
    git(repo, "checkout", "-q", "main")
    (repo / "models" / "qwen" / "model.onnx").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 1234\n")
    git(repo, "commit", "-q", "-am", "an LFS pointer")
    git(repo, "checkout", "-q", "change")
    run = pull_request(repo, tmp_path, sarif="")
    assert "**No comparison:** the base cannot be read: main:models/qwen/model.onnx: Git LFS pointer" in run.summary
    assert run.exit_code == 1 and "Compared with" not in run.summary
    assert git(repo, "status", "--porcelain") == ""


def test_several_models_are_not_compared(tmp_path):
    repo = two_commits(tmp_path, "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused")
    shutil.copytree(repo / "models" / "qwen", repo / "models" / "two")
    run = run_action({"model": "models/qwen models/two", "policy": "deploy/policy.yaml", "python": sys.executable},
                     repo, tmp_path / "run", github={"base_ref": "main"})
    assert "**No comparison:** compare-ref compares one model, and `model` names 2 paths" in run.summary


@pytest.mark.skipif(_mermaid_cli() is None, reason="Mermaid's renderer (mmdc and Chromium) is not installed")
def test_the_summarys_chart_renders_with_mermaid(tmp_path):
    repo = two_commits(tmp_path, "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused")
    run = pull_request(repo, tmp_path)
    (block,) = MERMAID_BLOCK.findall(run.summary)
    (tmp_path / "render").mkdir()
    ok, err = mermaid_renders(block, tmp_path / "render")
    assert ok, err


def test_the_base_branch_is_fetched_when_the_checkout_lacks_it(tmp_path):
    # actions/checkout fetches one commit of the pull request: the base branch is fetched from origin, shallow.
    origin = two_commits(tmp_path / "origin", "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", "--depth=1", "--single-branch", "--branch", "change", origin.as_uri(), str(clone))
    assert "main" not in git(clone, "branch", "-a")
    run = pull_request(clone, tmp_path, sarif="")
    assert "### Compared with `main:models/qwen`" in run.summary and "16 findings appeared" in run.summary
    assert git(clone, "status", "--porcelain") == ""


def test_a_model_file_is_read_with_the_config_beside_it_and_never_the_weights(tmp_path, monkeypatch):
    from ortgate.cli.github_action import BASE_FOLDER, base_model

    repo = two_commits(tmp_path, "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused")
    git(repo, "checkout", "-q", "main")
    (repo / "models" / "qwen" / "model.onnx.data").write_bytes(b"\0" * 1024)  # weights: never read
    (repo / "models" / "qwen" / "sub").mkdir()
    (repo / "models" / "qwen" / "sub" / "other.onnx").write_bytes(b"x")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "weights")
    git(repo, "checkout", "-q", "change")
    monkeypatch.chdir(repo)
    work = tmp_path / "work"
    for model, expected in (("models/qwen/model.onnx", ["genai_config.json", "model.onnx"]),
                            ("models/qwen", ["genai_config.json", "model.onnx"])):
        base = base_model({"ORTGATE_COMPARE_REF": "main", "ORTGATE_MODEL": model}, work)
        assert base.why_not is None and base.label == f"main:{model}"
        assert base.path == work / BASE_FOLDER / model
        assert sorted(p.name for p in (work / BASE_FOLDER / "models" / "qwen").rglob("*") if p.is_file()) == expected
        assert (work / BASE_FOLDER / "models" / "qwen" / "model.onnx").read_bytes() == \
            (EXAMPLES / "qwen3-moe-tiny-fused" / "model.onnx").read_bytes()
    assert git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("ref", ["--upload-pack=touch /tmp/x", "a\nb"])
def test_a_ref_that_is_no_ref_is_no_comparison(tmp_path, ref):
    repo = two_commits(tmp_path, "qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused")
    run = pull_request(repo, tmp_path, **{"compare-ref": ref})
    assert "**No comparison:** compare-ref" in run.summary and "is not a git ref" in run.summary


def test_the_steps_sarif_leaves_out_the_fixed_findings_code_scanning_would_keep_open(tmp_path):
    # unfused -> fused: the base's unfused findings are gone; code scanning reads every result as an alert whatever
    # its kind, so the step's SARIF holds only the model's results (new / unchanged), the summary the fixed ones.
    repo = two_commits(tmp_path, "qwen3-moe-tiny-unfused", "qwen3-moe-tiny-fused")
    run = pull_request(repo, tmp_path, sarif=str(tmp_path / "out" / "ortgate.sarif"))
    sarif = json.loads((tmp_path / "out" / "ortgate.sarif").read_text())
    results = sarif["runs"][0]["results"]
    assert results and {r.get("baselineState") for r in results} <= {"new", "unchanged"}
    assert sarif["runs"][0]["properties"]["comparison"]["disappeared"] > 10
    assert "| Findings that disappeared |" in run.summary and "`OGF001` moe-not-fused" in run.summary
