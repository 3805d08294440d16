"""action.yml, executed step by step the way the GitHub runner runs a composite action.

Each `run:` step goes to `bash --noprofile --norc -eo pipefail` with its `env:`, after the `${{ ... }}`
expressions it uses are substituted (inputs with their defaults, github.action_path, steps.<id>.outputs.*);
each step gets its own GITHUB_OUTPUT file, parsed as the runner does; GITHUB_STEP_SUMMARY, RUNNER_TEMP and
GITHUB_WORKSPACE are temp paths and GITHUB_ACTIONS=true. The workspace holds a copy of a committed example.
ortgate is importable from the action's checkout (PYTHONPATH), which is how its install step finds it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

ACTION = REPO / "action.yml"
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")


@dataclass
class ActionRun:
    steps: list[dict] = field(default_factory=list)  # id, returncode, stdout, stderr
    outputs: dict[str, str] = field(default_factory=dict)
    summary: str = ""

    @property
    def exit_code(self) -> int:
        return next((s["returncode"] for s in self.steps if s["returncode"]), 0)

    def log(self, step_id: str) -> str:
        return next(s["stdout"] for s in self.steps if s["id"] == step_id)


def read_github_output(path: Path) -> dict[str, str]:
    """`name=value` lines and `name<<DELIMITER` ... `DELIMITER` blocks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delimiter = line.split("<<", 1)
            end = lines.index(delimiter, i + 1)
            out[name] = "\n".join(lines[i + 1:end])
            i = end + 1
        else:
            name, value = line.split("=", 1)
            out[name] = value
            i += 1
    return out


def run_action(inputs: dict[str, str], workspace: Path, tmp: Path, github: dict[str, str] | None = None) -> ActionRun:
    """`github`: the github context's values the workflow run has (base_ref: a pull request's base branch; a push
    has none, so the expressions of those left out are empty)."""
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    declared = action["inputs"]
    unknown = set(inputs) - set(declared)
    assert not unknown, f"not inputs of action.yml: {unknown}"
    missing = [name for name, spec in declared.items() if spec.get("required") and name not in inputs]
    assert not missing, f"required inputs missing: {missing}"
    runner_temp = tmp / "runner-temp"
    runner_temp.mkdir(parents=True)
    summary = tmp / "step-summary.md"
    summary.touch()
    steps_outputs: dict[str, dict[str, str]] = {}

    def evaluate(expression: str) -> str:
        parts = expression.split(".")
        if parts[0] == "inputs" and len(parts) == 2:
            return values[parts[1]]
        if expression == "github.action_path":
            return str(REPO)
        if expression == "github.workspace":
            return str(workspace)
        if expression == "runner.temp":
            return str(runner_temp)
        if parts[0] == "github" and len(parts) == 2 and parts[1] in ("base_ref", "head_ref", "event_name"):
            return (github or {}).get(parts[1], "")
        if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
            return steps_outputs.get(parts[1], {}).get(parts[3], "")
        raise AssertionError(f"this simulation does not know the expression ${{{{ {expression} }}}}")

    def substitute(text: str) -> str:
        return EXPRESSION.sub(lambda m: evaluate(m.group(1)), text)

    # An input's default may be an expression of the github context (compare-ref's is the pull request's base).
    values = {name: inputs.get(name, substitute(str(spec.get("default", "")))) for name, spec in declared.items()}

    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "RUNNER_", "ORTGATE_"))}
    base_env.update(GITHUB_ACTIONS="true", CI="true", GITHUB_WORKSPACE=str(workspace), RUNNER_TEMP=str(runner_temp),
                    GITHUB_STEP_SUMMARY=str(summary), GITHUB_ACTION_PATH=str(REPO), PYTHONPATH=str(REPO),
                    ORTGATE_STRICT=os.environ.get("ORTGATE_STRICT", "1"))
    result = ActionRun()
    for i, step in enumerate(action["runs"]["steps"]):
        if "uses" in step:  # another action (the pip cache): not run here, but its inputs must resolve
            action_ref = step["uses"].split("@")
            assert len(action_ref) == 2 and re.fullmatch(r"v\d+(\.\d+)*|[0-9a-f]{40}", action_ref[1]), step["uses"]
            with_values = {k: substitute(str(v)) for k, v in (step.get("with") or {}).items()}
            result.steps.append({"id": step.get("id", f"step{i}"), "returncode": 0, "stdout": "", "stderr": "",
                                 "uses": step["uses"], "if": step.get("if"), "with": with_values})
            continue
        assert "if" not in step, "this simulation runs every `run:` step"
        assert step.get("shell") == "bash"
        output_file = tmp / f"github-output-{i}"
        output_file.touch()
        env = {**base_env, **{k: substitute(str(v)) for k, v in (step.get("env") or {}).items()},
               "GITHUB_OUTPUT": str(output_file)}
        script = tmp / f"step-{i}.sh"
        script.write_text(substitute(step["run"]))
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                              cwd=step.get("working-directory", workspace), env=env, capture_output=True,
                              text=True, timeout=180)
        step_id = step.get("id", f"step{i}")
        steps_outputs[step_id] = read_github_output(output_file)
        result.steps.append({"id": step_id, "returncode": proc.returncode, "stdout": proc.stdout,
                             "stderr": proc.stderr})
        if proc.returncode != 0:
            break  # the runner skips the remaining steps of a failed composite action
    result.outputs = {name: substitute(str(spec["value"])) for name, spec in action["outputs"].items()}
    result.summary = summary.read_text(encoding="utf-8")
    return result


