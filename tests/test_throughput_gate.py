"""The throughput gate without a GPU: the policy's `throughput:` block, the OGT rules judged against the decode
cost model, each finding's price in every report, `ortgate estimate`, and `ortgate run`'s estimate beside its
measurement with the calibration file it writes."""

from __future__ import annotations

import json

import pytest
import yaml

from ortgate.config.policy import load_policy
from ortgate.config.throughput import throughput_policy
from ortgate.cost import CostSetup, StepShape, estimate
from ortgate.engine.pipeline import LintRequest, load_inputs
from ortgate.knowledge.devices import find_device
from tests.conftest import REPO
from tests.helpers import run_cli

UNFUSED = str(REPO / "examples" / "qwen3-moe-tiny-unfused")
FUSED = str(REPO / "examples" / "qwen3-moe-tiny-fused")
BASE = """name: throughput-test
execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "0"}}
"""


@pytest.fixture
def policy(tmp_path):
    def write(throughput: str, name: str = "policy.yaml") -> str:
        path = tmp_path / name
        path.write_text(BASE + "throughput:\n" + throughput)
        return str(path)

    return write


def lint_json(*args) -> tuple[int, dict, str]:
    code, out, err = run_cli("lint", *args, "--format", "json")
    return code, (json.loads(out) if out else {}), err


def by_rule(report: dict, rule: str) -> list[dict]:
    return [f for f in report["findings"] if f["rule"] == rule]


def h100_estimate(model: str, context: int = 2048):
    inputs = load_inputs(LintRequest(model))
    setup = CostSetup(find_device("h100-sxm"), StepShape(1, 1, context), provider="CUDAExecutionProvider")
    return estimate(inputs.model, setup)


# ---- the policy block ------------------------------------------------------------------------------------------


def test_an_unknown_device_is_an_input_error_with_a_suggestion(policy):
    code, out, err = run_cli("lint", UNFUSED, "--policy", policy("  device: h100\n  min_tokens_per_s: 10\n"))
    assert code == 2 and out == ""
    assert "throughput.device: unknown device 'h100'; did you mean" in err and "'h100-sxm'" in err
    assert err.count("\n") == 1 and "policy.yaml:4" in err


def test_a_target_without_a_device_names_the_key(policy):
    code, _, err = run_cli("lint", UNFUSED, "--policy", policy("  max_ms_per_token: 5\n"))
    assert code == 2 and "throughput.max_ms_per_token: a throughput target needs throughput.device" in err


def test_the_old_key_name_is_refused_with_its_new_name(policy):
    code, _, err = run_cli("policy", "validate", policy("  device: h100-sxm\n  min_tokens_per_second: 10\n"))
    assert code == 2 and "did you mean 'min_tokens_per_s'?" in err


def test_a_calibration_figure_out_of_range_is_refused(policy):
    code, _, err = run_cli("policy", "validate", policy("  device: h100-sxm\n  calibration: {memory_efficiency: 1.5}\n"))
    assert code == 2 and "calibration" in err


