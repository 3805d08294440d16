"""Will the deployment fit: the device memory a session of the graph needs, added up per part, from the graph's
initializer dims and dtypes and the deployment's lengths (never a weight byte).

    weights     every initializer once, as stored: dims x dtype size (int4 and MatMulNBits/QMoE packing included,
                a tied embedding shared by the Gather and the lm_head counted once); the external-data length
                where the dtype has no size
    KV cache    per layer 2 x kv_heads x head_size x dtype x positions x batch, positions the deployment's length
                (genai_config's search.max_length when past_present_share_buffer pre-allocates one buffer of it,
                else the policy's context, with past and present both alive during a step: twice), a sliding
                window's layer holding its window
    linear      the recurrent and convolution states of linear-attention layers, past and present (twice)
    workspace   a bound on activations: the logits (tokens x vocabulary in the logits' dtype) plus 4 live copies of
                the widest activation (tokens x the widest weight dim), tokens = batch x the longest step (the
                prompt when a prompt length is given; a decoder without a KV cache: the whole context, which it
                recomputes at every step, plus its decomposed attention's scores and their softmax over all those
                positions, one layer at a time); ORT's planner reuses buffers between nodes, so a step holds a
                few of its largest values at once

What depends on what ortgate cannot see is listed, never added in: the CUDA context and library workspaces, the
allocator's arena growth, pre-packed weight copies, other processes. Every figure is an estimate for the device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ortgate.cost.model import StepModel
from ortgate.cost.shapes import DTYPE_BYTES, StepShape, dtype_bytes
from ortgate.graph.index import Graph
from ortgate.graph.patterns.attention import LINEAR_ATTENTION_OPS, attention_cores
from ortgate.graph.patterns.projections import decomposed_heads
from ortgate.knowledge.devices import Device

LIVE_ACTIVATIONS = 4  # copies of the widest activation the workspace bound allows
NOT_SEEN = (
    ("the CUDA (or ROCm, CANN) context and the math libraries' workspaces (cuBLAS, cuDNN: commonly a few hundred MiB "
     "per process), which depend on the driver and the kernels chosen"),
    ("the allocator's arena growth (ORT's BFC arena extends by powers of two by default, up to twice the largest "
     "request) and buffers a provider keeps for CUDA graph replay"),
    "copies of weights some kernels pre-pack at session creation (CPU MatMulNBits and QMoE, TensorRT engines)",
    "memory other processes on the device hold",
)


@dataclass(frozen=True)
class MemoryPart:
    """One part of the estimated memory: its name, bytes and how they were counted."""

    name: str  # "weights" | "kv_cache" | "linear_state" | "workspace"
    bytes: float
    how: str


@dataclass(frozen=True)
class MemoryEstimate:
    """The memory a deployment needs on one device (an estimate; see the module docstring)."""

    device: Device
    batch: int
    kv_length: int  # positions the KV cache holds per sequence
    kv_source: str  # where that length comes from
    shared_buffer: bool  # past_present_share_buffer: one KV buffer of kv_length
    parts: tuple[MemoryPart, ...]
    kv_bytes_per_position: float  # every layer's K + V for one position of one sequence, as allocated
    kv_window_bytes: float  # what the sliding-window layers hold at their windows (does not grow with the length)
    full_context: int | None = None  # the model's context length (genai_config model.context_length)
    not_counted: tuple[str, ...] = NOT_SEEN
    uncounted: tuple[str, ...] = ()  # parts of the graph that could not be sized
    weights_by_dtype: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(p.bytes for p in self.parts)

    @property
    def capacity(self) -> float | None:
        return self.device.memory_bytes

    @property
    def share(self) -> float | None:
        cap = self.capacity
        return self.total / cap if cap else None

    def part(self, name: str) -> float:
        return sum(p.bytes for p in self.parts if p.name == name)

    def kv_at(self, length: int) -> float:
        """The KV cache at another length (same batch and buffer layout)."""
        copies = 1 if self.shared_buffer else 2
        return copies * self.batch * self.kv_bytes_per_position * length + self.kv_window_bytes

    def length_fitting(self, share: float) -> int | None:
        """The largest KV length whose total stays within `share` of the device (rounded down to 256), or None when
        even no KV cache fits (or the KV cache does not grow with the length)."""
        cap = self.capacity
        if not cap:
            return None
        per_position = (1 if self.shared_buffer else 2) * self.batch * self.kv_bytes_per_position
        if per_position <= 0:
            return None
        room = share * cap - (self.total - self.part("kv_cache")) - self.kv_window_bytes
        if room <= 0:
            return None
        length = int(room // per_position)
        return (length // 256) * 256 if length >= 256 else length

    @property
    def at_full_context(self) -> bool:
        """The shared KV buffer is the model's whole context (onnxruntime-genai's builder wrote max_length =
        context_length: onnxruntime-genai#2251)."""
        return self.shared_buffer and self.full_context is not None and self.kv_length >= self.full_context

    def to_dict(self) -> dict[str, Any]:
        return {
            "estimate": True,
            "device": self.device.name,
            "memory_gib": self.device.memory_gib.to_dict(),
            "batch_size": self.batch,
            "kv_length": self.kv_length,
            "kv_length_from": self.kv_source,
            "past_present_share_buffer": self.shared_buffer,
            "parts": {p.name: {"bytes": round(p.bytes), "how": p.how} for p in self.parts},
            "weights_by_dtype": {k: round(v) for k, v in sorted(self.weights_by_dtype.items())},
            "total_bytes": round(self.total),
            "share_of_device": None if self.share is None else round(self.share, 4),
            "kv_bytes_per_position": round(self.kv_bytes_per_position),
            "not_counted": list(self.not_counted),
            "uncounted": list(self.uncounted),
        }


