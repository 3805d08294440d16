"""Provider rules (OGP): this policy (and genai_config.json), these findings, each pointing at the key's line."""

from __future__ import annotations

import json

import pytest

from tests.helpers import by_rule, lint_findings, run_cli

PROVIDER_RULES = ["OGP"]


def findings(model, policy=None, config=None, rule: str | None = None):
    found = lint_findings(model, policy, config=config, select=PROVIDER_RULES)
    return by_rule(found, rule) if rule else found


def write_genai(tmp_path, provider_options: dict, name: str = "genai_config.json", **session_options):
    options = {"log_id": "onnxruntime-genai", **session_options,
               "provider_options": [provider_options] if provider_options else []}
    path = tmp_path / name
    path.write_text(json.dumps({"model": {"decoder": {"session_options": options, "filename": "model.onnx"}},
                                "search": {"max_length": 256, "past_present_share_buffer": True}}, indent=4))
    return path


# cuda-graph-disabled ---------------------------------------------------------------------------------------

def test_cuda_graph_off_in_policy_points_at_the_option(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n'
                          '  options:\n    enable_cuda_graph: "0"\n')
    [found] = findings(make_model(), policy, rule="cuda-graph-disabled")
    assert found.location.line == 5 and found.location.key_path == "execution_provider.options.enable_cuda_graph"
    assert "enable_cuda_graph is '0'" in found.message


def test_cuda_graph_unset_in_genai_config_is_reported_at_the_provider(make_model, tmp_path):
    config = write_genai(tmp_path, {"cuda": {}})
    [found] = findings(make_model(), config=config, rule="cuda-graph-disabled")
    assert found.location.file == str(config) and "not set (default off)" in found.message


@pytest.mark.parametrize("value", ['"1"', "true", '"True"'])
def test_cuda_graph_on_passes(make_model, write_policy, value):
    policy = write_policy(f"name: p\nexecution_provider:\n  name: cuda\n  options: {{enable_cuda_graph: {value}}}\n")
    assert findings(make_model(), policy, rule="cuda-graph-disabled") == []


# unknown-provider-option -----------------------------------------------------------------------------------

def test_seed_options_are_unknown_with_a_suggestion(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n  options:\n"
                          "    enable_cuda_graph: true\n    cuda_graph_enable_partial: true\n    max_batch_size: 128\n")
    found = findings(make_model(), policy, rule="unknown-provider-option")
    assert [(f.location.line, dict(f.properties)["option"], dict(f.properties)["suggestion"]) for f in found] == [
        (6, "cuda_graph_enable_partial", "enable_cuda_graph"), (7, "max_batch_size", None)]
    assert "falls back to CPUExecutionProvider" in found[0].message


def test_c_api_only_tensorrt_option_is_rejected_from_python(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider:\n  name: tensorrt\n  options:\n"
                          '    has_user_compute_stream: "True"\n')
    [found] = findings(make_model(), policy, rule="provider-option-c-api-only")
    assert "only in the C/C++ API" in found.message and found.location.line == 5
    assert findings(make_model(), policy, rule="unknown-provider-option") == []