def test_the_step_defaults_to_the_runner_block(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(BASE + "throughput: {device: l40s}\nrunner: {batch_size: 4, past_sequence_length: 511}\n")
    tp = throughput_policy(load_policy(path))
    assert (tp.batch_size, tp.new_tokens, tp.context_length) == (4, 1, 512)
    assert tp.device.name == "l40s" and tp.device.bandwidth == pytest.approx(864e9)


# ---- the rules ----------------------------------------------------------------------------------------------------


def test_a_target_above_the_ceiling_fails_with_budget_costs_and_the_with_fixes_figure(policy):
    est = h100_estimate(UNFUSED)
    impossible = 2 * est.as_exported.tokens_per_s_ceiling
    code, report, _ = lint_json(UNFUSED, "--policy", policy(f"  device: h100-sxm\n  min_tokens_per_s: {impossible}\n"))
    [found] = by_rule(report, "throughput-below-policy")
    assert code == 1 and found["severity"] == "error" and found["key_path"] == "throughput.min_tokens_per_s"
    message = found["message"]
    assert "a step budget of" in message and "cannot beat" in message and "ceiling" in message
    assert message.count("; (") == 2 and "(1) " in message and "(3) " in message  # three largest costs
    assert "With every fix:" in message
    assert found["properties"]["estimate"] is True and found["properties"]["device"] == "h100-sxm"
    assert not by_rule(report, "throughput-below-estimate")


def test_a_target_between_the_estimate_and_the_ceiling_warns(policy):
    est = h100_estimate(UNFUSED)
    a = est.as_exported
    between = (a.tokens_per_s_expected + a.tokens_per_s_ceiling) / 2
    _, report, _ = lint_json(UNFUSED, "--policy", policy(f"  device: h100-sxm\n  min_tokens_per_s: {between}\n"))
    assert not by_rule(report, "throughput-below-policy")
    [found] = by_rule(report, "throughput-below-estimate")
    assert found["severity"] == "warning" and "the estimate for the graph as exported is" in found["message"]


def test_a_reachable_target_passes_and_a_latency_budget_is_judged_too(policy):
    est = h100_estimate(UNFUSED)
    easy = est.as_exported.tokens_per_s_expected / 2
    slow = est.as_exported.expected_s * 1e3 * 2
    _, report, _ = lint_json(UNFUSED, "--policy", policy(f"  device: h100-sxm\n  min_tokens_per_s: {easy}\n"
                                                          f"  max_ms_per_token: {slow}\n"))
    assert not by_rule(report, "throughput-below-policy") and not by_rule(report, "throughput-below-estimate")
    tight = est.as_exported.ceiling_s * 1e3 / 2
    _, report, _ = lint_json(UNFUSED, "--policy", policy(f"  device: h100-sxm\n  max_ms_per_token: {tight}\n"))
    [found] = by_rule(report, "throughput-below-policy")
    assert "allows at most" in found["message"]


def test_targets_only_a_measurement_can_judge_are_said_not_silently_skipped(policy):
    _, report, _ = lint_json(FUSED, "--policy", policy("  device: h100-sxm\n  max_p99_latency_ms: 3\n"
                                                        "  min_speedup_vs_default: 1.1\n"))
    infos = by_rule(report, "throughput-not-judged")
    assert {f["key_path"] for f in infos} == {"throughput.max_p99_latency_ms", "throughput.min_speedup_vs_default"}
    assert all(f["severity"] == "info" and "can only be measured" in f["message"] for f in infos)


def test_a_block_with_only_a_glob_is_left_to_the_runner_with_a_word(policy):
    _, report, _ = lint_json(FUSED, "--policy", policy("  match: 'NVIDIA H100*'\n  min_tokens_per_s: 100\n"))
    [info] = by_rule(report, "throughput-not-judged")
    assert "no device is named" in info["message"]
    assert "estimate" not in report["inputs"]


# ---- prices in every report ---------------------------------------------------------------------------------------


def test_fusion_findings_carry_their_price_in_json_sarif_text_and_markdown(policy, tmp_path):
    p = policy("  device: h100-sxm\n  context_length: 1024\n")
    code, report, _ = lint_json(UNFUSED, "--policy", p)
    moe = by_rule(report, "moe-not-fused")
    assert moe and all(f["price"]["device"] == "h100-sxm" and f["price"]["estimate"] is True for f in moe)
    assert all(0 < f["price"]["share_of_step"] < 1 and f["price"]["ms_per_token"] > 0 for f in moe)
    unpriced = [f for f in report["findings"] if f["rule"] == "optimization-level-not-all"]
    assert all(f["price"] is None for f in unpriced)
    summary = report["inputs"]["estimate"]
    assert summary["device"] == "h100-sxm" and summary["context_length"] == 1024
    assert summary["with_fixes"]["tokens_per_s_expected"] > summary["as_exported"]["tokens_per_s_expected"]
    _, sarif, _ = run_cli("lint", UNFUSED, "--policy", p, "--format", "sarif")
    results = json.loads(sarif)["runs"][0]["results"]
    priced = [r for r in results if r["properties"].get("price")]
    assert priced and all(r["properties"]["price"]["device"] == "h100-sxm" for r in priced)
    _, text, _ = run_cli("lint", UNFUSED, "--policy", p)
    # grouped: each rule's price in the table, the sum of its findings' prices
    [row] = [line for line in text.splitlines() if line.startswith("OGF001 moe-not-fused")]
    total = sum(f["price"]["ms_per_token"] for f in moe)
    assert f"{total:.3g} ms (" in row or f"{total * 1000:.3g} us (" in row, row
    assert "saves/token (est.)" in text and "saves ~" not in text
    assert "estimate  h100-sxm (catalog), batch 1, context 1,024:" in text
    _, expanded, _ = run_cli("lint", UNFUSED, "--policy", p, "--expand")
    assert expanded.count("\n    saves ~") == len([f for f in report["findings"] if f["price"]])
    _, md, _ = run_cli("lint", UNFUSED, "--policy", p, "--format", "markdown")
    table = md.split("### What to fix first", 1)[1].split("###", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    savings = [float(row.split("|")[6].split()[0]) for row in rows if "ms/token" in row]
    assert len(savings) >= 3 and savings == sorted(savings, reverse=True)


def test_without_a_device_nothing_is_priced():
    _, report, _ = lint_json(UNFUSED)
    assert all(f["price"] is None for f in report["findings"]) and "estimate" not in report["inputs"]


# ---- ortgate estimate ---------------------------------------------------------------------------------------------


def test_estimate_prints_components_layers_and_both_forms(tmp_path):
    code, out, err = run_cli("estimate", UNFUSED, "--device", "h100-sxm", "--context", "512", "--batch", "2")
    assert code == 0 and err == ""
    assert "on h100-sxm" in out and "batch 2 x 1 new token, context 512" in out
    for word in ("component", "attention", "moe", "lm_head", "total", "as exported", "with fixes", "largest costs",
                 "MoE: 2 layers dense-loop", "what each fix saves", "never a measurement"):
        assert word in out, word
    saves = {line.split()[0]: line for line in out.split("what each fix saves", 1)[1].splitlines()[1:]
             if line.startswith("  ")}
    # CUDA graph is one repair of the whole model; the final norm is outside the two decoder layers
    assert "model-wide" in saves["cuda_graph"] and "2 layers, 1 outside" in saves["rmsnorm"], saves
    assert "2 layers" in saves["moe"] and "outside" not in saves["moe"]
    code, out, _ = run_cli("estimate", UNFUSED, "--device", "h100-sxm", "--format", "json")
    data = json.loads(out)
    assert data["estimate"] is True and data["device"] == "h100-sxm"
    assert data["as_exported"]["tokens_per_s_expected"] < data["with_fixes"]["tokens_per_s_expected"]
    assert data["as_exported"]["bytes_per_token"] > 0 and "moe" in data["as_exported"]["components"]
    assert data["moe_layers"][0]["form"] == "dense-loop" and data["fix_savings"]
    assert data["figures"]["bandwidth_gb_s"]["source"]


def test_estimate_needs_a_device_and_suggests_a_close_name():
    code, _, err = run_cli("estimate", UNFUSED)
    assert code == 2 and "no device to estimate for" in err
    code, _, err = run_cli("estimate", UNFUSED, "--device", "h200-sxm")
    assert code == 2 and "unknown device 'h200-sxm'" in err and "'h200'" in err
    code, _, err = run_cli("estimate", UNFUSED, "--device", "h100-sxm", "--batch", "0")
    assert code == 2 and "positive integer" in err


def test_estimate_lists_the_catalog():
    code, out, _ = run_cli("estimate", "--list-devices")
    assert code == 0 and "h100-sxm" in out and "ascend-910b" in out and "(uncertain)" in out


# ---- the cpu device and ortgate run -------------------------------------------------------------------------------


def test_the_cpu_probe_measures_this_machine():
    from ortgate.runner.probe import probe_cpu, session_threads

    probe = probe_cpu(session_threads(None))
    assert probe.bandwidth_gb_s > 0.1 and probe.cache_bandwidth_gb_s >= probe.bandwidth_gb_s
    assert probe.node_us > 0 and probe.float_tflops > 0 and probe.seconds > 0
    # The cache a step can be served from is measured, never larger than what the system reports: the reported size
    # is the socket's, shared with other cores and tenants.
    if probe.cache_bytes is not None:
        reported = probe.reported_cache_bytes
        assert reported is not None and min(16 << 20, reported) <= probe.cache_bytes <= reported
    if probe.cache_bandwidth_gb_s == probe.bandwidth_gb_s:
        assert probe.cache_bytes is None or probe.cache_bytes == probe.reported_cache_bytes


def test_a_weight_is_served_from_the_cache_only_nearer_cache_speed_than_memory_speed():
    from ortgate.runner.probe import at_cache_speed

    assert at_cache_speed(25.0, memory=10.0, in_cache=40.0)  # above the geometric midpoint, 20
    assert not at_cache_speed(15.0, memory=10.0, in_cache=40.0)
    assert not at_cache_speed(50.0, memory=10.0, in_cache=10.0)  # no faster cache to be served from


def test_run_shows_the_estimate_beside_the_measurement_and_writes_a_calibration_a_policy_can_name(tmp_path):
    cpu = tmp_path / "cpu.yaml"
    cpu.write_text("name: cpu-run\nextends: builtin:cpu\nthroughput: {device: cpu}\n"
                   "runner: {past_sequence_length: 8, warmup: 2, iterations: 10}\n")
    calibration = tmp_path / "calibration.yaml"
    fused_cpu = str(REPO / "examples" / "qwen3-moe-tiny-fused-cpu")
    code, out, err = run_cli("run", fused_cpu, "--policy", str(cpu), "--write-calibration", str(calibration),
                             "--exit-zero")
    assert code == 0 and calibration.is_file(), err
    [line] = [x for x in out.splitlines() if x.startswith("estimate   ")]
    assert "cpu (figures probed on this machine)" in line and "% of the estimate" in line
    written = yaml.safe_load(calibration.read_text())
    assert written["device"] == "cpu" and written["figures"]["bandwidth_gb_s"] > 0
    assert written["evidence"]["measured_ms_per_step_p50"] > 0
    calibrated = tmp_path / "calibrated.yaml"
    calibrated.write_text("name: cpu-calibrated\nextends: builtin:cpu\n"
                          "throughput: {device: cpu, calibration: calibration.yaml}\n")
    code, out, _ = run_cli("lint", fused_cpu, "--policy", str(calibrated))
    assert f"estimate  cpu (calibrated: {calibration})" in out
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("name: wrong\nthroughput: {device: h100-sxm, calibration: calibration.yaml}\n")
    code, _, err = run_cli("lint", fused_cpu, "--policy", str(wrong))
    assert code == 2 and "measured for device 'cpu'" in err