def weight_bytes(graph: Graph) -> tuple[float, dict[str, float], list[str]]:
    """(bytes, bytes per dtype, initializers that could not be sized): every initializer once, as stored."""
    total = 0.0
    by_dtype: dict[str, float] = {}
    unsized: list[str] = []
    prod, ceil = math.prod, math.ceil
    for name, init in graph.initializers.items():
        dtype = init.dtype
        size = DTYPE_BYTES.get(dtype or "")
        if size is not None:
            n = ceil(prod(init.dims) * size)  # the element count, as Initializer.numel counts it
        else:
            n = init.external_length or 0
            if not n:
                unsized.append(f"initializer {name}: dtype {dtype or '?'} has no known size: not counted")
                continue
        total += n
        key = dtype or "?"
        by_dtype[key] = by_dtype.get(key, 0.0) + n
    return total, by_dtype, unsized


def mxfp4_repack_bytes(graph: Graph, cuda_release: str | None) -> tuple[float, str]:
    """The second copy of the expert weights of MXFP4 QMoE nodes whose expert shape is outside the CUDA interleaved
    GEMV rules: 'doubles the persistent MoE weight footprint; shapes with k % 64 == 0 and n % 16 == 0 avoid it'
    (knowledge/ort_cuda_contracts.json, onnxruntime-gpu 1.31.1 and later). (0, "") where none is, or not on CUDA."""
    from ortgate.knowledge.cuda_contracts import cuda_contracts
    from ortgate.knowledge.deployment_facts import at_least

    facts = cuda_contracts()
    if cuda_release is None or not at_least(cuda_release, facts.since):
        return 0.0, ""
    rule = facts.mxfp4_shape
    total, nodes = 0.0, 0
    for node in graph.by_op("com.microsoft", "QMoE"):
        quant = node.attr("quant_type", "int")
        if (quant.decode() if isinstance(quant, bytes) else str(quant)) != "fp4":
            continue
        shape = graph.shape(node.input(2))
        if shape is None or len(shape) != 3 or not all(isinstance(d, int) for d in shape[1:]):
            continue
        n, k2 = shape[1], shape[2]
        assert isinstance(n, int) and isinstance(k2, int)
        if (2 * k2) % rule.k_multiple == 0 and n % rule.n_multiple == 0:
            continue
        nodes += 1
        for i in (2, 5, 8):  # fc1, fc2, fc3 expert weights
            init = graph.initializers.get(node.input(i)) if node.input(i) else None
            size = DTYPE_BYTES.get(init.dtype or "") if init is not None else None
            if init is not None and size is not None:
                total += math.ceil(math.prod(init.dims) * size)
    if not total:
        return 0.0, ""
    return total, (f"the expert weights of {nodes} MXFP4 QMoE node{'s' if nodes > 1 else ''} held twice on CUDA: "
                   f"'{rule.message}' ({facts.source})")


