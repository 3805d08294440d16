"""The graph rules on torch.onnx (dynamo) exports of MoE families (tests/fixtures/exported/dynamo-*, made by
make_dynamo_moe_fixtures.py), and on optimum's and Olive's exports: every unfused structure found in the layer it
sits in, and nothing that is not there.

Each table row is what the exported graph holds, read from the model's code (transformers 5.24) and its config
in BUILD_INFO.json: which layers are MoE, which attention, norm and rotary forms the family computes.
"""

from __future__ import annotations

import json

import onnxruntime as ort
import pytest

from ortgate.findings import Kind
from tests.conftest import EXPORTED
from tests.helpers import lint_findings

GRAPH_RULES = [
    "moe-not-fused", "gqa-not-fused", "rmsnorm-not-fused", "rmsnorm-fused-by-ort", "skip-rmsnorm-not-fused",
    "rotary-not-fused", "qkv-not-packed", "gate-up-not-merged", "swiglu-not-fused", "moe-routing-mismatch", "gqa-config-mismatch",
    "norm-epsilon-default", "kv-cache-not-fed-back",
]
OUT = None  # findings outside the decoder layers (the final norm)

# fixture -> rule -> the layers it must report (a rule not named must report nothing)
EXPECTED: dict[str, dict[str, list]] = {
    "dynamo-mixtral": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    "dynamo-qwen2_moe": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    "dynamo-olmoe": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    "dynamo-gpt_oss": {  # rotary on halves without Neg (Sub form)
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    "dynamo-gpt_oss_batched": {  # the same family with transformers' batched_mm experts
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    "dynamo-dbrx": {  # LayerNorm (no RMSNorm findings); w1 / v1 / w2 apart; Wqkv packed, then clamped
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rotary-not-fused": [0, 1], "gate-up-not-merged": [0, 1],
    },
    "dynamo-deepseek_v3": {  # layer 0 is a dense MLP; MLA: q/k/v packing is undecided, not a violation
        "moe-not-fused": [1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1],
    },
    # optimum's legacy TorchScript export with KV cache: RMSNorm as Mul(x, Div(1, Sqrt)) between no-op Casts, which
    # ORT fuses (info); the residual Add is never fused into SkipSimplifiedLayerNormalization (warning)
    "optimum-qwen3_moe-past": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-fused-by-ort": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
        "gate-up-not-merged": [0, 1],
    },
    "optimum-llama-past": {  # the dense control: no MoE finding
        "gqa-not-fused": [0, 1], "rmsnorm-fused-by-ort": [0, 1, OUT], "skip-rmsnorm-not-fused": [0, 1, OUT],
        "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    # the same Llama through optimum's --optimize O2 (ORT's transformers optimizer): RMSNorm and SiLU fused
    # (SimplifiedLayerNormalization, QuickGelu), so no rmsnorm or swiglu finding; attention, rotary, q/k/v and the
    # residual Adds stay as they were
    "optimum-llama-past-o2": {
        "gqa-not-fused": [0, 1], "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1],
        "qkv-not-packed": [0, 1],
    },
    # Olive's OrtTransformersOptimization (ORT's transformers optimizer, model_type gpt2) on its dynamo export of
    # Mixtral with batched_mm experts: every RMSNorm fused (SimplifiedLayerNormalization for the first, the residual
    # Adds into SkipSimplifiedLayerNormalization), so no norm finding; MoE, GQA-expanding attention, rotary and
    # q/k/v stay as exported
    # and its conversion task (text-generation: with-past fails in Olive) returns present.* but takes no past
    "olive-mixtral": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
        "kv-cache-not-fed-back": [OUT],
    },
    "dynamo-phimoe": {  # LayerNorm, not RMSNorm: no norm findings
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    # quantize_static QDQ of dynamo-mixtral: Q -> DQ around every quantized op (routers, experts, q/k/v/o, the score
    # and context MatMuls, the rotary's Muls, the norms' ops) changes nothing that is found, nor where
    "quantqdq-mixtral": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
    # JetMoE: the MoE MLP (tokens sorted by expert, one linear per expert slice) in each layer; its mixture of
    # attention heads (routed q / o projections) is moe-not-fused's undecided finding, and q/k/v packing undecided
    "dynamo-jetmoe": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT],
        "skip-rmsnorm-not-fused": [0, 1, OUT], "rotary-not-fused": [0, 1],
    },
    # Cohere2-MoE: LayerNorm without bias (x - mean(x), then the RMS chain): rmsnorm-not-fused names it a LayerNorm
    # whose fusion is LayerNormalization, and no residual Add + RMSNorm pair is reported for it; both layers full
    # attention, which Cohere2 computes without rotary
    "dynamo-cohere2_moe": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT], "qkv-not-packed": [0, 1],
    },
    # LongCat-Flash: one decoder layer of two sub-layers (two MLA attentions, two dense MLPs, one MoE with 2
    # zero-computation experts beside its 4 routed ones: no expert-count finding); MLA: q/k/v packing undecided
    "dynamo-longcat_flash": {
        "moe-not-fused": [0], "gqa-not-fused": [0], "rmsnorm-not-fused": [0, OUT], "skip-rmsnorm-not-fused": [0, OUT],
        "rotary-not-fused": [0],
    },
    # Llama-4 text: its MoE scales each expert's input (read, refused by the rewrite); q/k L2 norms without weight
    "dynamo-llama4": {
        "moe-not-fused": [0, 1], "gqa-not-fused": [0, 1], "rmsnorm-not-fused": [0, 1, OUT], "skip-rmsnorm-not-fused": [0, 1, OUT],
        "rotary-not-fused": [0, 1], "qkv-not-packed": [0, 1],
    },
}

