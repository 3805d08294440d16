"""`ortgate fix` rewrites the decomposed attention of exports with a KV cache into com.microsoft.GroupQueryAttention:
head counts read from the projections' shapes, the past/present interface kept under its names, the fixed folder
verified on ORT CPU by fix itself (prompt and cache steps, batch 1 and 2) and checked here again at a step fix does
not run; an attention the rule cannot take is left with the rule's reason."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tests.conftest import EXPORTED
from tests.helpers import lint_findings
from tests.test_fix import fix_json

WITH_CACHE = ["optimum-qwen3_moe-past", "optimum-llama-past"]


def io_names(path) -> tuple[list[str], list[str]]:
    model = onnx.load(str(path), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


def feeds_for(session: ort.InferenceSession, batch: int, new: int, past: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in session.get_inputs():
        if i.name == "input_ids":
            feeds[i.name] = rng.integers(0, 100, (batch, new)).astype(np.int64)
        elif i.name == "attention_mask":
            feeds[i.name] = np.ones((batch, past + new), np.int64)
        elif i.name == "position_ids":
            feeds[i.name] = np.tile(np.arange(past, past + new), (batch, 1)).astype(np.int64)
        else:
            shape = [batch if d == "batch_size" else past if isinstance(d, str) else d for d in i.shape]
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("folder", WITH_CACHE)
def test_attention_with_a_cache_becomes_group_query_attention(tmp_path, folder):
    source = EXPORTED / folder
    config = json.loads((source / "BUILD_INFO.json").read_text())["hf_config"]
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out)
    assert code == 0 and report["verification"]["passed"], report["verification"]
    fixed = out / "model.onnx"
    model = onnx.load(str(fixed), load_external_data=False)
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention" and n.domain == "com.microsoft"]
    assert len(gqa) == config["num_hidden_layers"]
    for node in gqa:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["num_heads"] == config["num_attention_heads"]
        assert attrs["kv_num_heads"] == config["num_key_value_heads"]
        assert node.input[3].startswith("past_key_values.") and node.output[1].startswith("present.")
    assert io_names(fixed) == io_names(source / "model.onnx")
    assert not lint_findings(fixed, select=["gqa-not-fused"])
    # a step fix's verification does not run: a 5-token prompt after 7 cached tokens, batch 1
    original = ort.InferenceSession(str(source / "model.onnx"), providers=["CPUExecutionProvider"])
    rewritten = ort.InferenceSession(str(fixed), providers=["CPUExecutionProvider"])
    feeds = feeds_for(original, 1, 5, 7, seed=3)
    for a, b in zip(original.run(None, feeds), rewritten.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_an_attention_without_attention_mask_is_left_with_the_rules_reason(tmp_path):
    model = onnx.load(str(EXPORTED / "optimum-llama-past" / "model.onnx"))
    for value in model.graph.input:
        if value.name == "attention_mask":
            value.name = "mask"
    for node in model.graph.node:
        node.input[:] = ["mask" if i == "attention_mask" else i for i in node.input]
    source = tmp_path / "in" / "model.onnx"
    source.parent.mkdir()
    onnx.save(model, source)
    code, report = fix_json(source, "-o", tmp_path / "out")
    assert code == 0
    missed = [layer["missed"]["attention"] for layer in report["fusions"]["layers"] if "attention" in layer["missed"]]
    assert len(missed) == 2
    assert "no attention_mask input" in missed[0]["reason"], missed[0]["reason"]
    assert not any(op == "GroupQueryAttention" for layer in report["fusions"]["layers"] for op in layer["became"])


def _scale_v_projection(folder, only_with_gqa: bool = False) -> None:
    """Multiply the first v_proj weight of the staged model by 1.5 (q and k have per-head norms after them in Qwen3,
    which a scaling cancels) (loaded whole, written back the same way)."""
    path = folder / "model.onnx"
    model = onnx.load(str(path))
    if only_with_gqa and not any(n.op_type == "GroupQueryAttention" for n in model.graph.node):
        return
    v = next(n for n in model.graph.node if "v_proj" in n.name and n.op_type == "MatMul")
    weight = next(t for t in model.graph.initializer if t.name == v.input[1])
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(1.5), weight.name))
    for data in folder.glob("*.data"):
        data.unlink()
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="model.onnx.data", size_threshold=1024)


@pytest.mark.parametrize("folder", WITH_CACHE)
def test_the_fixed_folder_generates_the_originals_greedy_tokens(tmp_path, folder):
    code, report = fix_json(EXPORTED / folder, "-o", tmp_path / "out")
    assert code == 0
    tokens = report["tokens"]
    assert tokens["passed"] and tokens["fixed"] == "its own KV cache"
    assert [b["batch"] for b in tokens["batches"]] == [1, 2]
    for batch in tokens["batches"]:
        assert batch["steps"] >= 32 and batch["ids_equal"] and len(batch["ids"][0]) >= 32
    # the rows of batch 2 are two different prompts: not one sequence twice
    assert tokens["batches"][1]["ids"][0] != tokens["batches"][1]["ids"][1]


def test_a_corrupted_attention_weight_fails_the_proof_and_writes_nothing(tmp_path, monkeypatch):
    import ortgate.fix.pipeline as pipeline

    monkeypatch.setattr(pipeline, "after_write", lambda staged: _scale_v_projection(staged.folder))
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "optimum-llama-past", "-o", out)
    assert code == 1
    assert not out.exists() and not list(tmp_path.glob(".out.ortgate-tmp-*"))
    assert report["verification"]["passed"] is False


def test_an_attention_rewrite_that_cannot_be_proven_is_dropped_and_the_rest_lands(tmp_path, monkeypatch):
    """Only the staging with GroupQueryAttention is corrupted: that one fails, the one with the model's own
    attention is proven and written, and the report says why attention was kept."""
    import ortgate.fix.pipeline as pipeline

    monkeypatch.setattr(pipeline, "after_write", lambda staged: _scale_v_projection(staged.folder, only_with_gqa=True))
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "optimum-qwen3_moe-past", "-o", out)
    assert code == 0 and report["verification"]["passed"]
    assert report["attention_kept"]
    assert "verification failed" in report["attention_kept"] or "tokens diverge" in report["attention_kept"]
    ops = [n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node]
    assert "GroupQueryAttention" not in ops and "MoE" in ops and "SkipSimplifiedLayerNormalization" in ops


def test_tokens_that_diverge_drop_the_attention_rewrite(tmp_path, monkeypatch):
    """With no tolerance, the float rounding GroupQueryAttention changes is a divergence: the token proof fails where
    the whole-model verification (its own tolerance) passes, and the folder lands with the original attention."""
    import ortgate.fix.generate as generate

    monkeypatch.setattr(generate, "RTOL", 0.0)
    monkeypatch.setattr(generate, "ATOL", 0.0)
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "optimum-llama-past", "-o", out)
    assert code == 0
    assert report["attention_kept"].startswith("the greedy tokens diverge: batch 1: step 0: logits differ")
    ops = [n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node]
    assert "GroupQueryAttention" not in ops and "SkipSimplifiedLayerNormalization" in ops


@pytest.mark.parametrize("folder", WITH_CACHE)
def test_with_a_context_length_the_rotary_is_folded_in(tmp_path, folder):
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / folder, "-o", out, "--context-length", "64")
    assert code == 0 and report["tokens"]["passed"] and report["attention_kept"] is None
    model = onnx.load(str(out / "model.onnx"))
    inits = {t.name: t for t in model.graph.initializer}
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 0
        cos = numpy_helper.to_array(inits[node.input[7]])
        sin = numpy_helper.to_array(inits[node.input[8]])
        assert cos.shape == sin.shape == (64, 8)
        np.testing.assert_allclose(cos[0], 1.0) and np.testing.assert_allclose(sin[0], 0.0, atol=1e-7)
    assert not lint_findings(out / "model.onnx", select=["rotary-not-fused", "gqa-not-fused"])


def test_without_a_context_length_the_rotary_stays_beside_and_says_why(tmp_path):
    code, report = fix_json(EXPORTED / "optimum-llama-past", "-o", tmp_path / "out")
    assert code == 0
    missed = [layer["missed"]["rotary"]["reason"] for layer in report["fusions"]["layers"] if "rotary" in layer["missed"]]
    assert missed and all("pass --context-length N" in why for why in missed)


def test_three_projections_of_one_input_become_one_packed_qkv_matmul(tmp_path):
    """Llama's q, k and v are MatMuls of one normalised input with nothing but the rotary between them and the
    attention: with the rotary folded in, one MatMul by [Wq | Wk | Wv] feeds GroupQueryAttention's packed input."""
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "optimum-llama-past", "-o", out, "--context-length", "64")
    assert code == 0 and report["tokens"]["passed"]
    model = onnx.load(str(out / "model.onnx"))
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {t.name: t for t in model.graph.initializer}
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        assert list(node.input[1:3]) == ["", ""]
        matmul = producers[node.input[0]]
        assert matmul.op_type == "MatMul"
        assert list(inits[matmul.input[1]].dims) == [64, 64 + 2 * 32]  # 4 q heads and 2 + 2 kv heads of 16
    assert sum(n.op_type == "MatMul" for n in model.graph.node) == 2 * 2 + 2 * 3 + 1  # qkv, o; gate/up/down; lm_head