def _kv(step: StepModel, length: int) -> tuple[float, float, list[str]]:
    """(K + V bytes per position of one sequence over the layers that grow with the length, bytes per sequence the
    sliding-window and fixed-length layers hold, what could not be sized)."""
    per_position = 0.0
    fixed = 0.0
    shape = step.shape
    for info in step.kv.values():
        positions = info.get("positions") or 0
        if not positions:
            continue
        per_seq_position = info["bytes"] / (positions * shape.batch)
        cap = info.get("window") or (positions if positions < shape.context else None)
        if cap is not None and cap < length:
            fixed += per_seq_position * cap
        else:
            per_position += per_seq_position
    return per_position, fixed, [u.what for u in step.uncounted if u.what.startswith("KV cache")]


def _linear_state(graph: Graph, batch: int) -> tuple[float, list[str]]:
    total = 0.0
    missing: list[str] = []
    shape = StepShape(batch, 1, 1)
    inputs = graph.input_names
    seen: set[str] = set()
    for d, o in LINEAR_ATTENTION_OPS:
        for node in graph.by_op(d, o):
            for name in node.inputs:
                if name not in inputs or name in seen:
                    continue
                seen.add(name)
                n, unresolved = shape.numel(graph.shape(name))
                size = dtype_bytes(graph.dtype(name))
                if n is None or size is None:
                    missing.append(f"state {name}: {'dims ' + ', '.join(unresolved) if n is None else 'dtype'} "
                                   "unknown: not counted")
                    continue
                total += 2.0 * n * size  # past and present
    return total, missing


def _workspace(graph: Graph, tokens: int) -> tuple[float, str]:
    logits = next((o for o in graph.outputs if o.name == "logits"), graph.outputs[0] if graph.outputs else None)
    vocab = None
    act = 2.0
    if logits is not None and logits.shape and isinstance(logits.shape[-1], int):
        vocab = logits.shape[-1]
    if logits is not None:
        act = dtype_bytes(logits.dtype) or 4.0
    widest = 0
    for init in graph.initializers.values():
        dims = init.dims
        if len(dims) < 2:
            continue
        for d in dims[-2:]:
            if d != vocab and d > widest:
                widest = d
    logits_bytes = tokens * (vocab or 0) * act
    live = LIVE_ACTIVATIONS * tokens * widest * act
    how = (f"logits {tokens:,} tokens x {vocab or '?'} x {act:g} B, plus {LIVE_ACTIVATIONS} live activations of "
           f"{tokens:,} tokens x {widest:,} (the widest weight dim) x {act:g} B")
    return logits_bytes + live, how


