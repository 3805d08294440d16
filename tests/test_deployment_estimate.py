"""Memory fit, the prompt phase and the batch sweep of the estimate: what a deployment needs on its device, the
time to the first token, and what batching buys (ortgate/cost/memory.py, ortgate/cost/sweep.py)."""

from __future__ import annotations

import json
import sys

import onnx
import pytest

from ortgate.cost import CostSetup, StepShape, estimate, expected_experts
from ortgate.cost.memory import memory_estimate, weight_bytes
from ortgate.cost.sweep import batch_sweep, moe_crossover, prefill
from ortgate.engine.pipeline import LintRequest, load_inputs
from ortgate.engine.throughput import CostOverrides
from ortgate.graph import build_graph
from ortgate.knowledge.devices import find_device
from tests.conftest import REPO
from tests.helpers import run_cli
from tests.rule_inputs import model_from_text

FUSED = str(REPO / "examples" / "qwen3-moe-tiny-fused")
GENAI_QWEN = REPO / "tests" / "fixtures" / "exported" / "genai-qwen3_5_moe-fp16-cuda"

TIED = """
<ir_version: 10, opset_import: ["" : 21]>
tied (int64[1, 1] ids) => (float[1, 1, 64] logits) <float[64, 16] emb>
{
  h = Gather (emb, ids)
  logits = MatMul (h, t)
  t = Transpose <perm = [1, 0]> (emb)
}
"""


def test_a_tied_embedding_is_counted_once(tmp_path):
    graph = build_graph(model_from_text(TIED), "tied.onnx")
    total, by_dtype, unsized = weight_bytes(graph)
    assert total == 64 * 16 * 4 and by_dtype == {"float": 64 * 16 * 4} and unsized == []


def test_weights_are_sized_from_dims_and_external_data_lengths_never_read(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(model_from_text(TIED), path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=0)
    (tmp_path / "model.onnx.data").unlink()  # the linter never opens it
    inputs = load_inputs(LintRequest(str(path), cost=CostOverrides("h100-sxm")))
    assert inputs.model.initializers["emb"].external and inputs.model.initializers["emb"].external_length == 4096
    assert inputs.memory.part("weights") == 4096


def test_the_kv_cache_grows_with_batch_and_length_and_a_shared_buffer_is_held_once():
    inputs = load_inputs(LintRequest(FUSED, cost=CostOverrides("h200", 1, 1024)))
    est = inputs.estimate
    kv = [inputs.memory.part("kv_cache")]
    for batch, length, shared in ((4, 1024, False), (4, 4096, False), (4, 4096, True)):
        kv.append(memory_estimate(inputs.model, est.model, est.device, batch=batch, kv_length=length, kv_source="t",
                                  shared_buffer=shared).part("kv_cache"))
    # float16, 2 layers x (K + V) x 2 kv heads x head 16: 256 bytes a position; past and present both alive
    assert kv == [2 * 256 * 1024, 2 * 4 * 256 * 1024, 2 * 4 * 256 * 4096, 4 * 256 * 4096]


def test_genai_max_length_with_a_shared_buffer_is_the_kv_length():
    inputs = load_inputs(LintRequest(str(GENAI_QWEN), cost=CostOverrides("l4")))
    mem = inputs.memory
    assert mem.shared_buffer and mem.kv_length == 512 and "search.max_length" in mem.kv_source
    assert mem.at_full_context  # the builder wrote max_length = context_length
    assert mem.part("linear_state") > 0  # Qwen3.5's linear-attention layers
    assert mem.kv_at(256) < mem.part("kv_cache") and mem.length_fitting(0.9) > mem.kv_length


def test_a_full_context_buffer_is_told_which_max_length_fits(tmp_path):
    config = json.loads((GENAI_QWEN / "genai_config.json").read_text())
    config["model"]["context_length"] = config["search"]["max_length"] = 1 << 22
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(config))
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: p\nthroughput: {device: l4, batch_size: 64}\n")
    code, out, _ = run_cli("lint", str(GENAI_QWEN / "model.onnx"), "--config", str(path), "--policy", str(policy),
                           "--select", "OGT004", "--format", "json")
    [found] = json.loads(out)["findings"]
    assert code == 1 and "onnxruntime-genai#2251" in found["message"] and "a search.max_length of" in found["message"]
    fits = int(found["message"].split("a search.max_length of ")[1].split()[0].replace(",", ""))
    inputs = load_inputs(LintRequest(str(GENAI_QWEN / "model.onnx"), str(policy), config=str(path)))
    mem = inputs.memory
    assert mem.total - mem.part("kv_cache") + mem.kv_at(fits) <= 0.9 * mem.capacity
    assert mem.total - mem.part("kv_cache") + mem.kv_at(fits + 512) > 0.9 * mem.capacity


