"""config-drift: this policy, this genai_config.json, these disagreements (at the genai_config.json line,
naming the policy's file and line); and genai_config.json files ortgate cannot read."""

from __future__ import annotations

import json
import shutil

from tests.conftest import EXPORTED, POLICIES
from tests.helpers import by_rule, lint_findings, run_cli

H100 = POLICIES / "qwen3.6-35b-a3b-h100.yaml"
QWEN_FP16 = EXPORTED / "genai-qwen3_5_moe-fp16-cuda"


def drift(model, policy, config):
    return by_rule(lint_findings(model, policy, config=config, select=["config-drift"]), "config-drift")


def write_genai(tmp_path, provider_options: dict | None, **session_options):
    options = {"log_id": "onnxruntime-genai", **session_options}
    if provider_options is not None:
        options["provider_options"] = [provider_options]
    path = tmp_path / "genai_config.json"
    path.write_text(json.dumps({"model": {"decoder": {"session_options": options, "filename": "model.onnx"}}},
                               indent=4))
    return path


def test_builder_config_drifts_from_a_cuda_graph_policy():
    found = drift(QWEN_FP16, H100, QWEN_FP16 / "genai_config.json")
    settings = {dict(f.properties)["setting"]: f for f in found}
    assert sorted(settings) == ["CUDAExecutionProvider option enable_cuda_graph",
                                "session config entry session.disable_cpu_ep_fallback"]
    graph = settings["CUDAExecutionProvider option enable_cuda_graph"]
    assert graph.location.file == str(QWEN_FP16 / "genai_config.json") and graph.location.line == 11
    policy_line = dict(graph.properties)["policy_location"]
    assert policy_line == f"{H100}:{_line_of(H100, 'enable_cuda_graph')}"
    assert f"genai_config.json has '0', the policy ({policy_line}) has '1'" in graph.message


def test_rebuilt_with_cuda_graph_only_the_fallback_guard_drifts(tmp_path):
    config = tmp_path / "genai_config.json"
    shutil.copy(QWEN_FP16 / "genai_config.enable_cuda_graph.json", config)
    found = drift(QWEN_FP16, H100, config)
    assert [dict(f.properties)["setting"] for f in found] == ["session config entry session.disable_cpu_ep_fallback"]


def test_matching_configs_pass(tmp_path, make_model, write_policy):
    policy = write_policy('name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_ALL\n'
                          '  config_entries: {session.disable_cpu_ep_fallback: "1"}\n'
                          'execution_provider:\n  name: CUDAExecutionProvider\n  options: {enable_cuda_graph: true}\n')
    config = write_genai(tmp_path, {"cuda": {"enable_cuda_graph": "1"}},
                         **{"session.disable_cpu_ep_fallback": "1", "graph_optimization_level": "ORT_ENABLE_ALL"})
    assert drift(make_model(), policy, config) == []


def test_different_provider(tmp_path, make_model, write_policy):
    config = write_genai(tmp_path, None)  # no provider_options: genai runs on CPU
    [found] = drift(make_model(), write_policy("name: p\nexecution_provider: {name: cuda}\n"), config)
    assert "execution provider" in found.message and "'CPUExecutionProvider'" in found.message


def test_optimization_level_and_threads(tmp_path, make_model, write_policy):
    policy = write_policy("name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_ALL\n  intra_op_num_threads: 4\n"
                          "execution_provider: {name: cuda}\n")
    config = write_genai(tmp_path, {"cuda": {}}, graph_optimization_level="ORT_ENABLE_BASIC", intra_op_num_threads=8)
    found = lint_findings(make_model(), policy, config=config, select=["config-drift", "session-option-drift"])
    assert [(f.rule, dict(f.properties)["setting"], f.severity.label) for f in found] == [
        ("config-drift", "graph_optimization_level", "error"),
        ("session-option-drift", "session option intra_op_num_threads", "warning")]


def test_option_left_at_its_default_on_both_sides_passes(tmp_path, make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: cuda\n  options: {use_tf32: "1"}\n')
    assert drift(make_model(), policy, write_genai(tmp_path, {"cuda": {}})) == []


def test_no_genai_config_no_drift(make_model):
    assert drift(make_model(), H100, None) == []


def _line_of(path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if key in line)


# genai_config.json ortgate cannot read: exit 2, one line naming the file and the key -----------------------

def test_genai_config_that_is_not_json(make_model, tmp_path):
    config = tmp_path / "genai_config.json"
    config.write_text('{"model": {"decoder": ')
    code, out, err = run_cli("lint", make_model(), "--config", config)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"ortgate: error: {config}:1: not valid JSON")


