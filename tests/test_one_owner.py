"""One root cause, one finding, one piece of advice: each fact has one owner rule, and no finding advises setting
an option that another finding says does not exist. Real exports, real policies, every rule."""

from __future__ import annotations

import json
import re

import pytest

from ortgate.findings import Kind
from ortgate.rules import find_rule
from tests.conftest import EXAMPLES, EXPORTED, POLICIES
from tests.helpers import lint_findings

H100 = POLICIES / "qwen3.6-35b-a3b-h100.yaml"
QWEN_FP16 = EXPORTED / "genai-qwen3_5_moe-fp16-cuda"
QWEN_FP32 = EXPORTED / "genai-qwen3_5_moe-fp32-cpu"
SEED_LIKE = """name: seed
execution_provider:
  name: CUDAExecutionProvider
  options: {enable_cuda_graph: "1", max_batch_size: "128", cuda_graph_enable_partial: "1"}
session:
  graph_optimization_level: ORT_ENABLE_ALL
  free_dimension_overrides: {batch_size: 1, sequence_length: 1}
  config_entries: {session.disable_cpu_ep_fallback: "1", session.disable_cpu_fallback: "1"}
"""


def _nonexistent_keys(found) -> set[str]:
    """Provider options and session config keys that a finding says do not exist."""
    keys = set()
    for f in found:
        props = dict(f.properties)
        if f.rule in ("unknown-provider-option", "provider-option-c-api-only"):
            keys.add(props["option"])
        elif f.rule == "unknown-session-config-key":
            keys.add(props["key"])
    return keys


def test_no_finding_advises_setting_an_option_another_finding_says_does_not_exist(write_policy):
    found = lint_findings(QWEN_FP16, write_policy(SEED_LIKE), config=QWEN_FP16 / "genai_config.json")
    gone = _nonexistent_keys(found)
    assert gone == {"max_batch_size", "cuda_graph_enable_partial", "session.disable_cpu_fallback"}
    for f in found:
        if f.rule in ("unknown-provider-option", "unknown-session-config-key"):
            continue
        said = f"{f.message} {f.fix or ''}"
        assert not [k for k in gone if re.search(rf"\b{re.escape(k)}\b", said)], (f.rule, said)


def test_a_key_the_provider_lacks_is_not_config_drift(write_policy, tmp_path):
    config = json.loads((QWEN_FP16 / "genai_config.json").read_text())
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(config, indent=4))
    found = lint_findings(QWEN_FP16 / "model.onnx", write_policy(SEED_LIKE), config=path,
                          select=["config-drift", "unknown-provider-option", "unknown-session-config-key"])
    drift = {dict(f.properties)["setting"] for f in found if f.rule == "config-drift"}
    assert not [s for s in drift if "max_batch_size" in s or "cuda_graph_enable_partial" in s]
    assert not [s for s in drift if "disable_cpu_fallback" in s and "disable_cpu_ep_fallback" not in s]
    assert sorted(dict(f.properties)["option"] for f in found if f.rule == "unknown-provider-option") == [
        "cuda_graph_enable_partial", "max_batch_size"]


def test_a_genai_value_that_differs_from_the_policy_is_config_drift_alone():
    # The builder's genai_config.json leaves the CPU-fallback guard unset and CUDA graph off; the policy sets both.
    found = lint_findings(QWEN_FP16, H100, config=QWEN_FP16 / "genai_config.json")
    genai = [f for f in found if f.location.file == str(QWEN_FP16 / "genai_config.json")]
    about = {}
    for f in genai:
        subject = "fallback" if "disable_cpu_ep_fallback" in f.message else "graph" if "cuda_graph" in f.message else None
        if subject:
            about.setdefault(subject, []).append(f.rule)
    assert about == {"fallback": ["config-drift"], "graph": ["config-drift"]}


def test_a_setting_neither_file_declares_is_one_finding_at_the_policy(write_policy):
    policy = write_policy("name: p\nexecution_provider: {name: CUDAExecutionProvider}\n")
    found = lint_findings(QWEN_FP16, policy, config=QWEN_FP16 / "genai_config.json",
                          select=["cpu-fallback-allowed", "config-drift"])
    assert [(f.rule, f.location.file) for f in found] == [("cpu-fallback-allowed", str(policy))]


def test_the_same_bad_value_in_both_files_is_reported_in_each(write_policy, tmp_path):
    config = json.loads((QWEN_FP16 / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["graph_optimization_level"] = "ORT_ENABLE_BASIC"
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps(config, indent=4))
    policy = write_policy("name: p\nsession: {graph_optimization_level: ORT_ENABLE_BASIC}\n"
                          "execution_provider: {name: CUDAExecutionProvider}\n")
    found = lint_findings(QWEN_FP16 / "model.onnx", policy, config=path,
                          select=["optimization-level-not-all", "config-drift"])
    assert sorted((f.rule, f.location.file) for f in found) == [
        ("optimization-level-not-all", str(path)), ("optimization-level-not-all", str(policy))]


def test_fp32_gqa_on_cuda_with_capture_is_one_error(write_policy):
    policy = write_policy('name: p\nsession:\n  free_dimension_overrides: {batch_size: 1, sequence_length: 1}\n'
                          'execution_provider:\n  name: CUDAExecutionProvider\n  options: {enable_cuda_graph: "1"}\n')
    found = lint_findings(QWEN_FP32 / "model.onnx", policy)
    gqa = [f for f in found if f.severity.label == "error" and "GroupQueryAttention" in f"{f.op_type} {f.message}"]
    assert [f.rule for f in gqa] == ["op-not-on-ep"]


def test_a_policy_counting_more_moe_layers_than_a_fused_graph_says_they_disagree(write_policy):
    found = lint_findings(QWEN_FP16, write_policy("name: p\nmodel: {moe_layers: 48}\n"))
    moe = [f for f in found if "MoE" in f.message and f.severity.label == "error"]
    assert [f.rule for f in moe] == ["moe-layer-count-mismatch"]
    assert "disagree on MoE layers: the policy expects 48" in moe[0].message
    assert "re-export" not in moe[0].message.lower()


def test_head_counts_that_differ_from_the_policy_are_a_config_mismatch_not_unfused_attention(write_policy):
    found = lint_findings(QWEN_FP16, write_policy("name: p\nmodel: {num_heads: 64, kv_num_heads: 2}\n"))
    heads = [f for f in found if "num_heads" in f.message]
    assert {f.rule for f in heads} == {"gqa-config-mismatch"}


CASES = [
    (EXAMPLES / "qwen3-moe-tiny-unfused", POLICIES / "tiny-moe-cpu.yaml"),
    (EXAMPLES / "qwen3-moe-tiny-fused", H100),
    (QWEN_FP32, H100),
    (EXPORTED / "genai-gpt_oss-fp32-cpu", POLICIES / "qwen3-30b-a3b-cuda.yaml"),
    (EXPORTED / "dynamo-qwen3_moe" / "model.onnx", H100),
]


@pytest.mark.parametrize("model, policy", CASES, ids=lambda p: p.name)
def test_every_finding_has_its_codes_severity_unless_it_is_not_a_violation(model, policy):
    for f in lint_findings(model, policy):
        rule = find_rule(f.code)
        if f.kind is Kind.VIOLATION:
            assert f.severity is rule.severity, (f.code, f.message)
        else:
            assert f.severity.label == "info", (f.code, f.message)