def test_experts_the_prompt_touches_follow_the_expected_count():
    inputs = load_inputs(LintRequest(FUSED, cost=CostOverrides("h100-sxm")))
    pre = prefill(inputs.executed, inputs.cost, 3)
    [form, *_] = pre.model.moe_forms
    assert form.experts_read == pytest.approx(expected_experts(form.experts, form.top_k, 3))
    one = estimate(inputs.executed, CostSetup(inputs.cost.device, StepShape(1, 1, 3), inputs.cost.provider))
    assert pre.as_exported.totals.flops > 2.5 * one.as_exported.totals.flops  # 3 tokens' GEMMs, not 1


def test_the_batch_sweep_reads_more_experts_and_the_moe_turns_compute_bound():
    inputs = load_inputs(LintRequest(FUSED, cost=CostOverrides("h100-sxm")))
    points = batch_sweep(inputs.executed, inputs.cost, [1, 2, 64])
    assert [p.batch for p in points] == [1, 2, 64]
    assert points[0].experts_read < points[1].experts_read <= points[2].experts_read <= 4
    assert points[2].tokens_per_s_device > points[0].tokens_per_s_device
    cross = moe_crossover(inputs.executed, inputs.cost)
    assert cross is not None and cross > 1
    below, at = (batch_sweep(inputs.executed, inputs.cost, [cross - 1, cross]))
    assert below.moe_bound == "bandwidth" and at.moe_bound == "compute"
    dense = load_inputs(LintRequest(str(REPO / "tests/fixtures/exported/genai0.13-qwen3-fp32-cpu"),
                                    cost=CostOverrides("h100-sxm")))
    assert moe_crossover(dense.executed, dense.cost) is None


def test_estimate_prints_memory_prefill_and_a_batch_sweep():
    code, out, err = run_cli("estimate", FUSED, "--device", "h100-sxm", "--batch", "1,8,32,128", "--prompt", "512")
    assert code == 0 and err == ""
    assert "memory " in out and "fits" in out and "not counted (ortgate cannot see them)" in out
    assert "prefill   512 prompt tokens x batch 1: time to first token" in out
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0] in ("1", "8", "32", "128")]
    assert [r[0] for r in rows] == ["1", "8", "32", "128"]
    assert "the MoE layers stop being bandwidth-bound at batch" in out
    code, out, _ = run_cli("estimate", FUSED, "--device", "h100-sxm", "--batch", "1,8", "--prompt", "64",
                           "--format", "json")
    data = json.loads(out)
    assert [b["batch_size"] for b in data["batches"]] == [1, 8] and data["batch_size"] == 1
    assert data["prefill"]["prompt_length"] == 64 and data["memory"]["total_bytes"] > 0


@pytest.mark.parametrize("flag", [("--batch", "1,0"), ("--batch", "1,x"), ("--batch", "4,"), ("--prompt", "0"),
                                  ("--prompt", "-3")])
def test_batch_lists_and_prompts_must_be_positive_integers(flag):
    code, out, err = run_cli("estimate", FUSED, "--device", "h100-sxm", *flag)
    assert code == 2 and out == "" and flag[0] in err and "Traceback" not in err


@pytest.mark.parametrize("flag", [
    ("--prompt", "9" * 300), ("--batch", "1" + "0" * 200), ("--context", str(10 ** 30)), ("--batch", "65537"),
    ("--context", "\uff11\uff12"), ("--prompt", "\u0661\u0662"), ("--batch", "1_000"), ("--batch", "+8"),
    ("--batch", ",".join(["1"] * 200_000)), ("--batch", "1," + "2" * 400),
])
def test_numbers_beyond_the_policys_bounds_or_not_in_ascii_digits_are_one_line_exit_2(flag):
    """--batch / --prompt / --context are held to the policy's throughput: bounds (ASCII digits, a stated maximum,
    a stated number of sweep entries): no overflow, no nonsense estimate, no minutes spent on a sweep."""
    code, out, err = run_cli("estimate", FUSED, "--device", "h100-sxm", *flag)
    assert code == 2 and out == "" and err.count("\n") == 1 and flag[0] in err and "internal error" not in err
    assert len(err) < 400