def test_genai_config_without_a_decoder(make_model, tmp_path):
    config = tmp_path / "genai_config.json"
    config.write_text(json.dumps({"model": {"type": "qwen3_5_moe_text"}}, indent=2))
    code, _, err = run_cli("lint", make_model(), "--config", config)
    assert code == 2
    assert err.strip() == (f"ortgate: error: {config}:2: model.decoder: missing "
                           "(not an onnxruntime-genai genai_config.json?)")


def test_genai_config_with_an_unknown_provider(make_model, tmp_path):
    config = write_genai(tmp_path, {"cudaa": {"enable_cuda_graph": "1"}})
    code, _, err = run_cli("lint", make_model(), "--config", config)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "model.decoder.session_options.provider_options[0].cudaa: unknown execution provider 'cudaa'" in err


def test_genai_config_with_a_non_string_option(make_model, tmp_path):
    config = write_genai(tmp_path, {"cuda": {"enable_cuda_graph": 1}})
    code, _, err = run_cli("lint", make_model(), "--config", config)
    assert code == 2 and "enable_cuda_graph: provider option values must be strings, got int 1" in err


# which side to change: never toward a value another rule rejects ---------------------------------------------

def test_drift_advice_never_copies_a_policy_value_another_rule_rejects(tmp_path, make_model, write_policy):
    """The policy asks for ORT_ENABLE_BASIC and CUDA graph off, which optimization-level-not-all and
    cuda-graph-disabled reject; genai_config.json has what those rules want. The drift's fix changes the policy."""
    policy = write_policy('name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_BASIC\n'
                          'execution_provider:\n  name: CUDAExecutionProvider\n  options: {enable_cuda_graph: "0"}\n')
    config = write_genai(tmp_path, {"cuda": {"enable_cuda_graph": "1"}}, graph_optimization_level="ORT_ENABLE_ALL")
    found = lint_findings(make_model(), policy, config=config,
                          select=["config-drift", "optimization-level-not-all", "cuda-graph-disabled"])
    drifts = {dict(f.properties)["setting"]: f for f in found if f.rule == "config-drift"}
    assert sorted(drifts) == ["CUDAExecutionProvider option enable_cuda_graph", "graph_optimization_level"]
    level, graph = drifts["graph_optimization_level"], drifts["CUDAExecutionProvider option enable_cuda_graph"]
    for f, bad, rejecting in ((level, "ORT_ENABLE_BASIC", "optimization-level-not-all"),
                              (graph, "'0'", "cuda-graph-disabled")):
        assert f.fix.startswith(f"Change the policy ({policy}:"), f.fix
        assert rejecting in f.fix and "genai_config.json's value" in f.fix
        assert f"Set \"{'graph_optimization_level' if f is level else 'enable_cuda_graph'}\": \"{bad.strip(chr(39))}" \
               not in f.fix
        assert dict(f.properties)["change"] == "policy"
    # the rejecting rules still report the policy's values
    assert {f.rule for f in found} >= {"optimization-level-not-all", "cuda-graph-disabled"}


def test_drift_with_a_rejected_value_on_both_sides_advises_what_the_rule_wants(tmp_path, make_model, write_policy):
    policy = write_policy("name: p\nsession: {graph_optimization_level: ORT_ENABLE_BASIC}\n"
                          "execution_provider: {name: CUDAExecutionProvider}\n")
    config = write_genai(tmp_path, {"cuda": {}}, graph_optimization_level="ORT_ENABLE_EXTENDED")
    [f] = drift(make_model(), policy, config)
    assert "both" in f.fix and "ORT_ENABLE_ALL" in f.fix and "optimization-level-not-all" in f.fix
    assert "\"ORT_ENABLE_BASIC\"" not in f.fix and "\"ORT_ENABLE_EXTENDED\"" not in f.fix
    assert dict(f.properties)["change"] == "both"


def test_drift_toward_the_policy_names_genai_config_json_as_the_side_to_change(tmp_path, make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n'
                          '  options: {enable_cuda_graph: "1"}\n')
    [f] = drift(make_model(), policy, write_genai(tmp_path, {"cuda": {"enable_cuda_graph": "0"}}))
    assert f.fix.startswith("Change genai_config.json:") and "\"enable_cuda_graph\": \"1\"" in f.fix
    assert dict(f.properties)["change"] == "genai_config"
