"""Proof as tokens: the delivered model, loaded from disk, generates the same greedy tokens as the original.

Both models run on ORT CPU (plain sessions, ORT's default options) from fixed prompts at batch 1 and batch 2 (two
different prompts of one length: GroupQueryAttention reads its cache as right-padded, so a padded batch is another
contract, not checked here). Each model uses its own KV cache where it has one (past_key_values.N.key/value in,
present.N.key/value out: the prompt with an empty past, then one token a step fed the presents it returned), and
recomputes the whole sequence each step where it has none. At every step the last position's logits must agree
within tolerance and the argmax ids must be identical; the first step where either fails is the divergence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ortgate.knowledge.provider_names import CPU

STEPS = 32
PROMPT_LENGTH = 8
BATCHES = (1, 2)
RTOL, ATOL = 1e-3, 1e-4
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_NUMPY = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16,
          onnx.TensorProto.DOUBLE: np.float64}


@dataclass
class BatchProof:
    batch: int
    prompt_length: int
    steps: int  # steps compared (equal up to the divergence)
    max_abs: float
    max_rel: float
    ids_equal: bool
    divergence: str | None = None  # the first step that differs, and how
    ids: list[list[int]] = field(default_factory=list)  # the original's generated ids per row


@dataclass
class TokenProof:
    passed: bool
    batches: list[BatchProof] = field(default_factory=list)
    original_mode: str = ""  # "its own KV cache" | "recomputing the whole sequence each step"
    fixed_mode: str = ""
    note: str | None = None

    @property
    def why(self) -> str:
        bad = next((b for b in self.batches if b.divergence), None)
        if bad is None:
            return self.note or ""
        return f"batch {bad.batch}: {bad.divergence}"


@dataclass
class _Decoder:
    inputs: list[str]
    past: dict[str, tuple[int | None, int | None, type]]  # past input -> (heads, head size, dtype)
    present: dict[str, str]  # present output -> the past input it feeds
    vocab: int | None


def _dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


def decoder_interface(model: onnx.ModelProto) -> _Decoder | None:
    """The decoder interface proven here, or None (no input_ids / logits)."""
    inputs = [i.name for i in model.graph.input]
    outputs = [o.name for o in model.graph.output]
    if "input_ids" not in inputs or "logits" not in outputs:
        return None
    past: dict[str, tuple[int | None, int | None, type]] = {}
    for value in model.graph.input:
        if _PAST.match(value.name):
            dims = _dims(value)
            if len(dims) != 4:
                return None
            past[value.name] = (dims[1], dims[3], _NUMPY.get(value.type.tensor_type.elem_type, np.float32))
    present = {}
    for name in outputs:
        m = re.match(r"^present\.(\d+)\.(key|value)$", name)
        if m and f"past_key_values.{m.group(1)}.{m.group(2)}" in past:
            present[name] = f"past_key_values.{m.group(1)}.{m.group(2)}"
    if past and len(present) != len(past):
        return None
    logits = next(o for o in model.graph.output if o.name == "logits")
    vocab = _dims(logits)[-1] if _dims(logits) else None
    if vocab is None:
        inits = {t.name: t for t in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == "input_ids":
                table = inits.get(node.input[0])
                if table is not None and len(table.dims) == 2:
                    vocab = int(table.dims[0])
    return _Decoder(inputs, past, present, vocab)


def prompts(batch: int, vocab: int, length: int = PROMPT_LENGTH) -> np.ndarray:
    """Fixed prompts: row r is a seeded draw of `length` ids below `vocab`."""
    rows = [np.random.default_rng(1000 + r).integers(1, max(vocab, 2), length) for r in range(batch)]
    return np.stack(rows).astype(np.int64)


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=[CPU])


def greedy(path: Path, decoder: _Decoder, prompt: np.ndarray, steps: int = STEPS) -> tuple[np.ndarray, list[np.ndarray]]:
    """The ids and the last position's logits of `steps` greedy steps of the model at `path`."""
    session = _session(path)
    batch, length = prompt.shape
    sequence = prompt
    current = prompt
    cache: dict[str, np.ndarray] = {name: np.zeros((batch, heads or 1, 0, size or 1), dtype)
                                    for name, (heads, size, dtype) in decoder.past.items()}
    logits_seen: list[np.ndarray] = []
    ids: list[np.ndarray] = []
    names = [o.name for o in session.get_outputs()]
    for _ in range(steps):
        total = sequence.shape[1]
        feed_ids = current if decoder.past else sequence
        new = feed_ids.shape[1]
        feeds: dict[str, np.ndarray] = {"input_ids": feed_ids}
        if "attention_mask" in decoder.inputs:
            feeds["attention_mask"] = np.ones((batch, total), np.int64)
        if "position_ids" in decoder.inputs:
            feeds["position_ids"] = np.tile(np.arange(total - new, total, dtype=np.int64), (batch, 1))
        feeds.update(cache)
        values = dict(zip(names, session.run(None, feeds)))
        last = values["logits"][:, -1, :].astype(np.float64)
        logits_seen.append(last)
        token = last.argmax(-1).astype(np.int64)[:, None]
        ids.append(token[:, 0])
        cache = {decoder.present[name]: values[name] for name in decoder.present}
        sequence = np.concatenate([sequence, token], axis=1)
        current = token
    return np.stack(ids, axis=1), logits_seen