# transformers' own exporter (make_transformers_exporter_fixtures.py), a KV cache returned but not taken: fixture ->
# rule -> (violations per layer, undecided findings per layer)
TRANSFORMERS_EXPORTER = {
    # ort_fusions="cuda": GroupQueryAttention is not written (MultiHeadAttention with kv heads < q heads), the MoE is
    # fused with fc1 / fc3 apart and activation_type=silu: one finding per layer, gate-up-not-merged's only
    "tfexp-qwen3_moe-cuda": {"gqa-not-fused": ([0, 1], []), "gate-up-not-merged": ([0, 1], [])},
    # ort_fusions="cpu": GroupQueryAttention and the norms fused; its grouped_mm translation (tokens sorted by expert)
    # read as an unfused MoE layer
    "tfexp-qwen3_moe-cpu": {"kv-cache-not-fed-back": ([OUT], []), "moe-not-fused": ([0, 1], [])},
}


@pytest.mark.parametrize("fixture", sorted(TRANSFORMERS_EXPORTER))
def test_transformers_exporter_findings_per_layer(fixture, findings):
    found = findings(fixture)
    got = {}
    for rule in GRAPH_RULES:
        undecided = sorted(f.layer for f in found if f.rule == rule and f.kind is Kind.UNDECIDED)
        if _layers(found, rule) or undecided:
            got[rule] = (_layers(found, rule), undecided)
    assert got == TRANSFORMERS_EXPORTER[fixture]


def test_transformers_exporter_cuda_moe_fails_on_ort_cpu_as_built():
    """What the build recorded, and what ORT CPU does here: the session is created, the first run fails in the MoE
    (fc3 is not implemented by the CPU kernel)."""
    import numpy as np

    info = json.loads((EXPORTED / "tfexp-qwen3_moe-cuda" / "BUILD_INFO.json").read_text())
    assert "FC3 is not implemented for CPU MoE" in info["cpu_run"]["run_error"]
    sess = ort.InferenceSession(str(EXPORTED / "tfexp-qwen3_moe-cuda" / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 5, 9, 17]], dtype=np.int64)
    with pytest.raises(Exception, match="FC3"):
        sess.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})


# fixture -> what every unfused MoE layer of it computes (read from the family's modeling code):
# (experts, k, routing form, expert form, routed experts, routed projections, shared experts, shared projections,
#  shared-expert gates)
MOE_SHAPE = {
    "dynamo-mixtral": (4, 2, "softmax_topk", "dense", 4, 8, 0, 0, 0),  # 4 x (gate_up Gemm on Gather(W, e), down)
    "quantqdq-mixtral": (4, 2, "softmax_topk", "dense", 4, 8, 0, 0, 0),  # the same, every op read through Q -> DQ
    # tokens sorted by expert, one linear per expert slice (input_linear gate|up, output_linear)
    "dynamo-jetmoe": (4, 2, "topk_softmax", "gather", 4, 8, 0, 0, 0),
    "tfexp-qwen3_moe-cpu": (4, 2, "softmax_topk", "gather", 4, 8, 0, 0, 0),
    "dynamo-qwen2_moe": (4, 2, "softmax_topk", "dense", 4, 8, 1, 3, 1),  # + shared gate/up/down, sigmoid gate
    "dynamo-olmoe": (8, 2, "softmax_topk", "batched", 8, 2, 0, 0, 0),  # one batched MatMul per GatherND stack
    "dynamo-phimoe": (4, 2, "sparsemixer", "dense", 4, 8, 0, 0, 0),
    "dynamo-gpt_oss": (4, 2, "topk_softmax", "dense", 4, 8, 0, 0, 0),
    # batched_mm: one Gather of the stacked gate_up (biased) and one of the down weights, a batched MatMul each
    "dynamo-gpt_oss_batched": (4, 2, "topk_softmax", "batched", 4, 2, 0, 0, 0),
    "dynamo-dbrx": (4, 2, "softmax_topk", "dense", 4, 12, 0, 0, 0),  # w1, v1 and w2 per expert
    "dynamo-deepseek_v3": (4, 2, "sigmoid_group_topk", "dense", 4, 8, 1, 3, 0),  # ungated shared expert
    "dynamo-qwen3_moe": (4, 2, "softmax_topk", "dense", 4, 8, 0, 0, 0),
    # the legacy exporter's eager loop: tokens dispatched per expert (OneHot / NonZero / Gather), gate, up and down apart
    "optimum-qwen3_moe-past": (4, 2, "softmax_topk", "gather", 4, 12, 0, 0, 0),
    # transformers' batched_mm: one GatherND of the stacked gate_up and one of the down weights, a batched MatMul each
    "olive-mixtral": (4, 2, "softmax_topk", "batched", 4, 2, 0, 0, 0),
}