def _recomputed_scores(graph: Graph, batch: int, positions: int) -> tuple[float | None, str]:
    """The score tensors decomposed attention materialises when every position is recomputed: the QK^T product and
    its softmax, batch x q heads x positions x positions each, in the scores' dtype, for one layer at a time (the
    planner frees a layer's before the next). (0, '') without decomposed attention; None when its heads are not in
    the graph."""
    widest: tuple[int, float] | None = None
    for core in attention_cores(graph):
        heads = decomposed_heads(graph, core.softmax)
        if heads is None:
            return None, ""
        size = dtype_bytes(graph.dtype(core.softmax.outputs[0]) if core.softmax.outputs else None) or 4.0
        if widest is None or heads.q_heads * size > widest[0] * widest[1]:
            widest = (heads.q_heads, size)
    if widest is None:
        return 0.0, ""
    q_heads, size = widest
    scores = 2.0 * batch * q_heads * positions * positions * size
    return scores, (f"decomposed attention's scores and their softmax, {batch:,} x {q_heads} heads x {positions:,} x "
                    f"{positions:,} x {size:g} B each, one layer at a time")


def memory_estimate(graph: Graph, step: StepModel, device: Device, *, batch: int, kv_length: int, kv_source: str,
                    shared_buffer: bool, longest_step: int = 1, full_context: int | None = None,
                    stored: Graph | None = None, cuda_release: str | None = None) -> MemoryEstimate:
    """The memory of a deployment of `graph` on `device`. `step` is the cost model's step model of the executed
    graph (its KV layout per layer); `stored` the graph whose initializers are the weights on disk (default:
    `graph`); `longest_step` the most tokens one sequence feeds in one run (the prompt); `cuda_release` the ONNX
    Runtime release of a CUDA deployment (None: not CUDA), whose kernel contracts can hold weights twice."""
    weights, by_dtype, unsized = weight_bytes(stored or graph)
    per_position, fixed, kv_missing = _kv(step, kv_length)
    copies = 1 if shared_buffer else 2
    kv = copies * batch * (per_position * kv_length) + copies * batch * fixed
    linear, linear_missing = _linear_state(graph, batch)
    # A decoder without a KV cache recomputes every position at every step (the cost model prices it so): its
    # activations and logits are those of the whole context, for each sequence.
    recompute = step.recomputed_tokens is not None
    positions = max(step.shape.context, longest_step) if recompute else max(1, longest_step)
    workspace, how = _workspace(graph, batch * positions)
    scores_missing = False
    if recompute:
        how += (f" (no KV cache: every step recomputes all {positions:,} positions of each of the {batch:,} "
                "sequences)")
        scores, said = _recomputed_scores(graph, batch, positions)
        if scores is None:
            scores_missing = bool(attention_cores(graph))
        elif scores:
            workspace += scores
            how += f"; {said}"
    buffer = ("one shared past/present buffer" if shared_buffer
              else "past and present both alive during a step (twice)")
    kv_how = (f"none: the graph has no KV cache (its {positions:,} positions are recomputed: see workspace)"
              if recompute and not kv else f"{kv_length:,} positions x batch {batch} ({kv_source}); {buffer}")
    parts = [
        MemoryPart("weights", weights, f"{len((stored or graph).initializers):,} initializers as stored"),
        MemoryPart("kv_cache", kv, kv_how),
    ]
    if scores_missing:
        kv_missing.append(f"attention scores of recomputing {positions:,} positions: up to batch x heads x "
                          f"{positions:,} x {positions:,} per layer where attention is decomposed (its heads are not "
                          "in the graph): not counted")
    repack, repack_how = mxfp4_repack_bytes(graph, cuda_release)
    if repack:
        parts.append(MemoryPart("mxfp4_repack", repack, repack_how))
    if linear:
        parts.append(MemoryPart("linear_state", linear, f"recurrent and convolution states x batch {batch}, past "
                                                        "and present"))
    parts.append(MemoryPart("workspace", workspace, how))
    return MemoryEstimate(device, batch, kv_length, kv_source, shared_buffer, tuple(parts), per_position,
                          copies * batch * fixed, full_context, uncounted=tuple(unsized + kv_missing + linear_missing),
                          weights_by_dtype=by_dtype)


def format_gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB" if n >= 2**30 / 10 else f"{n / 2**20:,.1f} MiB"