@pytest.fixture
def workspace(tmp_path) -> Path:
    """A checkout holding the two example models and the CPU policy."""
    ws = tmp_path / "workspace"
    for example in ("qwen3-moe-tiny-unfused", "qwen3-moe-tiny-fused"):
        shutil.copytree(REPO / "examples" / example, ws / "models" / example)
    (ws / "deploy").mkdir()
    shutil.copy(REPO / "policies" / "tiny-moe-cpu.yaml", ws / "deploy" / "tiny-moe-cpu.yaml")
    return ws


def active_results(sarif: dict, level: str) -> int:
    return sum(1 for r in sarif["runs"][0]["results"] if r["level"] == level and not r.get("suppressions"))


def test_a_failing_gate_writes_summary_and_outputs_then_fails_the_step(workspace, tmp_path):
    # The unfused example fails on its graph; the policy's required MoE count fails on a policy line.
    (workspace / "deploy" / "strict.yaml").write_text(
        "name: strict\nextends: tiny-moe-cpu.yaml\nmodel:\n  required_ops: {com.microsoft.MoE: 2}\n")
    run = run_action({"model": "models/qwen3-moe-tiny-unfused", "policy": "deploy/strict.yaml",
                      "python": sys.executable}, workspace, tmp_path)
    assert [s["id"] for s in run.steps] == ["prepare", "cache", "install", "lint"]
    assert all(s["returncode"] == 0 for s in run.steps[:3]), [s["stderr"] for s in run.steps]
    assert "already importable" in run.log("install")
    assert run.exit_code == 1, run.steps[-1]["stderr"]

    sarif_path = workspace / run.outputs["sarif-file"]
    assert run.outputs["sarif-file"] == "ortgate.sarif" and sarif_path.is_file()
    sarif = json.loads(sarif_path.read_text())
    errors = active_results(sarif, "error")
    assert errors >= 5
    assert run.outputs["exit-code"] == "1"
    assert run.outputs["errors"] == str(errors)
    assert run.outputs["warnings"] == str(active_results(sarif, "warning"))

    annotations = [line for line in run.log("lint").splitlines() if line.startswith("::error ")]
    assert len(annotations) == len({(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"], r["ruleId"])
                                    for r in sarif["runs"][0]["results"]
                                    if r["level"] == "error" and not r.get("suppressions")})  # one per rule and file
    assert any("file=models/qwen3-moe-tiny-unfused/model.onnx" in a for a in annotations)
    assert any("file=deploy/strict.yaml,line=4" in a for a in annotations)

    assert run.summary.startswith("## ❌ ortgate: FAIL\n")
    assert f"**{errors} errors**" in run.summary
    assert "### What to fix first" in run.summary and "`OGF001` moe-not-fused" in run.summary


def test_a_passing_gate_passes_the_step(workspace, tmp_path):
    run = run_action({"model": "models/qwen3-moe-tiny-fused", "policy": "deploy/tiny-moe-cpu.yaml",
                      "python": sys.executable, "sarif": "reports/ortgate.sarif",
                      "args": "--select 'moe-not-fused,gqa-not-fused'"}, workspace, tmp_path)
    assert run.exit_code == 0, run.steps[-1]["stderr"]
    assert run.outputs == {"exit-code": "0", "passed": "true", "errors": "0", "warnings": "0", "infos": "0",
                           "suppressed": "0", "sarif-file": "reports/ortgate.sarif"}
    sarif = json.loads((workspace / "reports" / "ortgate.sarif").read_text())
    # The two rules and the codes split off them (a reference written before a split keeps covering them).
    assert [r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]] == [
        "OGF001", "OGF002", "OGM002", "OGM008", "OGM009"]
    assert run.summary.startswith("## ✅ ortgate: PASS\n")
    assert not [line for line in run.log("lint").splitlines() if line.startswith("::")]


