"""Session rules (OGS): this graph, this policy (and genai_config.json), these findings.

Where a rule rests on what ONNX Runtime does with a setting (ignores it, rejects it at run time, raises), a test
shows that behaviour on a real CPU session of the same model.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.helpers import by_rule, lint_findings
from tests.models.qwen_moe import make_feeds

DECODE = "  free_dimension_overrides: {batch_size: 1, sequence_length: 1}\n"


def findings(model, policy=None, config=None, rule: str | None = None):
    found = lint_findings(model, policy, config=config, select=["OGS"])
    return by_rule(found, rule) if rule else found


def write_genai(tmp_path, *, share_buffer: bool | None = True, max_length: int = 256, **session_options):
    search = {"max_length": max_length}
    if share_buffer is not None:
        search["past_present_share_buffer"] = share_buffer
    path = tmp_path / "genai_config.json"
    options = {"log_id": "onnxruntime-genai", **session_options, "provider_options": [{"cuda": {}}]}
    path.write_text(json.dumps({"model": {"decoder": {"session_options": options}}, "search": search}, indent=4))
    return path


def session(model, **overrides) -> ort.InferenceSession:
    so = ort.SessionOptions()
    for name, value in overrides.items():
        so.add_free_dimension_override_by_name(name, value)
    return ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])


# optimization-level-not-all ------------------------------------------------------------------------------

def test_basic_level_is_reported(make_model, write_policy):
    policy = write_policy("name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_BASIC\n")
    [found] = findings(make_model(), policy, rule="optimization-level-not-all")
    assert found.location.line == 3 and "no SimplifiedLayerNormalization" in found.message


def test_level_all_or_unset_passes(make_model, write_policy):
    assert findings(make_model(), write_policy("name: p\nsession:\n  graph_optimization_level: ORT_ENABLE_ALL\n"),
                    rule="optimization-level-not-all") == []
    unset = write_policy("name: p\nsession:\n" + DECODE)
    assert findings(make_model(), unset, rule="optimization-level-not-all") == []


# free-dim-override-missing -------------------------------------------------------------------------------

def test_unpinned_step_dims_are_missing_but_kv_dims_are_not(make_model, write_policy):
    policy = write_policy("name: p\nsession: {graph_optimization_level: ORT_ENABLE_ALL}\n")
    found = findings(make_model(), policy, rule="free-dim-override-missing")
    assert [dict(f.properties)["dim"] for f in found] == ["batch_size", "sequence_length"]
    assert all(f.severity.label == "warning" for f in found)


def test_missing_dims_are_errors_under_cuda_graph(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: cuda\n  options: {enable_cuda_graph: "1"}\n')
    found = findings(make_model(), policy, rule="capture-dim-not-pinned")
    assert {f.severity.label for f in found} == {"error"} and len(found) == 2
    assert all("CUDA graph capture needs fixed shapes" in f.message for f in found)
    assert findings(make_model(), policy, rule="free-dim-override-missing") == []


def test_static_kv_buffer_suggests_pinning_past_length_only(make_model, write_policy, tmp_path):
    found = findings(make_model(), write_policy("name: p\nsession:\n" + DECODE), write_genai(tmp_path),
                     rule="static-kv-dim-not-pinned")
    assert [(dict(f.properties)["dim"], f.severity.label) for f in found] == [("past_sequence_length", "info")]
    assert "past_sequence_length: 256" in found[0].fix


def test_decode_dims_pinned_passes(make_model, write_policy):
    assert findings(make_model(), write_policy("name: p\nsession:\n" + DECODE), rule="free-dim-override-missing") == []


# free-dim-override-unknown -------------------------------------------------------------------------------

def test_seed_seq_len_names_no_input_dim(make_model, write_policy):
    model = make_model()
    policy = write_policy("name: p\nsession:\n  free_dimension_overrides:\n    batch_size: 1\n    seq_len: 1\n")
    [found] = findings(model, policy, rule="free-dim-override-unknown")
    assert found.location.line == 5 and dict(found.properties)["suggestion"] == "sequence_length"
    assert "did you mean 'sequence_length'?" in found.message
    # ORT accepts the name and pins nothing: the input keeps its symbolic dim.
    assert session(model, seq_len=1).get_inputs()[0].shape == ["batch_size", "sequence_length"]
    assert session(model, sequence_length=1).get_inputs()[0].shape == ["batch_size", 1]


def test_output_only_dim_is_explained(make_model, write_policy):
    model = make_model()
    proto = onnx.load(model)
    for output in proto.graph.output[1:]:  # present.*: [batch_size, 2, present_sequence_length, 16]
        output.type.tensor_type.shape.dim[2].dim_param = "present_sequence_length"
    onnx.save(proto, model)
    policy = write_policy("name: p\nsession:\n  free_dimension_overrides: {present_sequence_length: 8}\n")
    [found] = findings(model, policy, rule="free-dim-override-unknown")
    assert "appears on graph outputs only" in found.message
    # ORT applies overrides to inputs only: the output dim stays symbolic.
    assert session(model, present_sequence_length=8).get_outputs()[1].shape[2] == "present_sequence_length"


def test_real_dims_pass(make_model, write_policy):
    assert findings(make_model(), write_policy("name: p\nsession:\n" + DECODE), rule="free-dim-override-unknown") == []


# free-dim-override-conflict ------------------------------------------------------------------------------

PIN_PAST = ("name: p\nsession:\n"
            "  free_dimension_overrides: {batch_size: 1, sequence_length: 1, past_sequence_length: 4}\n")


def test_pinned_past_length_without_static_buffer(make_model, write_policy, tmp_path):
    model = make_model()
    [found] = findings(model, write_policy(PIN_PAST), write_genai(tmp_path, share_buffer=False),
                       rule="free-dim-override-conflict")
    assert found.severity.label == "error" and "grows by one token every decode step" in found.message
    # ORT rejects the next step, whose past holds 5 tokens.
    sess = session(model, batch_size=1, sequence_length=1, past_sequence_length=4)
    sess.run(None, make_feeds(model, batch=1, seq=1, past=4))
    with pytest.raises(Exception, match="invalid dimensions"):
        sess.run(None, make_feeds(model, batch=1, seq=1, past=5))


def test_pinned_past_length_without_genai_config_is_a_warning(make_model, write_policy):
    [found] = findings(make_model(), write_policy(PIN_PAST), rule="kv-dim-pinned")
    assert found.severity.label == "warning" and "no genai_config.json" in found.message
    assert findings(make_model(), write_policy(PIN_PAST, "p2.yaml"), rule="free-dim-override-conflict") == []


def test_pinned_past_length_must_be_the_static_buffer_length(make_model, write_policy, tmp_path):
    [found] = findings(make_model(), write_policy(PIN_PAST), write_genai(tmp_path, max_length=256),
                       rule="free-dim-override-conflict")
    assert "search.max_length = 256" in found.message


def test_two_batch_dims_pinned_differently(make_model, write_policy):
    model = make_model()
    proto = onnx.load(model)
    proto.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "batch"  # attention_mask: [batch, ...]
    onnx.save(proto, model)
    policy = write_policy("name: p\nsession:\n"
                          "  free_dimension_overrides: {batch: 2, batch_size: 1, sequence_length: 1}\n")
    [found] = findings(model, policy, rule="free-dim-override-conflict")
    assert dict(found.properties)["conflicts_with"] == "batch" and found.location.line == 3


def test_past_pinned_to_the_static_buffer_passes(make_model, write_policy, tmp_path):
    policy = write_policy(PIN_PAST.replace("past_sequence_length: 4", "past_sequence_length: 256"))
    assert findings(make_model(), policy, write_genai(tmp_path), rule="free-dim-override-conflict") == []


def test_step_dims_only_pass(make_model, write_policy):
    assert findings(make_model(), write_policy("name: p\nsession:\n" + DECODE), rule="free-dim-override-conflict") == []


# free-dim-override-range ---------------------------------------------------------------------------------

def test_range_is_reported_and_ort_cannot_take_it(make_model, write_policy):
    policy = write_policy("name: p\nsession:\n  free_dimension_overrides:\n    batch_size: [1, 128]\n"
                          "    sequence_length: 1\n")
    [found] = findings(make_model(), policy, rule="free-dim-override-range")
    assert found.location.line == 4 and dict(found.properties)["values"] == [1, 128]
    assert "add_free_dimension_override_by_name('batch_size', 1, 128) raises TypeError" in found.message
    with pytest.raises(TypeError):
        ort.SessionOptions().add_free_dimension_override_by_name("batch_size", 1, 128)


def test_single_values_pass(make_model, write_policy):
    assert findings(make_model(), write_policy("name: p\nsession:\n" + DECODE), rule="free-dim-override-range") == []


# cpu-fallback-allowed ------------------------------------------------------------------------------------

def test_gpu_policy_without_fallback_guard(make_model, write_policy):
    [found] = findings(make_model(), write_policy("name: p\nexecution_provider: {name: cuda}\n"),
                       rule="cpu-fallback-allowed")
    assert found.severity.label == "warning"
    assert found.location.key_path == "session.config_entries.session.disable_cpu_ep_fallback"


def test_fallback_guard_must_be_the_string_one(make_model, write_policy):
    policy = write_policy('name: p\nsession:\n  config_entries: {session.disable_cpu_ep_fallback: "true"}\n'
                          "execution_provider: {name: cuda}\n")
    [found] = findings(make_model(), policy, rule="cpu-fallback-allowed")
    assert "is 'true' (ORT honours only \"1\")" in found.message and found.location.line == 3


def test_cuda_graph_already_guards_compute_nodes(make_model, write_policy):
    policy = write_policy('name: p\nexecution_provider:\n  name: cuda\n  options: {enable_cuda_graph: "1"}\n')
    assert findings(make_model(), policy, rule="cpu-fallback-allowed") == []


def test_genai_config_without_guard(make_model, tmp_path):
    [found] = findings(make_model(), config=write_genai(tmp_path), rule="cpu-fallback-allowed")
    assert found.message.startswith("genai_config.json:")


@pytest.mark.parametrize("policy_text", [
    'name: p\nsession:\n  config_entries: {session.disable_cpu_ep_fallback: "1"}\nexecution_provider: {name: cuda}\n',
    "name: p\nsession:\n  config_entries: {session.disable_cpu_ep_fallback: true}\nexecution_provider: {name: cuda}\n",
    "name: p\nexecution_provider: {name: cpu}\n",
])
def test_guarded_or_cpu_policies_pass(make_model, write_policy, policy_text):
    assert findings(make_model(), write_policy(policy_text), rule="cpu-fallback-allowed") == []


# unknown-session-config-key ------------------------------------------------------------------------------

def test_misspelt_config_key_is_reported_and_ort_accepts_it(make_model, write_policy):
    model = make_model()
    policy = write_policy('name: p\nsession:\n  config_entries:\n    session.disable_cpu_ep_falback: "1"\n')
    [found] = findings(model, policy, rule="unknown-session-config-key")
    assert dict(found.properties)["suggestion"] == "session.disable_cpu_ep_fallback" and found.location.line == 4
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_falback", "1")
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])  # no error, nothing read
    assert np.isfinite(sess.run(None, make_feeds(model))[0]).all()


def test_unknown_key_in_genai_session_options(make_model, tmp_path):
    config = write_genai(tmp_path, **{"session.dissable_prepacking": "1"})
    [found] = findings(make_model(), config=config, rule="unknown-session-config-key")
    assert found.location.file == str(config)


def test_known_and_provider_scoped_keys_pass(make_model, write_policy):
    policy = write_policy('name: p\nsession:\n  config_entries:\n    session.disable_prepacking: "1"\n'
                          '    ep.cuda.gqa_workspace_max_total_sequence_length: "4096"\n')
    assert findings(make_model(), policy, rule="unknown-session-config-key") == []
