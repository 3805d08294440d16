"""`ortgate run` end to end on committed models: this model, this policy, these figures and findings, this exit code.

Real CPU sessions; iterations kept tiny (warm-up 1, 3 timed runs).
"""

from __future__ import annotations

import json

import pytest

from ortgate.runner.session import provider_availability
from tests.conftest import EXAMPLES, EXPORTED, POLICIES
from tests.helpers import run_cli

QWEN35 = EXPORTED / "genai-qwen3_5_moe-fp32-cpu"
GPT_OSS = EXPORTED / "genai-gpt_oss-fp32-cpu"
DYNAMO = EXPORTED / "dynamo-qwen3_moe"
TINY = ["--warmup", "1", "--iterations", "3"]
CUDA_AVAILABLE = provider_availability("CUDAExecutionProvider")[0]
no_cuda = pytest.mark.skipif(CUDA_AVAILABLE, reason="this machine has CUDA")

CPU_POLICY = """name: cpu-decode
execution_provider: {name: CPUExecutionProvider}
session:
  graph_optimization_level: ORT_ENABLE_ALL
  free_dimension_overrides: {batch_size: 1, sequence_length: 1}
runner:
  past_sequence_length: 8
"""
CUDA_POLICY = """name: cuda-decode
extends: builtin:cuda-decode
runner:
  past_sequence_length: 8
"""


def run_json(*args):
    code, out, err = run_cli("run", *args, *TINY, "--format", "json")
    return code, json.loads(out), err


def findings(report, prefix="OGR"):
    return {f["rule"]: f for f in report["findings"] if f["code"].startswith(prefix) and not f["suppressed"]}


def test_genai_qwen35_moe_runs_on_cpu_with_every_figure(write_policy):
    code, report, err = run_json(QWEN35, "--policy", write_policy(CPU_POLICY), "--compare-default")
    run = report["run"]
    assert run["session"]["provider"]["ran_on"] == ["CPUExecutionProvider"]
    assert {d["dim"]: d["status"] for d in run["session"]["dims"]} == {"batch_size": "pinned",
                                                                      "sequence_length": "pinned"}
    assert run["session"]["input_shapes"]["position_ids"] == [3, 1, 1]
    assert run["dims"]["past_sequence_length"] == 8 and run["feeds"]["past.0.recurrent"]["shape"] == [1, 4, 16, 16]
    m = run["measurement"]
    assert m["device_kind"] == "cpu" and m["stats"]["iterations"] == 3 and m["warmup"] == 1
    assert m["tokens_per_second"] == pytest.approx(1000.0 / m["stats"]["p50_ms"], rel=1e-6)
    assert m["peak_memory_bytes"] is not None and "CPU" in m["memory_source"]
    assert run["baseline"]["label"] == "default" and run["speedup_vs_default"] > 0
    assert run["correctness"]["reference"] == "ORT_DISABLE_ALL on CPUExecutionProvider"
    assert all(o["mismatched"] == 0 for o in run["correctness"]["outputs"])
    assert run["session"]["dump"]["path"] and not run["session"]["dump"]["kept"]
    assert findings(report) == {}  # nothing runtime went wrong
    assert run["session"]["placement"]["CPUExecutionProvider"]["MoE"] == 4
    assert report["inputs"]["optimized"]  # the dump was linted with the same rules
    assert code == (0 if report["verdict"]["passed"] else 1)


def test_gpt_oss_runs_with_its_sliding_window_cache(write_policy):
    code, report, _ = run_json(GPT_OSS, "--policy", write_policy(CPU_POLICY))
    run = report["run"]
    assert run["dims"]["past_sliding_length"] == 32 and run["measurement"]["stats"]["p50_ms"] > 0
    assert findings(report) == {}


@no_cuda
def test_cuda_policy_on_this_cpu_machine_fails_with_ep_unavailable(write_policy):
    code, report, err = run_json(QWEN35, "--policy", write_policy(CUDA_POLICY))
    assert code == 1 and not report["verdict"]["passed"]
    found = findings(report)["ep-unavailable"]
    assert found["severity"] == "error" and found["key_path"] == "execution_provider.name"
    assert "CUDAExecutionProvider cannot be created on this machine" in found["message"]
    assert report["run"]["measurement"] is None and "not available" in report["run"]["skipped"]
    assert err == ""  # ORT's own noise was captured, not printed