@pytest.mark.parametrize("fixture", sorted(MOE_SHAPE))
def test_moe_finding_counts_what_it_names(fixture, findings):
    experts, k, routing, form, routed, projections, shared, shared_projections, gates = MOE_SHAPE[fixture]
    moe = [f for f in findings(fixture) if f.rule == "moe-not-fused" and f.kind is Kind.VIOLATION]
    assert moe
    for f in moe:
        props = dict(f.properties)
        assert (props["experts"], props["top_k"], props["routing_form"], props["expert_form"]) == (experts, k, routing, form)
        assert (props["routed_experts"], props["expert_projections"]) == (routed, projections)
        assert (props["shared_experts"], props["shared_expert_projections"], props["shared_expert_gates"]) == (
            shared, shared_projections, gates)
        assert f"{routed} routed expert" in f.message
        assert ("shared expert" in f.message) == bool(shared)
        assert "TopK TopK" not in f.message


def _layers(findings, rule):
    return sorted((f.layer for f in findings if f.rule == rule and f.kind is Kind.VIOLATION),
                  key=lambda layer: (layer is None, layer or 0))


@pytest.fixture(scope="module")
def findings():
    cache: dict[str, list] = {}

    def get(fixture: str):
        if fixture not in cache:
            cache[fixture] = lint_findings(EXPORTED / fixture / "model.onnx", select=GRAPH_RULES)
        return cache[fixture]

    return get


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_every_unfused_structure_in_its_layer_and_nothing_else(fixture, findings):
    found = findings(fixture)
    expected = EXPECTED[fixture]
    got = {rule: _layers(found, rule) for rule in GRAPH_RULES if _layers(found, rule)}
    assert got == {rule: layers for rule, layers in expected.items() if layers}


def test_olive_output_is_what_the_transformers_optimizer_wrote():
    """olive-mixtral's silence on norms means its norms are fused, not absent: Olive's pass really ran (Olive skips it
    without a word for a model type it does not map), and every RMSNorm of the model is one fused node."""
    import onnx

    model = onnx.load(str(EXPORTED / "olive-mixtral" / "model.onnx"), load_external_data=False)
    assert model.producer_name == "onnxruntime.transformers"
    assert {p.key: p.value for p in model.metadata_props}.get("olive_version")
    ops = [n.op_type for n in model.graph.node]
    layers = json.loads((EXPORTED / "olive-mixtral" / "BUILD_INFO.json").read_text())["hf_config"]["num_hidden_layers"]
    # 2 norms per layer + the final one; only the first reads no residual (the embedding), the others fuse its Add
    assert (ops.count("SimplifiedLayerNormalization"), ops.count("SkipSimplifiedLayerNormalization")) == (1, 2 * layers)
    assert not {"Pow", "Sqrt", "ReduceMean", "Reciprocal"} & set(ops)


@pytest.mark.parametrize("fixture", sorted(EXPECTED))
def test_fixture_runs_on_ort_cpu_as_built(fixture):
    """The fixture is a model ORT executes: its recorded build run and a run here agree."""
    import numpy as np

    info = json.loads((EXPORTED / fixture / "BUILD_INFO.json").read_text())
    assert info["cpu_run"]["output0_finite"] is True
    sess = ort.InferenceSession(str(EXPORTED / fixture / "model.onnx"), providers=["CPUExecutionProvider"])
    ids = np.array([[1, 5, 9, 17]], dtype=np.int64)
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    for i in sess.get_inputs():  # optimum's KV-cache exports: an empty past, positions 0..3
        if i.name.startswith("past_key_values"):
            feed[i.name] = np.zeros([1, i.shape[1], 0, i.shape[3]], np.float32)
        elif i.name == "position_ids":
            feed[i.name] = np.arange(4, dtype=np.int64)[None]
    logits = sess.run(None, feed)[0]
    assert logits.shape == (1, 4, info["hf_config"]["vocab_size"]) and np.isfinite(logits).all()


