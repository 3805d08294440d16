"""`ortgate run` as a CI step: a model ORT refuses, and --timeout, are findings in a report (every format, the static
findings kept, exit 1), never exit 2 without one; side reports, findings baselines, and optimized-graph findings
that never point at a deleted file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import EXAMPLES, POLICIES, REPO
from tests.helpers import run_cli

TINY = ["--warmup", "1", "--iterations", "2"]
CPU_POLICY = """name: cpu-decode
execution_provider: {name: CPUExecutionProvider}
session:
  graph_optimization_level: ORT_ENABLE_ALL
runner:
  past_sequence_length: 4
"""


@pytest.fixture
def rank3_rotary(make_model) -> Path:
    """Qwen3.5's [3, batch, seq] position_ids fed straight to com.microsoft RotaryEmbedding, as onnxruntime-genai
    0.18's Qwen3.5-MoE export does: ORT creates the session and refuses the first run."""
    return make_model("rank3", position_ids="input_3d", rotary="fused", layers=2)


@pytest.fixture
def type_error(tmp_path) -> Path:
    """A model ORT refuses to load: Add of a float and an int32 tensor."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["z"], name="bad_add")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", 4]),
         helper.make_tensor_value_info("y", TensorProto.INT32, ["batch_size", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch_size", 4])])
    path = tmp_path / "bad.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


def run_json(*args):
    code, out, err = run_cli("run", *args, *TINY, "--format", "json")
    return code, json.loads(out), err


def test_ort_refusing_to_run_a_node_is_an_error_finding_naming_the_node(rank3_rotary, write_policy):
    code, report, err = run_json(rank3_rotary, "--policy", write_policy(CPU_POLICY))
    assert code == 1 and err == "" and not report["verdict"]["passed"]
    (failed,) = [f for f in report["findings"] if f["rule"] == "session-failed"]
    assert failed["severity"] == "error" and failed["node"].endswith("RotaryEmbedding")
    assert failed["layer"] == 0 and failed["op_type"] == "com.microsoft.RotaryEmbedding"
    assert "Input 'position_ids' is expected to have 0, 1, or 2 dimensions, got 3" in failed["message"]
    assert failed["file"] == str(rank3_rotary)
    # the static findings are kept beside it
    assert "free-dim-override-missing" in {f["rule"] for f in report["findings"]}
    assert report["run"]["failures"][0]["kind"] == "run" and report["run"]["measurement"] is None


def test_ort_refusing_to_load_the_model_is_an_error_finding_naming_the_node(type_error, write_policy):
    code, report, err = run_json(type_error, "--policy", write_policy(CPU_POLICY))
    assert code == 1 and err == ""
    (failed,) = [f for f in report["findings"] if f["rule"] == "session-failed"]
    assert failed["node"] == "bad_add" and failed["properties"]["stage"] == "load"
    assert "bound to different types" in failed["message"]
    assert "free-dim-override-missing" in {f["rule"] for f in report["findings"]}


@pytest.mark.parametrize("fmt", ["text", "json", "sarif", "github", "markdown", "junit", "codequality"])
def test_the_refusal_is_in_every_report_format(rank3_rotary, write_policy, fmt):
    code, out, err = run_cli("run", rank3_rotary, "--policy", write_policy(CPU_POLICY), *TINY, "--format", fmt)
    assert code == 1 and err == ""
    assert "session-failed" in out and "expected to have 0, 1, or 2 dimensions, got 3" in out
    assert "free-dim-override-missing" in out
    if fmt == "sarif":
        results = json.loads(out)["runs"][0]["results"]
        assert {r["ruleId"] for r in results} >= {"OGR010", "OGS002"}
    if fmt == "markdown":
        assert "### Run" in out and "stopped" in out


def test_side_reports_and_a_findings_baseline(rank3_rotary, write_policy, tmp_path):
    policy = write_policy(CPU_POLICY)
    sarif, markdown, report, baseline = (tmp_path / n for n in ("r.sarif", "r.md", "r.json", "baseline.json"))
    code, out, err = run_cli("run", rank3_rotary, "--policy", policy, *TINY, "--sarif", sarif, "--markdown", markdown,
                             "--json", report, "--write-baseline", baseline)
    assert code == 0 and err == ""  # everything found is now in the baseline
    assert json.loads(sarif.read_text())["runs"][0]["results"]
    assert "session-failed" in markdown.read_text()
    written = json.loads(report.read_text())
    assert written["run"]["failures"] and all(f["suppressed"] for f in written["findings"])
    code, report2, _ = run_json(rank3_rotary, "--policy", policy, "--baseline", baseline)
    assert code == 0 and report2["verdict"]["suppressed_by"] == {"baseline": len(report2["findings"])}


def test_the_old_baseline_flag_says_what_to_write_now(rank3_rotary, write_policy):
    code, out, err = run_cli("run", rank3_rotary, "--policy", write_policy(CPU_POLICY), "--baseline")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--compare-default" in err


def test_optimized_graph_findings_never_point_at_the_deleted_dump(write_policy):
    unfused = EXAMPLES / "qwen3-moe-tiny-unfused"
    code, report, _ = run_json(unfused, "--policy", POLICIES / "tiny-moe-cpu.yaml")
    on_optimized = [f for f in report["findings"] if f.get("file_label")]
    assert on_optimized, "the unfused example's optimized graph has findings"
    model = str(unfused / "model.onnx")
    assert all(f["file"] == model and f["file_label"] == f"optimized graph of {model}" for f in on_optimized)
    assert all(Path(f["file"]).is_file() for f in report["findings"])  # nothing points at a deleted file
    assert report["inputs"]["optimized"] == f"optimized graph of {model}"


def test_optimized_graph_findings_point_at_a_kept_dump(write_policy, tmp_path):
    dump = tmp_path / "opt.onnx"
    code, report, _ = run_json(EXAMPLES / "qwen3-moe-tiny-unfused", "--policy", POLICIES / "tiny-moe-cpu.yaml",
                               "--dump", dump)
    on_dump = [f for f in report["findings"] if f["file"] == str(dump)]
    assert on_dump and not any(f.get("file_label") for f in report["findings"]) and dump.is_file()


HARD_TIMEOUT = """
import sys, time
from ortgate.runner.measure import Deadline

