"""Inputs for `ortgate run`, synthesised from the model's signature: these models, this runner block, these feeds.

Every synthesised feed is also run through a real ONNX Runtime CPU session: ORT is the judge of whether the
feeds fit the model.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from ortgate.cost import StepShape
from ortgate.engine.pipeline import LintRequest, load_inputs
from ortgate.errors import InputError
from ortgate.runner import inputs as ri
from ortgate.runner.settings import runner_settings
from tests.conftest import EXPORTED

QWEN35 = EXPORTED / "genai-qwen3_5_moe-fp32-cpu"
GPT_OSS = EXPORTED / "genai-gpt_oss-fp32-cpu"
DYNAMO = EXPORTED / "dynamo-qwen3_moe"


def feeds_for(model, policy=None, overrides=None):
    inputs = load_inputs(LintRequest(str(model), str(policy) if policy else None))
    settings = runner_settings(inputs.policy)
    signature = ri.graph_signature(inputs.model)
    dims, step = ri.resolve_dims(signature, settings, overrides or {},
                                 window=ri.sliding_window(inputs.model, inputs.genai),
                                 head=ri.head_size(inputs.policy, inputs.genai), policy_file=str(policy))
    return inputs, ri.synthesize(signature, dims, step, ri.token_inputs(inputs.model, inputs.genai))


def run_on_cpu(model_path, feeds) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds.arrays)))


def test_qwen35_decode_step_feeds_run_in_ort(write_policy):
    policy = write_policy("name: p\nrunner:\n  batch_size: 2\n  past_sequence_length: 5\n")
    inputs, feeds = feeds_for(QWEN35, policy)
    assert feeds.dims == {"batch_size": 2, "sequence_length": 1, "total_sequence_length": 6,
                          "past_sequence_length": 5, "kv_cache_dim": 16}
    # Qwen3.5's mrope position ids: [3, batch, seq], continuing after the past.
    assert feeds.arrays["position_ids"].shape == (3, 2, 1)
    assert (feeds.arrays["position_ids"] == 5).all()
    assert feeds.arrays["attention_mask"].shape == (2, 6) and feeds.arrays["attention_mask"].all()
    assert feeds.arrays["past_key_values.3.key"].shape == (2, 2, 5, 16)
    assert feeds.arrays["past.0.conv"].shape == (2, 128, 3)
    assert feeds.arrays["past.2.recurrent"].shape == (2, 4, 16, 16)
    assert feeds.kinds["input_ids"] == "token_ids" and feeds.kinds["past.1.conv"] == "state"
    outputs = run_on_cpu(inputs.model.path, feeds)
    assert outputs["logits"].shape == (2, 1, 320) and np.isfinite(outputs["logits"]).all()
    assert outputs["present.3.key"].shape == (2, 2, 6, 16)


def test_token_ids_stay_inside_the_vocabulary_read_from_the_embedding_shape(write_policy):
    policy = write_policy("name: p\nrunner:\n  batch_size: 4\n  sequence_length: 64\n")
    inputs, feeds = feeds_for(QWEN35, policy)
    assert ri.token_inputs(inputs.model) == {"input_ids": 320}  # the embedding initializer is [320, 64]
    ids = feeds.arrays["input_ids"]
    assert ids.shape == (4, 64) and ids.min() >= 0 and ids.max() < 320 and len(np.unique(ids)) > 50


def test_gpt_oss_sliding_cache_gets_the_window_and_runs(write_policy):
    # past_sliding_length below the window fails in ORT: "KV cache capacity (0) must be at least local_window_size".
    policy = write_policy("name: p\nrunner:\n  past_sequence_length: 3\n")
    inputs, feeds = feeds_for(GPT_OSS, policy)
    assert ri.sliding_window(inputs.model, inputs.genai) == 32
    assert feeds.dims["past_sliding_length"] == 32 and feeds.dims["past_sequence_length"] == 3
    assert feeds.arrays["past_key_values.0.key"].shape == (1, 2, 32, 16)
    assert feeds.arrays["past_key_values.1.key"].shape == (1, 2, 3, 16)
    assert "position_ids" not in feeds.arrays  # GPT-OSS does rotary inside GQA
    assert np.isfinite(run_on_cpu(inputs.model.path, feeds)["logits"]).all()


def test_dynamo_export_without_kv_cache(write_policy):
    policy = write_policy("name: p\nrunner:\n  sequence_length: 7\n")
    inputs, feeds = feeds_for(DYNAMO, policy)
    assert set(feeds.arrays) == {"input_ids", "attention_mask"}
    assert feeds.arrays["input_ids"].shape == (1, 7) and feeds.arrays["input_ids"].max() < 128
    assert run_on_cpu(inputs.model.path, feeds)["logits"].shape == (1, 7, 128)


def test_generator_model_with_position_ids_input(make_model, write_policy):
    model = make_model(position_ids="input", layer_types=("linear_attention", "full_attention"))
    policy = write_policy("name: p\nrunner:\n  sequence_length: 3\n  past_sequence_length: 4\n")
    _, feeds = feeds_for(model, policy)
    assert feeds.arrays["position_ids"].tolist() == [[4, 5, 6]]
    assert feeds.arrays["attention_mask"].shape == (1, 7)
    assert run_on_cpu(model, feeds)["logits"].shape == (1, 3, 256)


def test_free_dimension_override_decides_the_dim(write_policy):
    policy = write_policy("name: p\n")
    _, feeds = feeds_for(DYNAMO, policy, overrides={"sequence_length": (5, None)})
    assert feeds.arrays["input_ids"].shape == (1, 5)


def test_runner_block_conflicting_with_an_override_is_an_input_error(write_policy):
    policy = write_policy("name: p\nrunner:\n  sequence_length: 4\n")
    with pytest.raises(InputError) as err:
        feeds_for(DYNAMO, policy, overrides={"sequence_length": (1, None)})
    assert "runner.sequence_length is 4" in err.value.problem and "pins 'sequence_length' to 1" in err.value.problem
    assert err.value.line == 3


def test_unresolvable_dim_names_the_input_and_the_dim(make_model, write_policy, tmp_path):
    import onnx

    model = onnx.load(str(make_model()))
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "chunk_width"
    path = tmp_path / "odd.onnx"
    onnx.save(model, path)
    policy = write_policy("name: p\n")
    with pytest.raises(InputError) as err:
        feeds_for(path, policy)
    assert err.value.problem.startswith("input 'input_ids': cannot choose a value for dim 'chunk_width'")
    assert "runner.dims.chunk_width" in err.value.problem
    # ... and runner.dims resolves it.
    policy = write_policy("name: p\nrunner:\n  dims: {chunk_width: 2}\n", name="p2.yaml")
    _, feeds = feeds_for(path, policy)
    assert feeds.arrays["input_ids"].shape == (1, 2)


def test_head_size_without_genai_config_or_policy_is_unresolvable(tmp_path, write_policy):
    import shutil

    # The genai model without its genai_config.json: kv_cache_dim has no source.
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(QWEN35 / name, tmp_path / name)
    with pytest.raises(InputError) as err:
        feeds_for(tmp_path / "model.onnx", write_policy("name: p\n"))
    assert "dim 'kv_cache_dim'" in err.value.problem and "head_size" in err.value.problem
    policy = write_policy("name: p\nmodel:\n  head_size: 16\n", name="p2.yaml")
    _, feeds = feeds_for(tmp_path / "model.onnx", policy)
    assert feeds.dims["kv_cache_dim"] == 16


@pytest.mark.parametrize("name, role", [
    ("batch_size", "batch"), ("sequence_length", "query"), ("past_sequence_length", "past"),
    ("total_sequence_length", "total"), ("past_sliding_length", "sliding_past"), ("total_sliding_length", "total"),
    ("kv_cache_dim", "head"), ("max_seq_len", "max"), ("chunk_width", None),
])
def test_dim_roles(name, role):
    assert ri.dim_role(name) == role


def test_gqa_graph_inputs_seqlens_k_and_total_sequence_length():
    from onnx import TensorProto

    step = StepShape(batch=2, new_tokens=1, context=10)  # 9 cached positions and 1 new token
    signature = [ri.InputSpec("seqlens_k", TensorProto.INT32, ("batch_size",)),
                 ri.InputSpec("total_sequence_length", TensorProto.INT32, ())]
    feeds = ri.synthesize(signature, {"batch_size": 2}, step, {})
    assert feeds.arrays["seqlens_k"].tolist() == [9, 9] and feeds.arrays["seqlens_k"].dtype == np.int32
    assert feeds.arrays["total_sequence_length"].tolist() == 10


def test_string_input_cannot_be_synthesised():
    from onnx import TensorProto

    with pytest.raises(InputError, match="input 'prompt' has type string"):
        ri.synthesize([ri.InputSpec("prompt", TensorProto.STRING, (1,))], {}, StepShape(1, 1, 1), {})