@no_cuda
def test_allow_cpu_runs_the_same_config_and_labels_every_figure_cpu(write_policy):
    policy = write_policy(CUDA_POLICY + "throughput:\n  device: h100-sxm\n  min_tokens_per_s: 100000000\n")
    code, report, _ = run_json(QWEN35, "--policy", policy, "--allow-cpu")
    run = report["run"]
    assert run["cpu_figures"] is True and run["session"]["provider"]["substituted"] is True
    assert run["measurement"]["provider"] == "CPUExecutionProvider" and run["measurement"]["device_kind"] == "cpu"
    assert any("session.disable_cpu_ep_fallback dropped" in n for n in run["notes"])
    runtime = findings(report)
    assert "ep-unavailable" not in runtime
    assert runtime["ep-substituted"]["severity"] == "info" and "CPU figure" in runtime["ep-substituted"]["message"]
    # The H100 target is not applicable here: reported as such, neither passed nor failed.
    target = runtime["throughput-target-missed"]
    assert target["severity"] == "info" and target["kind"] == "undecided"
    assert "not applicable on this machine" in target["message"]
    assert runtime["option-not-applied"]["severity"] == "info"  # CUDA options cannot be verified on CPU
    code, text, _ = run_cli("run", QWEN35, "--policy", policy, "--allow-cpu", *TINY)
    assert "CPU FIGURES" in text
    # the run's figures (the block before the findings): lint's own estimates for the policy's device follow it
    figures = text.split("\n\n", 1)[0]
    figure_lines = [line for line in figures.splitlines() if "tokens/s" in line or " p50 " in line]
    assert figure_lines and all(line.endswith("[CPU]") for line in figure_lines)


def test_throughput_target_applies_on_a_matching_device(write_policy):
    impossible = CPU_POLICY + "throughput:\n  device: cpu\n  min_tokens_per_s: 1.0e+12\n  max_p99_latency_ms: 1.0e+9\n"
    code, report, _ = run_json(GPT_OSS, "--policy", write_policy(impossible))
    [missed] = [f for f in report["findings"] if f["rule"] == "throughput-target-missed"]
    assert code == 1 and missed["severity"] == "error" and missed["key_path"] == "throughput.min_tokens_per_s"
    assert "the policy asks for at least 1e+12" in missed["message"]
    easy = CPU_POLICY + "throughput:\n  device: cpu\n  min_tokens_per_s: 0.001\n"
    _, report, _ = run_json(GPT_OSS, "--policy", write_policy(easy, name="easy.yaml"))
    assert "throughput-target-missed" not in findings(report)


def test_throughput_on_another_device_is_not_applicable(write_policy):
    policy = CPU_POLICY + "throughput:\n  device: h100-sxm\n  min_tokens_per_s: 1.0e+12\n"
    _, report, _ = run_json(GPT_OSS, "--policy", write_policy(policy))
    target = findings(report)["throughput-target-missed"]
    assert target["severity"] == "info" and target["kind"] == "undecided"
    assert "not applicable on this machine" in target["message"]


def test_speedup_target_needs_the_baseline(write_policy):
    policy = write_policy(CPU_POLICY + "throughput:\n  device: cpu\n  min_speedup_vs_default: 1000\n")
    _, report, _ = run_json(GPT_OSS, "--policy", policy)
    assert findings(report)["throughput-target-missed"]["severity"] == "info"
    code, report, _ = run_json(GPT_OSS, "--policy", policy, "--compare-default")
    missed = findings(report)["throughput-target-missed"]
    assert code == 1 and missed["severity"] == "error" and "speedup over ORT's default session" in missed["message"]