def test_q_k_norms_keep_separate_projections(tmp_path):
    out = tmp_path / "out"
    code, _ = fix_json(EXPORTED / "optimum-qwen3_moe-past", "-o", out, "--context-length", "64")
    assert code == 0
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    for node in (n for n in model.graph.node if n.op_type == "GroupQueryAttention"):
        assert node.input[1] and node.input[2]


CACHE_LESS = ["dynamo-qwen3_moe", "dynamo-mixtral", "dynamo-olmoe"]


@pytest.mark.parametrize("folder", CACHE_LESS)
def test_a_cache_less_export_gains_a_kv_cache_proven_by_its_tokens(tmp_path, folder):
    """torch.onnx (dynamo) exports without a cache: with the rotary folded in, each attention becomes
    GroupQueryAttention over new past_key_values.N.key/value inputs and present.N.key/value outputs, as
    onnxruntime-genai's builder names them; the original, recomputing its sequence each step, and the fixed model,
    fed its own presents, generate the same 32 greedy tokens at batch 1 and 2."""
    source = EXPORTED / folder / "model.onnx"
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out, "--context-length", "64")
    assert code == 0 and report["attention_kept"] is None
    tokens = report["tokens"]
    assert tokens["passed"] and tokens["original"].startswith("recomputing") and tokens["fixed"] == "its own KV cache"
    assert all(b["steps"] >= 32 for b in tokens["batches"])
    inputs, outputs = io_names(out / "model.onnx")
    layers = sum(name.endswith(".key") for name in inputs)
    assert layers >= 2
    assert inputs[:2] == io_names(source)[0][:2]
    assert [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")] == inputs[2:]
    assert outputs == ["logits"] + [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    fixed = lint_findings(out / "model.onnx")
    assert not [f for f in fixed if f.rule in ("decoder-without-kv-cache", "gqa-not-fused", "rotary-not-fused",
                                               "rmsnorm-not-fused", "skip-rmsnorm-not-fused", "moe-not-fused")]


def test_a_cache_less_export_without_a_context_length_stays_cache_less(tmp_path):
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-qwen3_moe", "-o", out)
    assert code == 0 and report["tokens"] is None
    inputs, _ = io_names(out / "model.onnx")
    assert not any(name.startswith("past_key_values.") for name in inputs)


def test_a_new_cache_that_cannot_be_proven_is_not_delivered(tmp_path, monkeypatch):
    """When ORT does not build a session of the original within the limit, the original is not run whole, so no
    tokens prove a new KV cache: the fix lands with the export's own (cache-less) attention and says why."""
    import ortgate.fix.verify as verify

    monkeypatch.setattr(verify, "SESSION_BUILD_LIMIT_S", 0.001)  # no child process starts this fast
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-qwen3_moe", "-o", out, "--context-length", "64")
    assert code == 0 and report["verification"]["passed"]
    assert report["attention_kept"] and report["tokens"] is None
    inputs, _ = io_names(out / "model.onnx")
    assert not any(name.startswith("past_key_values.") for name in inputs)


@pytest.mark.parametrize(("folder", "plain"), [
    ("dynamo-deepseek_v3", "multi-head latent attention: GroupQueryAttention has no latent projection"),
    ("dynamo-gpt_oss", "attention sinks: not written"),
    ("dynamo-qwen3_next", "gated attention output: not written"),
    ("dynamo-jamba", "mamba / linear-attention layers"),
])
def test_an_attention_gqa_cannot_express_is_left_with_a_plain_reason(tmp_path, folder, plain):
    """MLA, attention sinks, a gated output and hybrids with mamba / linear-attention layers keep their attention: the
    report says which form it is, in words, and keeps the rule's near-miss (onnxscript's MatchingTracer) as the
    detail."""
    code, report = fix_json(EXPORTED / folder / "model.onnx", "-o", tmp_path / "out", "--context-length", "64")
    assert code == 0
    missed = [layer["missed"]["attention"]["reason"] for layer in report["fusions"]["layers"]
              if "attention" in layer["missed"]]
    assert missed
    for reason in missed:
        assert reason.startswith("left as it is: ") and plain in reason, reason
        assert "ortgate's GroupQueryAttention rule came closest at" in reason
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph.node]
    assert "GroupQueryAttention" not in ops


def test_attention_gqa_expresses_gets_no_plain_reason():
    import onnx_ir as ir

    from ortgate.fix.attention import plain_reasons

    for folder in ("dynamo-qwen3_moe", "dynamo-mixtral", "optimum-llama-past", "optimum-qwen3_moe-past"):
        assert plain_reasons(ir.load(str(EXPORTED / folder / "model.onnx"))) == [], folder


def _with_mask(tmp_path, how: str, window: int = 8):
    """dynamo-qwen3_moe (cache-less) with its additive attention mask changed, still computed from attention_mask:
    "window" adds a band hiding the positions `window` or more before the diagonal (a sliding window of `window`
    positions, as Mistral's); "open" multiplies it by 0 (no mask: bidirectional, not causal)."""
    model = onnx.load(str(EXPORTED / "dynamo-qwen3_moe" / "model.onnx"))
    softmax_inputs = {n.input[0] for n in model.graph.node if n.op_type == "Softmax"}
    masks = {n.input[1] for n in model.graph.node if n.op_type == "Add" and n.output[0] in softmax_inputs}
    assert len(masks) == 1
    (mask,) = masks
    nodes = []
    for node in model.graph.node:
        if node.op_type == "Add" and node.output[0] in softmax_inputs:
            node.input[1] = f"{mask}_changed"
        nodes.append(node)
        if mask in node.output and how == "window":
            nodes += [helper.make_node("Shape", [mask], [f"{mask}_shape"]),
                      helper.make_node("ConstantOfShape", [f"{mask}_shape"], [f"{mask}_full"],
                                       value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [1], [-1e9])),
                      helper.make_node("Trilu", [f"{mask}_full", f"{mask}_k"], [f"{mask}_band"], upper=0),
                      helper.make_node("Add", [mask, f"{mask}_band"], [f"{mask}_changed"])]
            model.graph.initializer.append(helper.make_tensor(f"{mask}_k", onnx.TensorProto.INT64, [], [-window]))
        elif mask in node.output:
            nodes.append(helper.make_node("Mul", [mask, f"{mask}_zero"], [f"{mask}_changed"]))
            model.graph.initializer.append(helper.make_tensor(f"{mask}_zero", onnx.TensorProto.FLOAT, [], [0.0]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = tmp_path / how / "model.onnx"
    path.parent.mkdir()
    onnx.save(model, str(path))
    return path


def test_a_sliding_window_mask_becomes_local_window_size_proven_past_the_window(tmp_path):
    """A mask that is a sliding window of 8 positions is not plain causal: GroupQueryAttention gets
    local_window_size=8 (ORT's kernels keep that many positions up to the diagonal), and the 32 greedy tokens after
    an 8-token prompt, reaching 40 positions past the window, are the original's."""
    source = _with_mask(tmp_path, "window", 8)
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out, "--context-length", "64")
    assert code == 0 and report["attention_kept"] is None
    assert report["tokens"]["passed"]
    assert all(b["prompt_length"] + b["steps"] > 8 for b in report["tokens"]["batches"])
    gqa = [n for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node
           if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2
    assert all({a.name: helper.get_attribute_value(a) for a in n.attribute}["local_window_size"] == 8 for n in gqa)


def test_a_wrong_local_window_size_fails_the_token_proof(tmp_path, monkeypatch):
    """The proof by tokens is what holds the window: one position short of the mask's, the tokens diverge and the
    attention is kept."""
    import ortgate.fix.attention as attention

    monkeypatch.setattr(attention, "_sliding_window_size", lambda width: width - 1)
    source = _with_mask(tmp_path, "window", 8)
    code, report = fix_json(source, "-o", tmp_path / "out", "--context-length", "64")
    assert code == 0 and report["attention_kept"] and "diverge" in report["attention_kept"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph.node]
    assert "GroupQueryAttention" not in ops


def test_a_mask_that_is_not_causal_is_not_rewritten_to_causal_gqa(tmp_path):
    source = _with_mask(tmp_path, "open")
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out, "--context-length", "64")
    assert code == 0 and report["tokens"] is None
    notes = report["fusions"]["attention_notes"]
    assert notes and all("lets positions above the diagonal" in note and "not causal" in note for note in notes)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    assert not any(i.name.startswith("past_key_values.") for i in model.graph.input)


def test_an_export_that_writes_a_cache_it_never_reads_is_refused_with_the_reason(tmp_path):
    """transformers' OnnxExporter (ort_fusions='cpu') writes GroupQueryAttention with cache.layers.N.keys / values
    out and no past in, batch fixed at 1: fix does not rewire it to a KV cache and says why, with what to export."""
    code, report = fix_json(EXPORTED / "tfexp-qwen3_moe-cpu", "-o", tmp_path / "out", "--context-length", "64")
    assert code == 0
    (warning,) = [w for w in report["warnings"] if "reads none" in w]
    assert "cache.layers.0.keys" in warning and "2 GroupQueryAttention nodes" in warning
    assert "batch is fixed at 1" in warning and "past_key_values inputs" in warning
    assert report["tokens"] is None


def test_an_export_with_its_cache_fed_back_gets_no_such_warning(tmp_path):
    code, report = fix_json(EXPORTED / "optimum-llama-past", "-o", tmp_path / "out")
    assert code == 0 and not [w for w in report["warnings"] if "reads none" in w]


def test_a_partial_rotary_is_folded_into_group_query_attention_proven_by_tokens(tmp_path):
    """GLM-4.5-MoE rotates the first 16 of its 32 head dims (partial_rotary_factor 0.5) and passes the rest through:
    GroupQueryAttention folds it in with cos/sin caches 8 wide (half the rotated dims), and the cache-less export,
    given a KV cache, generates the original's 32 greedy tokens at batch 1 and 2."""
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-glm4_moe-rotary16", "-o", out, "--context-length", "64")
    assert code == 0 and report["attention_kept"] is None
    assert report["tokens"]["passed"] and all(b["steps"] >= 32 for b in report["tokens"]["batches"])
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    caches = {t.name: list(t.dims) for t in model.graph.initializer}
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2
    for node in gqa:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 0
        assert caches[node.input[7]] == [64, 8] and caches[node.input[8]] == [64, 8]
    fixed = lint_findings(out / "model.onnx")
    assert not [f for f in fixed if f.rule in ("decoder-without-kv-cache", "gqa-not-fused", "rotary-not-fused")]


def test_a_partial_rotary_ort_cannot_take_stays_beside_with_the_reason(tmp_path):
    """8 of 16 head dims rotated: cos/sin caches 4 wide, which ONNX Runtime's GroupQueryAttention refuses (narrower
    than half the head only in multiples of 8): the rotary and attention stay, and the report says why."""
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-glm4_moe", "-o", out, "--context-length", "64")
    assert code == 0 and report["tokens"] is None
    reasons = [layer["missed"]["rotary"]["reason"] for layer in report["fusions"]["layers"]
               if "rotary" in layer["missed"]]
    assert reasons and all("a partial rotary of 8 of 16 head dims" in r and "multiples of 8" in r for r in reasons)
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not any(n.op_type == "GroupQueryAttention" for n in model.graph.node)


def test_an_interleaved_partial_rotary_is_folded_in_proven_by_tokens(tmp_path):
    """GLM-4 rotates adjacent channel pairs (x0, x1), (x2, x3)... of the first 16 of its 32 head dims: folded into
    GroupQueryAttention with rotary_interleaved=1 and cos/sin caches of one value per pair, and the cache-less export,
    given a KV cache, generates the original's 32 greedy tokens at batch 1 and 2; nothing is left for the lint."""
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-glm4-interleaved", "-o", out, "--context-length", "64")
    assert code == 0 and report["attention_kept"] is None
    assert report["tokens"]["passed"] and all(b["steps"] >= 32 for b in report["tokens"]["batches"])
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    caches = {t.name: list(t.dims) for t in model.graph.initializer}
    gqa = [n for n in model.graph.node if n.op_type == "GroupQueryAttention"]
    assert len(gqa) == 2
    for node in gqa:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["do_rotary"] == 1 and attrs["rotary_interleaved"] == 1
        assert caches[node.input[7]] == [64, 8]
    fixed = lint_findings(out / "model.onnx")
    assert not [f for f in fixed if f.rule in ("decoder-without-kv-cache", "gqa-not-fused", "rotary-not-fused",
                                               "rmsnorm-not-fused", "skip-rmsnorm-not-fused")]


def test_an_interleaved_rotary_read_as_half_split_is_not_folded(tmp_path, monkeypatch):
    """The graph's own cos/sin tables hold the layout: read as half-split, GLM-4's pairwise tables are not [c, c]
    halves, so the rotary stays beside, the cache-less export stays cache-less, and the report says why."""
    import ortgate.fix.attention as attention

    original = attention._rotate_half_of
    monkeypatch.setattr(attention, "_rotate_half_of", lambda value: original(value) or
                        attention._rotate_interleaved_of(value))
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-glm4-interleaved", "-o", out, "--context-length", "64")
    assert code == 0 and report["tokens"] is None
    reasons = [layer["missed"]["rotary"]["reason"] for layer in report["fusions"]["layers"]
               if "rotary" in layer["missed"]]
    assert reasons and all("each value twice (in halves)" in r for r in reasons), reasons
    model = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert not any(n.op_type == "GroupQueryAttention" for n in model.graph.node)
    assert not any(i.name.startswith("past_key_values.") for i in model.graph.input)


def test_a_group_query_attention_ort_refuses_at_run_time_keeps_the_attention(tmp_path, monkeypatch):
    """Without the check on the cos/sin caches' width, GLM-4.5-MoE's 4-wide caches are written; ONNX Runtime's kernel
    refuses them when the fixed model runs: the token proof fails with ORT's words, the export keeps its attention
    and the rest of the fix lands (no internal error)."""
    import ortgate.fix.attention as attention

    monkeypatch.setattr(attention, "GQA_PARTIAL_COS_MULTIPLE", 1)
    out = tmp_path / "out"
    code, report = fix_json(EXPORTED / "dynamo-glm4_moe", "-o", out, "--context-length", "64")
    assert code == 0 and report["verification"]["passed"]
    assert "ONNX Runtime cannot run the fixed model" in report["attention_kept"], report["attention_kept"]
    assert "cos_cache" in report["attention_kept"]
    ops = [n.op_type for n in onnx.load(str(out / "model.onnx"), load_external_data=False).graph.node]
    assert "GroupQueryAttention" not in ops and "SkipSimplifiedLayerNormalization" in ops