def prove_tokens(original: Path, fixed: Path, *, steps: int = STEPS) -> TokenProof | None:
    """Greedy generation of the original and the fixed model compared step by step; None where either is not a
    decoder with input_ids and logits."""
    first = decoder_interface(onnx.load(str(original), load_external_data=False))
    second = decoder_interface(onnx.load(str(fixed), load_external_data=False))
    if first is None or second is None:
        return None
    vocab = first.vocab or second.vocab or 32
    proof = TokenProof(True, original_mode=_mode(first), fixed_mode=_mode(second))
    for batch in BATCHES:
        prompt = prompts(batch, vocab)
        ids_a, logits_a = greedy(original, first, prompt, steps)
        try:
            ids_b, logits_b = greedy(fixed, second, prompt, steps)
        except Exception as exc:  # ORT refuses a node it was given (an attribute or input its kernel rejects)
            if not type(exc).__module__.startswith("onnxruntime"):
                raise
            proof.batches.append(BatchProof(
                batch, prompt.shape[1], 0, 0.0, 0.0, False, ids=ids_a.tolist(),
                divergence=f"ONNX Runtime cannot run the fixed model: {' '.join(str(exc).split())}"))
            proof.passed = False
            return proof
        result = BatchProof(batch, prompt.shape[1], 0, 0.0, 0.0, True, ids=ids_a.tolist())
        for step, (a, b) in enumerate(zip(logits_a, logits_b)):
            diff = np.abs(a - b)
            scale = float(np.abs(a).max()) or 1.0
            result.max_abs = max(result.max_abs, float(diff.max()))
            result.max_rel = max(result.max_rel, float(diff.max()) / scale)
            outside = diff > ATOL * max(1.0, scale) + RTOL * np.abs(a)
            if outside.any():
                result.divergence = (f"step {step}: logits differ by up to {float(diff.max()):.3g} "
                                     f"({int(outside.sum())} of {outside.size} outside rtol {RTOL} atol {ATOL})")
                break
            if not np.array_equal(ids_a[:, step], ids_b[:, step]):
                result.divergence = (f"step {step}: token ids {ids_a[:, step].tolist()} (original) against "
                                     f"{ids_b[:, step].tolist()} (fixed)")
                break
            result.steps = step + 1
        result.ids_equal = bool(np.array_equal(ids_a, ids_b))
        proof.batches.append(result)
        if result.divergence or not result.ids_equal:
            proof.passed = False
    return proof


def _mode(decoder: _Decoder) -> str:
    return "its own KV cache" if decoder.past else "recomputing the whole sequence each step"