def report(timeout):
    open(sys.argv[1], "w").write(f"report: {timeout}")
    return 1

with Deadline(0.2, hard_exit=True, grace_s=0.2, on_hard_exit=report) as deadline:
    deadline.enter("creating the policy session")
    time.sleep(30)  # stands for a call ORT cannot interrupt
print("not reached")
"""


def test_a_timeout_inside_an_uninterruptible_call_still_writes_the_report(tmp_path):
    out = tmp_path / "report.txt"
    done = subprocess.run([sys.executable, "-c", HARD_TIMEOUT, str(out)], capture_output=True, text=True, cwd=REPO,
                          timeout=20)
    assert done.returncode == 1 and "not reached" not in done.stdout
    assert out.read_text() == "report: run exceeded --timeout 0.2s while creating the policy session"


def test_ep_unavailable_points_at_the_users_extends_line_not_the_installed_base(write_policy):
    from ortgate.runner.session import provider_availability

    if provider_availability("CUDAExecutionProvider")[0]:
        pytest.skip("this machine has CUDA")
    policy = write_policy("name: cuda-decode\nextends: builtin:cuda-decode\nrunner:\n  past_sequence_length: 4\n")
    code, report, _ = run_json(EXAMPLES / "qwen3-moe-tiny-fused", "--policy", policy)
    (found,) = [f for f in report["findings"] if f["rule"] == "ep-unavailable"]
    assert code == 1 and found["file"] == str(policy) and found["line"] == 2
    assert found["key_path"] == "execution_provider.name"
    # and every other finding about an inherited value points into the user's file too
    assert all("site-packages" not in f["file"] and "/builtin/" not in f["file"] for f in report["findings"])
