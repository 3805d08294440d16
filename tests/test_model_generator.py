"""Tests of the Qwen3-MoE-family graph generator (tests/models/qwen_moe.py).

Every variant the other tests use must load and run one forward pass in onnxruntime on
CPUExecutionProvider; the few combinations ORT 1.31's CPU kernels reject are pinned in
test_ort_cpu_rejects with ORT's own error, so that a newer ORT that accepts them shows up here.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models.make_examples import EXAMPLES, FUSED, UNFUSED, write_examples
from tests.models.qwen_moe import (
    MS_DOMAIN,
    ModelSpec,
    build_model,
    make_feeds,
    op_counts,
    save_model,
    spec_from_model,
)

REPO = Path(__file__).resolve().parents[1]
HYBRID = ("linear_attention", "linear_attention", "linear_attention", "full_attention")
FULLY_UNFUSED = dict(
    moe="dense_loop", attention="decomposed", rotary="decomposed", norm="decomposed", qkv="separate", naming="hf"
)

# id -> ModelSpec keyword arguments; all of these run on ORT 1.31 CPU
RUNNABLE = {
    "fused": {},
    "fused-fp16": dict(dtype="float16"),
    "fused-rotary-in-gqa": dict(rotary="gqa"),
    "fused-shared-expert": dict(shared_expert=True),
    "fused-silu-experts": dict(moe_activation="silu"),
    "fused-no-epsilon": dict(norm_epsilon=None),
    "fused-qk-norm": dict(qk_norm=True),
    "qk-norm-rotary-in-gqa": dict(qk_norm=True, rotary="gqa"),
    "separate-qkv-rotary-in-gqa": dict(qkv="separate", rotary="gqa"),
    "fused-position-ids-input": dict(position_ids="input"),
    "fused-control-flow": dict(control_flow=True),
    "fused-matmul-nbits": dict(matmul_nbits=True),
    "fused-matmul-nbits-fp16": dict(matmul_nbits=True, dtype="float16"),
    "qmoe-int4": dict(moe="qmoe"),
    "qmoe-int8": dict(moe="qmoe", qmoe_bits=8),
    "qmoe-int4-block16": dict(moe="qmoe", qmoe_block_size=16),
    "qmoe-fp16": dict(moe="qmoe", dtype="float16"),
    "qmoe-int8-fp16": dict(moe="qmoe", qmoe_bits=8, dtype="float16"),
    "dense-loop": dict(moe="dense_loop"),
    "dense-loop-fp16": dict(moe="dense_loop", dtype="float16"),
    "dense-loop-separate-gate-up": dict(moe="dense_loop", gate_up="separate"),
    "dense-loop-topk-softmax": dict(moe="dense_loop", router_order="topk_softmax"),
    "dense-loop-shared-expert": dict(moe="dense_loop", shared_expert=True),
    "gather-loop": dict(moe="gather_loop"),
    "gather-loop-shared-expert": dict(moe="gather_loop", shared_expert=True, gate_up="separate"),
    "dense-mlp": dict(moe="dense"),
    "decomposed-attention": dict(attention="decomposed"),
    "decomposed-attention-mul-scale": dict(attention="decomposed", attention_scale="mul"),
    "decomposed-attention-fp16": dict(attention="decomposed", dtype="float16"),
    "decomposed-attention-no-cache": dict(attention="decomposed", kv_cache=False),
    "mha": dict(attention="mha"),
    "mha-fp16": dict(attention="mha", dtype="float16"),
    "mha-no-cache": dict(attention="mha", kv_cache=False),
    "onnx-attention": dict(attention="onnx_attention"),
    "onnx-attention-fp16": dict(attention="onnx_attention", dtype="float16"),
    "onnx-attention-no-cache": dict(attention="onnx_attention", kv_cache=False),
    "separate-qkv": dict(qkv="separate"),
    "decomposed-rotary": dict(rotary="decomposed"),
    "decomposed-norm": dict(norm="decomposed"),
    "decomposed-norm-div": dict(norm="decomposed_div"),
    "decomposed-norm-cast-fp16": dict(norm="decomposed_cast", dtype="float16"),
    "fully-unfused": FULLY_UNFUSED,
    "fully-unfused-fp16": dict(FULLY_UNFUSED, dtype="float16", norm="decomposed_cast"),
    "hybrid-linear-attention": dict(layers=4, layer_types=HYBRID, shared_expert=True),
    "hybrid-linear-attention-fp16": dict(layers=4, layer_types=HYBRID, shared_expert=True, dtype="float16"),
    "hybrid-linear-attention-unfused": dict(FULLY_UNFUSED, layers=4, layer_types=HYBRID),
    "sliding-window-gqa": dict(layer_types=("sliding_attention", "full_attention"), sliding_window=2),
    "sliding-window-decomposed": dict(
        layer_types=("sliding_attention", "full_attention"), sliding_window=2, attention="decomposed"
    ),
    "naming-hf": dict(naming="hf"),
    "naming-opaque": dict(naming="opaque", moe="dense_loop"),
    "naming-none": dict(naming="none", moe="gather_loop"),
}


def _session(model_or_path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    source = model_or_path.SerializeToString() if isinstance(model_or_path, onnx.ModelProto) else str(model_or_path)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    assert session.get_providers() == ["CPUExecutionProvider"]
    return session


def _run(session, model_or_path, **shape) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, make_feeds(model_or_path, **shape))))


# ---- every variant loads and runs ----------------------------------------------------------------


@pytest.mark.parametrize("variant", RUNNABLE, ids=list(RUNNABLE))
def test_variant_runs_on_cpu(variant, tmp_path):
    spec = ModelSpec(**RUNNABLE[variant])
    path = save_model(build_model(spec), tmp_path / "model.onnx")
    session = _session(path)
    shapes = [dict(batch=1, seq=4, past=0), dict(batch=1, seq=1, past=3), dict(batch=2, seq=3, past=0)]
    for shape in shapes:
        outputs = _run(session, path, **shape)
        batch, seq = shape["batch"], shape["seq"]
        total = seq + (shape["past"] if spec.has_kv_cache else 0)
        assert outputs["logits"].shape == (batch, seq, spec.vocab)
        assert outputs["logits"].dtype == spec.np_dtype
        assert np.isfinite(outputs["logits"].astype(np.float32)).all()
        for i in spec.attention_layers if spec.has_kv_cache else ():
            assert outputs[f"present.{i}.key"].shape == (batch, spec.kv_num_heads, total, spec.head_dim)
            assert outputs[f"present.{i}.value"].shape == (batch, spec.kv_num_heads, total, spec.head_dim)
        for i in spec.linear_attention_layers:
            assert outputs[f"present.{i}.conv"].shape == (batch, spec.linear_conv_dim, spec.linear_conv_kernel - 1)
            assert outputs[f"present.{i}.recurrent"].shape == (
                batch, spec.linear_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim,
            )


def test_graph_interface_matches_genai():
    spec = ModelSpec(layers=4, layer_types=HYBRID)
    graph = build_model(spec).graph
    inputs = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.input}
    assert inputs["input_ids"] == ["batch_size", "sequence_length"]
    assert inputs["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert inputs["past_key_values.3.key"] == ["batch_size", 2, "past_sequence_length", 16]
    assert inputs["past.0.conv"] == ["batch_size", spec.linear_conv_dim, spec.linear_conv_kernel - 1]
    assert "past_key_values.0.key" not in inputs  # layer 0 is linear attention
    outputs = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in graph.output}
    assert outputs["logits"] == ["batch_size", "sequence_length", spec.vocab]
    assert outputs["present.3.value"] == ["batch_size", 2, "total_sequence_length", 16]
    assert {"present.0.recurrent", "present.2.conv"} <= set(outputs)


# ---- what ORT 1.31 CPU cannot run: pinned, not skipped --------------------------------------------


@pytest.mark.parametrize(
    "kwargs, stage, message",
    [
        (dict(swiglu_fusion=0), "load", "CPU MoE only supports interleaved SwiGLU format"),
        (dict(swiglu_fusion=2), "load", "CPU MoE only supports interleaved SwiGLU format"),
        (dict(swiglu_fusion=2, dtype="float16"), "load", "CPU MoE only supports interleaved SwiGLU format"),
        (dict(moe="qmoe", swiglu_fusion=0), "load", "CPU QMoE only supports interleaved SwiGLU format"),
        (dict(moe="gather_loop", dtype="float16"), "run", "MLFloat16 data type is not supported with ScatterND"),
    ],
    ids=["moe-swiglu-fusion-0", "moe-swiglu-fusion-2", "moe-swiglu-fusion-2-fp16", "qmoe-swiglu-fusion-0",
         "gather-loop-fp16-scatternd-add"],
)
def test_ort_cpu_rejects(kwargs, stage, message):
    model = build_model(ModelSpec(**kwargs))
    with pytest.raises(Exception, match=message):
        _run(_session(model), model)
    if stage == "run":  # the session itself loads; only the kernel fails at run time
        _session(model)


# ---- numerics --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "variant",
    ["fused", "fused-rotary-in-gqa", "fully-unfused", "mha", "onnx-attention", "gather-loop", "sliding-window-gqa",
     "sliding-window-decomposed", "hybrid-linear-attention"],
)
def test_decode_step_with_cache_matches_longer_prompt(variant):
    """Logits of token 5 are the same from a 5-token prompt and from a 4-token prompt + 1 cached step."""
    model = build_model(ModelSpec(**RUNNABLE[variant]))
    session = _session(model)
    prompt = make_feeds(model, seq=5)
    for name in prompt:
        if name.startswith("past"):
            prompt[name] = np.zeros_like(prompt[name][..., :0, :]) if "past_key_values" in name else np.zeros_like(prompt[name])
    output_names = [o.name for o in session.get_outputs()]
    full = session.run(None, prompt)[0]

    first = {k: (v[:, :4] if k in ("input_ids", "attention_mask") else v) for k, v in prompt.items()}
    present = dict(zip(output_names, session.run(None, first)))
    step = {"input_ids": prompt["input_ids"][:, 4:], "attention_mask": prompt["attention_mask"]}
    for name in prompt:
        if name.startswith("past_key_values."):
            step[name] = present["present." + name.removeprefix("past_key_values.")]
        elif name.startswith("past."):
            step[name] = present["present." + name.removeprefix("past.")]
    cached = session.run(None, step)[0]
    np.testing.assert_allclose(cached[:, 0], full[:, 4], atol=1e-5)


EQUIVALENT_TO_FUSED = [
    "fully-unfused", "gather-loop", "dense-loop-separate-gate-up", "dense-loop-topk-softmax", "mha", "onnx-attention",
    "separate-qkv", "fused-rotary-in-gqa", "decomposed-norm-div", "naming-opaque", "fused-control-flow",
]
EQUIVALENT_PAIRS = [("fused", v) for v in EQUIVALENT_TO_FUSED] + [
    ("sliding-window-gqa", "sliding-window-decomposed"),
    ("fused-qk-norm", "qk-norm-rotary-in-gqa"),
    ("hybrid-linear-attention", "hybrid-linear-attention-fp16"),
    ("fused-shared-expert", "dense-loop-shared-expert"),
    ("fully-unfused", "fully-unfused-fp16"),
    ("fused", "fused-fp16"),
]


@pytest.mark.parametrize("reference, variant", EQUIVALENT_PAIRS, ids=[f"{a}={b}" for a, b in EQUIVALENT_PAIRS])
def test_fused_and_unfused_forms_compute_the_same(reference, variant):
    """All forms of one spec hold the same logical weights, so they produce the same logits."""
    expected_model = build_model(ModelSpec(**RUNNABLE[reference]))
    model = build_model(ModelSpec(**RUNNABLE[variant]))
    expected = _run(_session(expected_model), expected_model, seq=5)["logits"].astype(np.float32)
    actual = _run(_session(model), model, seq=5)["logits"].astype(np.float32)
    atol = 2e-3 if ModelSpec(**RUNNABLE[variant]).dtype == "float16" else 2e-6
    np.testing.assert_allclose(actual, expected, atol=atol)


# ---- node counts, saving ---------------------------------------------------------------------------


def _expected_counts(spec: ModelSpec) -> dict[tuple[str, str], int]:
    attention, linear = len(spec.attention_layers), len(spec.linear_attention_layers)
    if spec.moe == "fused":
        return {
            (MS_DOMAIN, "MoE"): spec.layers,
            (MS_DOMAIN, "GroupQueryAttention"): attention,
            (MS_DOMAIN, "RotaryEmbedding"): 2 * attention,
            (MS_DOMAIN, "SkipSimplifiedLayerNormalization"): 2 * spec.layers,
            ("", "SimplifiedLayerNormalization"): 1,
            (MS_DOMAIN, "LinearAttention"): linear,
            (MS_DOMAIN, "CausalConvWithState"): linear,
            (MS_DOMAIN, "GatedRMSNorm"): linear,
        }
    if spec.moe == "dense_loop":
        per_expert = 2 if spec.gate_up == "merged" else 3
        core_matmuls = 2 if spec.attention == "decomposed" else 0  # QK^T and probs @ V
        attention_matmuls = (3 if spec.qkv == "separate" else 1) + 1 + core_matmuls  # + o_proj
        return {
            ("", "MatMul"): spec.layers * (spec.experts * per_expert + 1 + attention_matmuls) + 1,
            ("", "ScatterElements"): spec.layers,
            ("", "TopK"): spec.layers,
            ("", "Softmax"): 2 * spec.layers,
            (MS_DOMAIN, "MoE"): 0,
        }
    raise NotImplementedError(spec.moe)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        dict(layers=3, experts=8),
        dict(layers=4, layer_types=HYBRID),
        dict(layers=2, experts=4, **FULLY_UNFUSED),
        dict(layers=3, experts=6, **FULLY_UNFUSED),
        dict(layers=2, experts=4, **dict(FULLY_UNFUSED, gate_up="merged", qkv="packed")),
    ],
    ids=["fused", "fused-3x8", "fused-hybrid", "dense-loop-2x4", "dense-loop-3x6", "dense-loop-merged"],
)
def test_external_data_dropped_model_still_loads_with_spec_counts(kwargs, tmp_path):
    spec = ModelSpec(**kwargs)
    model = build_model(spec)
    path = save_model(model, tmp_path / "model.onnx", external_data=True, drop_data=True)
    assert not path.with_name("model.onnx.data").exists()
    loaded = onnx.load(str(path), load_external_data=False)
    assert any(t.data_location == onnx.TensorProto.EXTERNAL for t in loaded.graph.initializer)
    assert op_counts(loaded) == op_counts(model)
    counts = op_counts(loaded)
    for key, expected in _expected_counts(spec).items():
        assert counts[key] == expected, key
    assert spec_from_model(loaded) == spec
    assert set(make_feeds(path)) == {i.name for i in loaded.graph.input}


def test_dense_loop_matmuls_grow_with_experts_times_layers():
    def matmuls(layers, experts):
        return op_counts(build_model(ModelSpec(layers=layers, experts=experts, moe="dense_loop")))[("", "MatMul")]

    base = matmuls(2, 4)
    assert matmuls(2, 8) - base == 2 * 4 * 2  # layers x extra experts x (gate_up, down)
    assert matmuls(4, 8) - matmuls(2, 8) == 2 * (8 * 2 + 1 + 2)  # + router, qkv_proj, o_proj


def test_external_data_round_trip_runs(tmp_path):
    model = build_model(ModelSpec())
    path = save_model(model, tmp_path / "model.onnx", external_data=True)
    assert path.with_name("model.onnx.data").stat().st_size > path.stat().st_size
    assert all(t.data_location == onnx.TensorProto.DEFAULT for t in model.graph.initializer)  # caller's copy untouched
    expected = _run(_session(model), model)["logits"]
    np.testing.assert_array_equal(_run(_session(path), path)["logits"], expected)


def test_spec_external_data_is_honored_by_save_model(tmp_path):
    path = save_model(build_model(ModelSpec(external_data=True)), tmp_path / "model.onnx")
    assert path.with_name("model.onnx.data").exists()


def test_large_stub_graph_builds_in_seconds(tmp_path):
    spec = ModelSpec(
        layers=48, experts=128, top_k=8, hidden=2048, num_heads=32, kv_num_heads=4, head_dim=128,
        moe_intermediate=768, vocab=151936, moe="dense_loop", weights="external_stub",
    )
    start = time.perf_counter()
    model = build_model(spec)
    elapsed = time.perf_counter() - start
    assert len(model.graph.node) > 50_000
    assert elapsed < 20, f"{elapsed:.1f}s"
    stubs = [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert all(not t.raw_data for t in stubs)
    entries = [{e.key: e.value for e in t.external_data} for t in stubs]
    assert {e["location"] for e in entries} == {"model.onnx.data"}
    ranges = sorted((int(e["offset"]), int(e["length"])) for e in entries)
    assert all(a + n <= b for (a, n), (b, _) in zip(ranges, ranges[1:]))  # no overlaps
    assert sum(n for _, n in ranges) > 50e9  # ~30B float32 parameters declared, none allocated
    path = save_model(model, tmp_path / "model.onnx")
    assert not path.with_name("model.onnx.data").exists()
    assert len(onnx.load(str(path), load_external_data=False).graph.node) == len(model.graph.node)


# ---- names -------------------------------------------------------------------------------------------


def _intermediate_values(model: onnx.ModelProto) -> set[str]:
    graph_io = {v.name for v in (*model.graph.input, *model.graph.output)}
    return {o for n in model.graph.node for o in n.output if o and o not in graph_io}


@pytest.mark.parametrize("naming, layer_prefix", [("genai", "/model/layers.{}/"), ("hf", "model.layers.{}.")])
def test_named_styles_attribute_every_layer_node(naming, layer_prefix):
    spec = ModelSpec(layers=3, naming=naming, moe="dense_loop", shared_expert=True)
    model = build_model(spec)
    names = [n.name for n in model.graph.node]
    assert len(set(names)) == len(names) and all(names)
    per_layer = [sum(name.startswith(layer_prefix.format(i)) for name in names) for i in range(spec.layers)]
    assert per_layer[0] > 40 and len(set(per_layer)) == 1  # identical layers, identical node counts
    experts = [n for n in model.graph.node if n.op_type == "MatMul" and "experts.3" in n.name]
    assert {n.name.split("experts")[0] for n in experts} == {
        layer_prefix.format(i) + ("moe/" if naming == "genai" else "mlp.") for i in range(spec.layers)
    }


@pytest.mark.parametrize("naming", ["opaque", "none"])
def test_opaque_styles_carry_no_layer_information(naming):
    spec = ModelSpec(layers=3, naming=naming, moe="dense_loop", layer_types=("linear_attention", "full_attention", "full_attention"))
    model = build_model(spec)
    node_names = [n.name for n in model.graph.node]
    if naming == "none":
        assert set(node_names) == {""}
    else:
        assert all(re.fullmatch(r"node_\d+", name) for name in node_names)
    assert all(re.fullmatch(r"w_\d+", t.name) for t in model.graph.initializer)
    assert all(re.fullmatch(r"t_\d+", v) for v in _intermediate_values(model))
    # only the runtime interface (past_key_values.{i}.*, present.{i}.*) names layers
    assert not [p for p in model.metadata_props if p.key != "qwen_moe.spec"]


def test_default_node_counts():
    fused = op_counts(build_model(ModelSpec()))
    loop = op_counts(build_model(ModelSpec(moe="dense_loop")))
    assert sum(fused.values()) == 38
    assert sum(loop.values()) == 118


# ---- spec, examples -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [dict(rotary="gqa", attention="decomposed"), dict(layers=2, layer_types=("full_attention",)),
     dict(moe="nope"), dict(num_heads=3), dict(top_k=5)],
)
def test_invalid_specs_are_rejected(kwargs):
    with pytest.raises(ValueError):
        ModelSpec(**kwargs)


def test_examples_are_current_and_small(tmp_path):
    written = write_examples(tmp_path)
    for fresh in written:
        committed = REPO / "examples" / fresh.relative_to(tmp_path)
        assert committed.read_bytes() == fresh.read_bytes(), f"{committed} is stale: run python -m tests.models.make_examples"
    for name, spec in EXAMPLES.items():
        path = REPO / "examples" / name / "model.onnx"
        assert path.stat().st_size < 1_000_000
        model = onnx.load(str(path))
        assert spec_from_model(model) == spec
        assert _run(_session(path), path)["logits"].shape == (1, 4, spec.vocab)
    assert op_counts(onnx.load(str(REPO / "examples/qwen3-moe-tiny-fused/model.onnx")))[(MS_DOMAIN, "MoE")] == 2
    assert op_counts(onnx.load(str(REPO / "examples/qwen3-moe-tiny-unfused/model.onnx")))[(MS_DOMAIN, "MoE")] == 0


def test_unfused_example_is_plain_onnx():
    """No ORT-only ops: the ONNX checker (with strict shape inference) accepts it."""
    model = onnx.load(str(REPO / "examples/qwen3-moe-tiny-unfused/model.onnx"))
    onnx.checker.check_model(model, full_check=True)
    assert {n.domain for n in model.graph.node} == {""}


def test_examples_compute_the_same_logits():
    unfused_path = REPO / "examples/qwen3-moe-tiny-unfused/model.onnx"
    fused_path = REPO / "examples/qwen3-moe-tiny-fused/model.onnx"
    unfused = _run(_session(unfused_path), unfused_path, seq=5)["logits"]
    fused = _run(_session(fused_path), fused_path, seq=5)["logits"].astype(np.float32)  # float16 model
    np.testing.assert_allclose(fused, unfused, atol=2e-3)


def test_genai_config_describes_the_fused_example():
    folder = REPO / "examples/qwen3-moe-tiny-fused"
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["session_options"]["provider_options"] == [{"cuda": {"enable_cuda_graph": "1"}}]
    assert (decoder["num_hidden_layers"], decoder["num_attention_heads"], decoder["num_key_value_heads"]) == (
        FUSED.layers, FUSED.num_heads, FUSED.kv_num_heads,
    )
    assert (decoder["head_size"], decoder["hidden_size"], config["model"]["vocab_size"]) == (
        FUSED.head_dim, FUSED.hidden, FUSED.vocab,
    )
    graph = onnx.load(str(folder / decoder["filename"]), load_external_data=False).graph
    inputs = {i.name for i in graph.input}
    outputs = {o.name for o in graph.output}
    names = decoder["inputs"]
    assert {names["input_ids"], names["attention_mask"], names["position_ids"]} <= inputs
    assert {names["past_key_names"] % i for i in range(FUSED.layers)} <= inputs
    assert {decoder["outputs"]["present_value_names"] % i for i in range(FUSED.layers)} <= outputs
    assert UNFUSED.naming == "hf" and FUSED.naming == "genai"