def test_unverified_cann_option_is_a_warning(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider:\n  name: cann\n  options:\n    precision_mode_v2: fp16\n")
    [found] = findings(make_model(), policy, rule="provider-option-unverified")
    assert found.severity.label == "warning" and "not a verified" in found.message
    assert findings(make_model(), policy, rule="unknown-provider-option") == []


def test_known_options_pass(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: cuda\n  options: {device_id: 0, use_tf32: "1"}\n')
    assert findings(make_model(), policy, rule="unknown-provider-option") == []


# provider-option-invalid-value -----------------------------------------------------------------------------

@pytest.mark.parametrize("key, value, problem", [
    ("enable_cuda_graph", '"yes"', 'expects a boolean'),
    ("arena_extend_strategy", "SameAsRequested", "did you mean 'kSameAsRequested'?"),
    ("device_id", "1.0", "expects an integer"),
    ("gpu_mem_limit", "-1", "expects a non-negative integer"),
])
def test_invalid_cuda_values(make_model, write_policy, key, value, problem):
    policy = write_policy(f"name: p\nexecution_provider:\n  name: cuda\n  options:\n    {key}: {value}\n")
    [found] = findings(make_model(), policy, rule="provider-option-invalid-value")
    assert problem in found.message and found.location.line == 5
    assert "falls back to CPUExecutionProvider" in found.message


def test_tensorrt_bool_from_python_must_be_true_or_false(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: tensorrt\n  options:\n'
                          '    trt_fp16_enable: "1"\n    trt_engine_cache_enable: "True"\n')
    [found] = findings(make_model(), policy, rule="provider-option-invalid-value")
    assert dict(found.properties)["option"] == "trt_fp16_enable"
    assert "True/False/true/false" in found.message


def test_invalid_value_in_genai_config_fails_genai(make_model, tmp_path):
    config = write_genai(tmp_path, {"cuda": {"enable_cuda_graph": "on"}})
    [found] = findings(make_model(), config=config, rule="provider-option-invalid-value")
    assert found.location.file == str(config) and "onnxruntime-genai fails" in found.message


def test_valid_values_pass(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: cuda\n  options:\n'
                          "    enable_cuda_graph: true\n    arena_extend_strategy: kSameAsRequested\n"
                          "    device_id: 0\n")
    assert findings(make_model(), policy, rule="provider-option-invalid-value") == []


# tf32-disabled ---------------------------------------------------------------------------------------------

TF32_OFF = 'name: p\nexecution_provider:\n  name: cuda\n  options: {use_tf32: "0"}\n'


def test_tf32_off_for_a_float32_model(make_model, write_policy):
    [found] = findings(make_model(dtype="float32"), write_policy(TF32_OFF), rule="tf32-disabled")
    assert "float32 GEMMs" in found.message and "MatMul x7" in found.message
    assert found.location.key_path == "execution_provider.options.use_tf32"


def test_tf32_off_for_a_float16_model_passes(make_model, write_policy):
    assert findings(make_model(dtype="float16"), write_policy(TF32_OFF), rule="tf32-disabled") == []


def test_tf32_default_passes(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider:\n  name: cuda\n")
    assert findings(make_model(dtype="float32"), policy, rule="tf32-disabled") == []


# compile-cache-disabled ------------------------------------------------------------------------------------

def test_tensorrt_without_engine_cache(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: TensorrtExecutionProvider\n'
                          '  options: {trt_fp16_enable: "True"}\n')
    found = [f for f in findings(make_model(), policy) if "cache" in f.rule]
    assert [(f.rule, f.severity.label, dict(f.properties)["option"]) for f in found] == [
        ("compile-cache-disabled", "warning", "trt_engine_cache_enable"),
        ("trt-timing-cache-disabled", "info", "trt_timing_cache_enable")]
    assert "rebuilds the TensorRT engines" in found[0].message


def test_tensorrt_with_both_caches_passes(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: TensorrtExecutionProvider\n  options:\n'
                          '    trt_engine_cache_enable: "True"\n    trt_timing_cache_enable: "True"\n')
    assert findings(make_model(), policy, rule="compile-cache-disabled") == []
    assert findings(make_model(), policy, rule="trt-timing-cache-disabled") == []


def test_ep_context_dump_counts_as_a_compiled_graph_cache(make_model, write_policy):
    policy = write_policy('name: p\nsession:\n  config_entries: {ep.context_enable: "1"}\n'
                          'execution_provider:\n  name: TensorrtExecutionProvider\n'
                          '  options: {trt_timing_cache_enable: "True"}\n')
    assert findings(make_model(), policy, rule="compile-cache-disabled") == []
    assert findings(make_model(), policy, rule="trt-timing-cache-disabled") == []


def test_cuda_has_no_compile_cache_to_enable(make_model, write_policy):
    assert findings(make_model(), write_policy("name: p\nexecution_provider: {name: cuda}\n"),
                    rule="compile-cache-disabled") == []


# cann-graph-disabled ---------------------------------------------------------------------------------------

def test_cann_graph_off(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: CANNExecutionProvider\n'
                          '  options:\n    enable_cann_graph: "0"\n')
    [found] = findings(make_model(), policy, rule="cann-graph-disabled")
    assert found.location.line == 5 and "single operator" in found.message


@pytest.mark.parametrize("options", ["{}", '{enable_cann_graph: "1"}'])
def test_cann_graph_default_or_on_passes(make_model, write_policy, options):
    policy = write_policy(f"name: p\nexecution_provider:\n  name: cann\n  options: {options}\n")
    assert findings(make_model(), policy, rule="cann-graph-disabled") == []


# bad input: exit 2, one line naming the file and the key -------------------------------------------------

def test_unknown_provider_name_is_an_input_error(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider:\n  name: CUDAExecutionProvder\n")
    code, out, err = run_cli("lint", make_model(), "--policy", policy)
    assert code == 2 and out == ""
    assert err.strip() == (f"ortgate: error: {policy}:3: execution_provider.name: unknown execution provider "
                           "'CUDAExecutionProvder'; did you mean 'CUDAExecutionProvider'?")


def test_option_of_the_wrong_type_is_an_input_error(make_model, write_policy):
    policy = write_policy("name: p\nexecution_provider:\n  name: cuda\n  options:\n    enable_cuda_graph: [1]\n")
    code, _, err = run_cli("lint", make_model(), "--policy", policy)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith(f"ortgate: error: {policy}:5: execution_provider.options.enable_cuda_graph: expected")