def test_the_command_line_and_the_policy_share_their_bounds(tmp_path):
    from ortgate.config.throughput import step_bounds

    bounds = step_bounds()
    code, _, _ = run_cli("estimate", FUSED, "--device", "h100-sxm", "--batch", str(bounds.batch), "--context",
                         str(bounds.context), "--prompt", "1", "--format", "json")
    assert code == 0
    policy = tmp_path / "p.yaml"
    for key, value in (("batch_size", bounds.batch + 1), ("context_length", bounds.context + 1),
                       ("prompt_length", bounds.prompt + 1), ("batch_sizes", list(range(1, bounds.batch_sizes + 2)))):
        policy.write_text(f"name: p\nthroughput: {{device: l4, {key}: {value}}}\n")
        code, _, err = run_cli("estimate", FUSED, "--policy", str(policy))
        assert code == 2 and key in err, (key, err)


def test_a_policy_batch_list_is_swept(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nthroughput: {device: l4, batch_sizes: [2, 4]}\n")
    code, out, _ = run_cli("estimate", FUSED, "--policy", str(policy), "--format", "json")
    assert code == 0 and [b["batch_size"] for b in json.loads(out)["batches"]] == [2, 4]
    policy.write_text("name: p\nthroughput: {device: l4, batch_sizes: [2, 0]}\n")
    code, _, err = run_cli("estimate", FUSED, "--policy", str(policy))
    assert code == 2 and "batch_sizes" in err


def test_a_fit_check_on_a_device_without_a_memory_figure_names_the_key(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nthroughput: {device: cpu, max_memory_share: 0.8}\n")
    code, _, err = run_cli("lint", FUSED, "--policy", str(policy))
    assert code == 2 and "throughput.max_memory_share" in err and "memory_gib" in err and err.count("\n") == 1


def test_a_ttft_target_is_judged_on_the_prompt_phase(tmp_path):
    inputs = load_inputs(LintRequest(FUSED, cost=CostOverrides("h100-sxm")))
    pre = prefill(inputs.executed, inputs.cost, 4096).as_exported
    policy = tmp_path / "p.yaml"
    for target, rule in ((pre.ceiling_s * 1e3 / 2, "throughput-below-policy"),
                         ((pre.ceiling_s + pre.expected_s) * 1e3 / 2, "throughput-below-estimate"),
                         (pre.expected_s * 1e3 * 2, None)):
        policy.write_text(f"name: p\nthroughput: {{device: h100-sxm, prompt_length: 4096, max_ttft_ms: {target}}}\n")
        code, out, _ = run_cli("lint", FUSED, "--policy", str(policy), "--select", "OGT001,OGT002", "--format", "json")
        found = json.loads(out)["findings"]
        assert [f["rule"] for f in found] == ([rule] if rule else []), target
        if rule:
            assert "to the first token" in found[0]["message"]
    policy.write_text("name: p\nthroughput: {device: h100-sxm, max_ttft_ms: 10}\n")
    code, _, err = run_cli("lint", FUSED, "--policy", str(policy))
    assert code == 2 and "throughput.prompt_length" in err


def test_device_memory_figures_carry_source_and_confidence():
    for name in ("h100-sxm", "h200", "a100-40gb", "mi300x", "b200", "ascend-910b"):
        d = find_device(name)
        assert d.memory_gib.value and d.memory_gib.source and d.memory_gib.confidence
    assert find_device("cpu").memory_gib.value is None
    assert find_device("h200").memory_bytes == 141 * 2**30


def test_a_decode_step_of_the_estimate_is_unchanged_by_the_sweep():
    inputs = load_inputs(LintRequest(FUSED, cost=CostOverrides("h100-sxm", 8)))
    [p] = batch_sweep(inputs.executed, inputs.cost, [8])
    alone = estimate(inputs.executed, CostSetup(inputs.cost.device, StepShape(8, 1, inputs.cost.shape.context),
                                                inputs.cost.provider, inputs.cost.optimization_level,
                                                inputs.cost.cuda_graph))
    assert p.step_s == pytest.approx(alone.as_exported.expected_s)


def test_the_published_figures_table_in_the_docs_is_what_the_benchmark_prints(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("published_figures", REPO / "benchmarks" / "published_figures.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_figures"] = module  # its dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["published_figures"]
    doc = module.DOC.read_text(encoding="utf-8")
    shown = doc.split(module.BEGIN, 1)[1].split(module.END, 1)[0].strip()
    assert shown == module.table(tmp_path).strip(), "run python benchmarks/published_figures.py --write"