# fixture -> how its rotary pairs components (transformers: rotate_half, or DeepSeek-V3's rope_interleave)
ROTARY_PAIRING = {
    "dynamo-mixtral": "half", "dynamo-qwen2_moe": "half", "dynamo-olmoe": "half", "dynamo-phimoe": "half",
    "dynamo-gpt_oss": "half", "dynamo-gpt_oss_batched": "half", "dynamo-dbrx": "half", "dynamo-deepseek_v3": "interleaved", "olive-mixtral": "half",
    "dynamo-longcat_flash": "interleaved", "quantqdq-mixtral": "half",
    # Llama-4's complex rotary in real numbers: Reshape to [..., d/2, 2], Gather 0 / 1, x[2i] * cos - x[2i+1] * sin
    "dynamo-llama4": "interleaved",
}


@pytest.mark.parametrize("fixture", sorted(ROTARY_PAIRING))
def test_rotary_finding_says_which_components_pair(fixture, findings):
    rotary = [f for f in findings(fixture) if f.rule == "rotary-not-fused"]
    assert rotary
    pairing = ROTARY_PAIRING[fixture]
    for f in rotary:
        assert dict(f.properties)["pairing"] == pairing
        assert f"rotary_interleaved={int(pairing == 'interleaved')}" in f.message


def test_layernorm_without_bias_is_named_a_layernorm(findings):
    """Cohere's LayerNorm has no bias: x - ReduceMean(x), then x * rsqrt(mean(x^2) + eps) * w. It is a LayerNorm
    (its fusion LayerNormalization), never reported as an RMSNorm that SimplifiedLayerNormalization would fuse."""
    norms = [f for f in findings("dynamo-cohere2_moe") if f.rule == "rmsnorm-not-fused"]
    assert len(norms) == 3
    for f in norms:
        assert "LayerNorm without bias" in f.message and "instead of LayerNormalization" in f.message
        assert "RMSNorm" not in f.message.split("[")[0]
        assert dict(f.properties)["layer_norms"] == 1 and dict(f.properties)["ort_fuses"] is False


# fixture -> (hidden-state, per-head, projection-width) RMSNorms in each decoder layer
NORM_ROLES = {
    "dynamo-qwen3_moe": (2, 2, 0),  # q_norm / k_norm over head_dim
    "dynamo-olmoe": (2, 0, 2),  # q_norm / k_norm over the whole q / k projection
    "dynamo-deepseek_v3": (2, 0, 2),  # MLA's q_a_layernorm / kv_a_layernorm over the latent: not per-head
    "dynamo-mixtral": (2, 0, 0),
}


@pytest.mark.parametrize("fixture", sorted(NORM_ROLES))
def test_norm_findings_count_each_kind_of_norm(fixture, findings):
    hidden, head, projection = NORM_ROLES[fixture]
    per_layer = [f for f in findings(fixture) if f.rule == "rmsnorm-not-fused" and f.layer is not None]
    assert per_layer
    for f in per_layer:
        props = dict(f.properties)
        assert (props["hidden_norms"], props["per_head_norms"], props["projection_norms"]) == (hidden, head, projection)
        assert ("per-head" in f.message.replace("not per-head", "")) == bool(head)


def test_qdq_attention_is_counted(write_policy):
    """Attention whose score and context MatMuls read DequantizeLinear outputs is attention: the declared count holds,
    never "none found"."""
    policy = write_policy("name: p\nmodel: {attention_layers: 2, moe_layers: 2}\n")
    found = lint_findings(EXPORTED / "quantqdq-mixtral" / "model.onnx", policy,
                          select=["attention-layer-count-mismatch", "moe-layer-count-mismatch"])
    assert found == []


def test_qdq_attention_in_orts_dump_is_counted(write_policy, tmp_path):
    """ORT's dump of the QDQ graph turns the score and context MatMuls into QLinearMatMul (and the rotary's Muls into
    QLinearMul): attention is still found in every layer, and the rotary it cannot read is said as undecided."""
    dump = tmp_path / "model.optimized.onnx"
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(dump)
    model = EXPORTED / "quantqdq-mixtral" / "model.onnx"
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    policy = write_policy("name: p\nmodel: {attention_layers: 2}\n")
    found = lint_findings(model, policy, optimized=dump,
                          select=["attention-layer-count-mismatch", "gqa-not-fused", "rotary-not-fused"])
    assert not [f for f in found if f.rule == "attention-layer-count-mismatch"]
    assert _layers(found, "gqa-not-fused") == [0, 1]
    assert all(f.kind is not Kind.VIOLATION or f.layer in (0, 1) for f in found if f.rule == "rotary-not-fused")
    assert {f.layer for f in found if f.rule == "rotary-not-fused"} == {0, 1}
