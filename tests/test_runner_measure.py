"""Measurement: the binding plan, bound buffers on the CPU device, timing, the deadline, output comparison and
ORT's profile, on real sessions."""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort
import pytest

from ortgate.config.deployment import setup_from_policy
from ortgate.engine.pipeline import LintRequest, load_inputs
from ortgate.evidence import DeviceInfo, device_matches
from ortgate.runner import measure as rm
from ortgate.runner import session as rs
from ortgate.runner.collect import _feeds
from ortgate.runner.compare import compare_one, compare_outputs, tolerance
from ortgate.runner.profile import load_profile, summarize_profile
from ortgate.runner.settings import runner_settings
from tests.conftest import EXPORTED

QWEN35 = EXPORTED / "genai-qwen3_5_moe-fp32-cpu"
GPT_OSS = EXPORTED / "genai-gpt_oss-fp32-cpu"


def bound_session(model, write_policy, policy_text="name: p\nrunner:\n  past_sequence_length: 4\n", **create):
    inputs = load_inputs(LintRequest(str(model), str(write_policy(policy_text))))
    setup = setup_from_policy(inputs.policy)
    built = rs.create_session(inputs.model.path, setup, **create)
    feeds = _feeds(inputs, setup, runner_settings(inputs.policy), built.session)
    plan = rm.plan_binding("CPUExecutionProvider", {})
    return built, feeds, rm.BoundSession(built.session, plan, feeds)


# ---- the plan ------------------------------------------------------------------------------------------------

def test_cuda_graph_plan_binds_device_buffers_and_replays_one_graph():
    plan = rm.plan_binding("CUDAExecutionProvider", {"enable_cuda_graph": "1", "device_id": "1"})
    assert plan.device_type == "cuda" and plan.device_id == 1
    assert plan.cuda_graph and plan.graph_id == rm.CAPTURE_GRAPH_ID
    # ORT captures after its regular runs: the first timed run must be a replay.
    assert plan.min_warmup == rm.RUNS_BEFORE_CAPTURE + 1


@pytest.mark.parametrize("options", [{"enable_cuda_graph": "0"}, {}, {"enable_cuda_graph": "false"}])
def test_cuda_without_graph_never_captures(options):
    plan = rm.plan_binding("CUDAExecutionProvider", options)
    assert plan.device_type == "cuda" and not plan.cuda_graph and plan.graph_id == rm.GRAPH_ID_SKIP


def test_tensorrt_graph_option_is_its_own_key():
    assert rm.plan_binding("TensorrtExecutionProvider", {"trt_cuda_graph_enable": "True"}).cuda_graph
    assert not rm.plan_binding("TensorrtExecutionProvider", {"enable_cuda_graph": "1"}).cuda_graph


def test_cpu_plan():
    plan = rm.plan_binding("CPUExecutionProvider", {})
    assert (plan.device_type, plan.cuda_graph, plan.graph_id, plan.min_warmup) == ("cpu", False, rm.GRAPH_ID_SKIP, 0)


# ---- bound buffers -------------------------------------------------------------------------------------------

def test_bound_outputs_match_a_plain_run(write_policy):
    built, feeds, bound = bound_session(QWEN35, write_policy)
    shapes = bound.discover_outputs()
    assert shapes["logits"] == (1, 1, 320) and shapes["present.3.key"] == (1, 2, 5, 16)
    buffers = {name: value.data_ptr() for name, value in bound.output_buffers.items()}
    for _ in range(3):
        bound.run()
    # The same buffers every run (what CUDA graph replay needs), holding what session.run computes.
    assert {name: value.data_ptr() for name, value in bound.output_buffers.items()} == buffers
    expected = dict(zip([o.name for o in built.session.get_outputs()], built.session.run(None, feeds.arrays)))
    got = bound.outputs()
    assert set(got) == set(expected)
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name])


def test_inputs_live_on_the_plan_device(write_policy):
    _, _, bound = bound_session(GPT_OSS, write_policy)
    assert {value.device_name() for value, _ in bound._inputs.values()} == {"cpu"}