def test_bad_input_fails_the_step_with_exit_2_after_the_summary(workspace, tmp_path):
    run = run_action({"model": "models/qwen3-moe-tiny-fused", "policy": "deploy/missing.yaml",
                      "python": sys.executable}, workspace, tmp_path)
    assert run.exit_code == 2
    assert run.outputs["exit-code"] == "2" and run.outputs["errors"] == "" and run.outputs["sarif-file"] == ""
    assert "::error title=ortgate::deploy/missing.yaml: no such file" in run.log("lint")
    assert run.summary.startswith("## ❌ ortgate: could not lint (exit code 2)")
    assert "deploy/missing.yaml: no such file" in run.summary


def test_exit_zero_in_args_keeps_the_step_green_but_reports_the_failure(workspace, tmp_path):
    run = run_action({"model": "models/qwen3-moe-tiny-unfused", "policy": "deploy/tiny-moe-cpu.yaml",
                      "python": sys.executable, "args": "--exit-zero", "fail-on": "error"}, workspace, tmp_path)
    assert run.exit_code == 0 and run.outputs["exit-code"] == "0"
    assert int(run.outputs["errors"]) >= 4 and run.summary.startswith("## ❌ ortgate: FAIL")


def test_every_output_the_lint_step_writes_is_declared_and_every_declared_one_is_written(workspace, tmp_path):
    from ortgate.cli.github_action import _outputs

    written = set(_outputs(0, tmp_path / "no-report.json", ""))
    declared = yaml.safe_load(ACTION.read_text())["outputs"]
    assert written == set(declared)
    assert all(spec["value"] == f"${{{{ steps.lint.outputs.{name} }}}}" for name, spec in declared.items())


def test_several_models_and_globs_in_one_step_give_one_verdict(workspace, tmp_path):
    run = run_action({"model": "models/qwen3-moe-tiny-fused\nmodels/qwen3-moe-tiny-unf*",
                      "policy": "deploy/tiny-moe-cpu.yaml", "python": sys.executable,
                      "args": "--select 'moe-not-fused,gqa-not-fused'"}, workspace, tmp_path)
    assert run.exit_code == 1 and run.outputs["exit-code"] == "1" and run.outputs["passed"] == "false"
    sarif = json.loads((workspace / "ortgate.sarif").read_text())
    assert sarif["runs"][0]["properties"]["models"] == ["models/qwen3-moe-tiny-fused/model.onnx",
                                                        "models/qwen3-moe-tiny-unfused/model.onnx"]
    assert "| `models/qwen3-moe-tiny-fused/model.onnx` |" in run.summary
    assert "| `models/qwen3-moe-tiny-unfused/model.onnx` |" in run.summary


def test_the_pip_cache_is_keyed_on_the_runner_python_and_pinned_dependencies(workspace, tmp_path):
    run = run_action({"model": "models/qwen3-moe-tiny-fused", "python": sys.executable}, workspace, tmp_path)
    prepare = next(s for s in run.steps if s["id"] == "prepare")
    cache = next(s for s in run.steps if s["id"] == "cache")
    assert cache["uses"] == "actions/cache@v4" and cache["if"] == "inputs.cache == 'true'"
    key = cache["with"]["key"]
    assert re.fullmatch(rf"ortgate-pip-\w+-\w+-py{sys.version_info[0]}\.{sys.version_info[1]}-[0-9a-f]{{16}}", key), key
    assert cache["with"]["path"] and prepare["returncode"] == 0