def test_dump_is_kept_and_linted_with_the_same_rules(write_policy, tmp_path):
    dump = tmp_path / "model.optimized.onnx"
    code, report, _ = run_json(DYNAMO, "--policy", write_policy(CPU_POLICY), "--dump", dump)
    assert dump.is_file() and report["run"]["session"]["dump"] == {"path": str(dump), "kept": True, "reason": None}
    assert report["inputs"]["optimized"] == str(dump)
    # The graph rules read the dump too: the unfused MoE of the dynamo export is still there.
    assert any(f["rule"] == "moe-not-fused" for f in report["findings"])


def test_profile_tables(write_policy, tmp_path):
    trace = tmp_path / "trace.json"
    code, report, _ = run_json(QWEN35, "--policy", write_policy(CPU_POLICY), "--profile", trace)
    profile = report["run"]["profile"]
    assert trace.is_file() and profile["file"] == str(trace)
    assert profile["runs"] >= 3 and profile["memcpy_nodes"] == 0
    assert {row["op_type"] for row in profile["op_types"]} >= {"MoE", "GroupQueryAttention", "LinearAttention"}
    code, text, _ = run_cli("run", QWEN35, "--policy", write_policy(CPU_POLICY), "--profile", *TINY)
    assert "op type" in text and "MoE" in text


def test_text_report_has_figures_then_findings(write_policy):
    code, text, err = run_cli("run", EXAMPLES / "qwen3-moe-tiny-fused", "--policy", POLICIES / "tiny-moe-cpu.yaml",
                              *TINY)
    lines = text.splitlines()
    assert lines[0].startswith("ortgate run: ")
    assert any(line.startswith("policy ") and "p50" in line for line in lines)
    assert lines[-1].startswith(("PASS", "FAIL")) and code == (0 if lines[-1].startswith("PASS") else 1)
    assert err == ""


def test_timeout_is_a_finding_in_the_report_with_the_static_findings(write_policy):
    code, out, err = run_cli("run", QWEN35, "--policy", write_policy(CPU_POLICY), "--iterations", "100000000",
                             "--timeout", "1", "--format", "json")
    assert code == 1 and err == ""
    report = json.loads(out)
    (timeout,) = [f for f in report["findings"] if f["rule"] == "run-timeout"]
    assert timeout["severity"] == "error" and "--timeout 1s while measuring the policy session" in timeout["message"]
    assert report["run"]["failures"][0]["kind"] == "timeout" and report["run"]["measurement"] is None
    assert {f["code"][:3] for f in report["findings"]} - {"OGR"}  # the static findings are still there
    assert not report["verdict"]["passed"]


def test_inputs_that_cannot_be_synthesised_exit_2(make_model, write_policy, tmp_path):
    import onnx

    model = onnx.load(str(make_model()))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "chunk_width"
    path = tmp_path / "odd.onnx"
    onnx.save(model, path)
    code, out, err = run_cli("run", path, "--policy", write_policy("name: p\n"), *TINY)
    assert code == 2 and out == ""
    assert err.startswith("ortgate: error: ") and "dim 'chunk_width'" in err and err.count("\n") == 1


def test_custom_op_model_exits_2_without_a_traceback(write_policy, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("FastTokenize", ["x"], ["y"], domain="com.example.text")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    path = tmp_path / "custom.onnx"
    onnx.save(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21),
                                                                      helper.make_opsetid("com.example.text", 1)]),
              path)
    code, out, err = run_cli("run", path, "--policy", write_policy("name: p\n"), *TINY)
    assert code == 2 and "custom ops" in err and "Traceback" not in err and err.count("\n") == 1


def test_policy_is_required():
    code, _, err = run_cli("run", QWEN35)
    assert code == 2 and "--policy" in err


def test_dump_over_an_input_is_refused(write_policy):
    policy = write_policy(CPU_POLICY)
    code, _, err = run_cli("run", QWEN35, "--policy", policy, "--dump", policy, *TINY)
    assert code == 2 and "refusing to write" in err


def test_past_beyond_the_context_length_is_an_input_error_at_the_runner_key(write_policy):
    policy = write_policy("name: p\nrunner:\n  past_sequence_length: 600\n")
    code, out, err = run_cli("run", QWEN35, "--policy", policy, *TINY)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert f"{policy}:3: past 600 + 1 new tokens exceed the model's context_length 512" in err