def test_timed_runs_and_statistics(write_policy):
    _, _, bound = bound_session(QWEN35, write_policy)
    bound.discover_outputs()
    ticks = []
    latencies = rm.timed_runs(bound, 1, 3, rm.Deadline(None), tick=ticks.append)
    assert len(latencies) == 3 and all(x > 0 for x in latencies)
    assert ticks == [1, 2, 3, 4]
    stats = rm.latency_stats(latencies)
    assert stats.min_ms <= stats.p50_ms <= stats.p90_ms <= stats.p99_ms == stats.max_ms


def test_percentiles_by_nearest_rank():
    stats = rm.latency_stats([x / 1000 for x in (5, 1, 4, 2, 3, 10, 6, 7, 8, 9)])
    assert (stats.p50_ms, stats.p90_ms, stats.p99_ms, stats.mean_ms) == (5, 9, 10, 5.5)
    assert rm.tokens_per_second(4, 1, stats) == pytest.approx(800.0)  # 4 sequences x 1 token / 5 ms


def test_deadline_stops_the_loop(write_policy):
    _, _, bound = bound_session(QWEN35, write_policy)
    bound.discover_outputs()
    start = time.monotonic()
    with rm.Deadline(0.3) as deadline, pytest.raises(rm.RunTimeout) as err:
        rm.timed_runs(bound, 0, 10**9, deadline)
    assert time.monotonic() - start < 5
    assert "--timeout 0.3s while measuring the policy session" in str(err.value)


def test_watchdog_terminates_a_running_session(write_policy):
    _, _, bound = bound_session(QWEN35, write_policy)
    bound.discover_outputs()
    with rm.Deadline(0.2) as deadline:
        deadline.enter("measuring", bound)
        time.sleep(0.5)  # the watchdog fired meanwhile: ORT's terminate flag is set on the run options
        with pytest.raises(Exception, match="terminate"):
            bound.run()


@pytest.mark.parametrize("pattern, kind, name, matches", [
    ("cpu", "cpu", "cpu: AMD EPYC", True),
    ("CPU", "cpu", "cpu: AMD EPYC", True),
    ("cpu", "gpu", "NVIDIA H100 80GB HBM3", False),
    ("NVIDIA H[12]00*", "gpu", "NVIDIA H100 80GB HBM3", True),
    ("NVIDIA H[12]00*", "gpu", "NVIDIA H200", True),
    ("NVIDIA H[12]00*", "gpu", "NVIDIA A100-SXM4-80GB", False),
    ("*h100*", "gpu", "NVIDIA H100 PCIe", True),
    ("NVIDIA*", "cpu", "cpu: NVIDIA Grace", False),
])
def test_throughput_device_match(pattern, kind, name, matches):
    assert device_matches(pattern, DeviceInfo(kind, name)) is matches


def test_memory_probe_reports_peak_rss_growth_on_cpu():
    probe = rm.MemoryProbe(rm.plan_binding("CPUExecutionProvider", {}))
    probe.start()
    block = np.ones(64 * 2**20 // 8)  # 64 MiB touched
    peak, source = probe.stop()
    del block
    assert peak is not None and peak >= 48 * 2**20 and "peak RSS" in source and "CPU" in source


# ---- comparing outputs ---------------------------------------------------------------------------------------

def test_identical_outputs_pass_and_a_perturbed_one_fails():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((1, 1, 320)).astype(np.float32)
    assert compare_one("logits", logits.copy(), logits).ok
    rounding = logits * (1 + 1e-6)  # what a fused kernel's reordered sums do
    assert compare_one("logits", rounding.astype(np.float32), logits).ok
    perturbed = logits.copy()
    perturbed[0, 0, 17] += 0.5  # what a wrong fusion does
    result = compare_one("logits", perturbed, logits)
    assert not result.ok and result.mismatched == 1 and result.max_abs_diff == pytest.approx(0.5)


def test_tolerance_depends_on_the_dtype():
    ref = np.full((8,), 10.0)
    off = ref + 0.05  # 0.5 % off
    assert not compare_one("x", off.astype(np.float32), ref.astype(np.float32)).ok
    assert compare_one("x", off.astype(np.float16), ref.astype(np.float16)).ok
    assert tolerance("int64") == (0.0, 0.0)
    assert not compare_one("ids", np.array([1, 2, 4]), np.array([1, 2, 3])).ok


def test_nan_where_the_reference_has_a_number_is_a_mismatch():
    ref = np.array([1.0, np.nan, np.inf], dtype=np.float32)
    assert compare_one("x", ref.copy(), ref).ok
    bad = np.array([np.nan, np.nan, np.inf], dtype=np.float32)
    assert compare_one("x", bad, ref).mismatched == 1


def test_cache_outputs_compare_only_the_written_positions():
    ref = np.zeros((1, 2, 32, 4), dtype=np.float32)  # a sliding-window cache: capacity 32, 9 positions written
    got = ref.copy()
    got[:, :, 9:, :] = 123.0  # uninitialised memory beyond the written positions
    [result] = compare_outputs({"present.0.key": got}, {"present.0.key": ref}, written={"present.0.key": (2, 9)})
    assert result.ok and result.shape == (1, 2, 9, 4)
    got[:, :, 3, :] = 1.0
    [result] = compare_outputs({"present.0.key": got}, {"present.0.key": ref}, written={"present.0.key": (2, 9)})
    assert not result.ok


def test_policy_session_matches_disable_all_on_a_real_model(write_policy):
    from ortgate.runner.inputs import written_positions

    built, feeds, bound = bound_session(GPT_OSS, write_policy)
    bound.discover_outputs()
    reference = rs.create_session(str(GPT_OSS / "model.onnx"), None, kind="reference")
    assert reference.session.get_session_options().graph_optimization_level == \
        ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref_bound = rm.BoundSession(reference.session, rm.plan_binding("CPUExecutionProvider", {}), feeds)
    ref_bound.discover_outputs()
    model = load_inputs(LintRequest(str(GPT_OSS))).model
    results = compare_outputs(bound.outputs(), ref_bound.outputs(), written=written_positions(model, feeds.step))
    assert {r.output for r in results} >= {"logits", "present.0.key", "present.1.value"}
    assert all(r.ok for r in results), [r for r in results if not r.ok]


# ---- profile ------------------------------------------------------------------------------------------------

def test_profile_tables_from_a_real_trace(write_policy, tmp_path):
    built, feeds, bound = bound_session(QWEN35, write_policy, profile_prefix=str(tmp_path / "trace"))
    bound.discover_outputs()
    for _ in range(2):
        bound.run()
    summary = summarize_profile(load_profile(built.session.end_profiling()))
    assert summary.runs == 3
    assert [p["provider"] for p in summary.providers] == ["CPUExecutionProvider"]
    ops = {row["op_type"]: row for row in summary.op_types}
    assert ops["MoE"]["calls"] == 3 * 4  # 4 MoE layers x 3 runs
    assert sum(row["share"] for row in summary.op_types) == pytest.approx(1.0, abs=0.02)
    assert summary.memcpy_nodes == 0 and summary.arena_peak_bytes and summary.arena_peak_bytes > 0


def test_profile_counts_memcpy_nodes():
    def event(node, op, provider, dur):
        return {"cat": "Node", "name": f"{node}_kernel_time", "dur": dur, "args": {"op_name": op, "provider": provider}}

    events = [{"cat": "Session", "name": "model_run", "dur": 100},
              event("gqa", "GroupQueryAttention", "CPUExecutionProvider", 40),
              event("copy_in", "MemcpyToHost", "CUDAExecutionProvider", 10),
              event("copy_out", "MemcpyFromHost", "CUDAExecutionProvider", 10),
              event("moe", "MoE", "CUDAExecutionProvider", 40)]
    summary = summarize_profile(events)
    assert summary.memcpy_nodes == 2 and summary.runs == 1
    assert {p["provider"]: p["nodes"] for p in summary.providers} == {"CUDAExecutionProvider": 3,
                                                                     "CPUExecutionProvider": 1}


def test_a_stuck_phase_exits_with_one_line_even_while_ort_output_is_captured():
    # Session creation cannot be interrupted: past the limit and a grace period the process exits.
    import subprocess
    import sys

    from tests.conftest import REPO

    script = ("import time\n"
              "from ortgate.runner.measure import Deadline\n"
              "from ortgate.runner.session import captured_output\n"
              "with Deadline(0.2, hard_exit=True, grace_s=0.2) as deadline:\n"
              "    deadline.enter('creating the policy session')\n"
              "    with captured_output():\n"
              "        time.sleep(30)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=20)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == "ortgate: error: run exceeded --timeout 0.2s while creating the policy session\n"
