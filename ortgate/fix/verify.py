"""Proof that the rewritten model computes what the original does: both run on ORT's CPU provider with the runner's
synthesised inputs, every output compared with the runner's per-dtype tolerance.

Top-k routing is discontinuous: two experts whose router logits tie may swap under a harmless change of rounding, and
the outputs then differ for a legitimate reason. So the inputs are chosen (among a few seeds) so that no token's k-th
and (k+1)-th logits are closer than TIE_MARGIN of their scale, and the margin reached is reported. Each rewritten
node's output is compared too (the MoE node's output keeps the name of the sum it replaces), so a mismatch names the
first rewritten node whose output diverges.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from ortgate.errors import InputError
from ortgate.evidence import OutputComparison
from ortgate.graph.index import Graph
from ortgate.runner.compare import compare_one, compare_outputs
from ortgate.runner.inputs import (
    Feeds,
    graph_signature,
    head_size,
    resolve_dims,
    sliding_window,
    synthesize,
    token_inputs,
    written_positions,
)
from ortgate.runner.session import captured_output, tidy
from ortgate.runner.settings import RunnerSettings

# A decode step of a few sequences: enough tokens that every expert is likely routed to at least once.
VERIFY_SETTINGS = RunnerSettings(batch_size=1, sequence_length=16, past_sequence_length=0)
SEEDS = (0, 1, 2, 3)
# Relative gap between the k-th and (k+1)-th router logit below which routing counts as tied: far above the
# rounding differences of a reordered float32 sum (~1e-7), and of float16/bfloat16 arithmetic (~1e-3).
TIE_MARGIN = {"float32": 1e-5, "float64": 1e-9}
TIE_MARGIN_16BIT = 1e-2


@dataclass
class Probe:
    """One rewritten node whose output both models expose."""

    node: str
    value: str
    comparison: OutputComparison | None = None
    note: str | None = None


@dataclass
class VerifyResult:
    passed: bool
    outputs: list[OutputComparison] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    first_divergent: Probe | None = None
    seed: int = 0
    routing_margin: float | None = None  # smallest relative top-k gap over every router and token
    feeds: dict[str, list[int]] = field(default_factory=dict)  # input -> shape
    max_rel_diff: dict[str, float] = field(default_factory=dict)  # output -> max |diff| / max |reference|
    mode: str = "whole model"  # or "per block" (the original is too large for ORT to build a session of it)
    notes: list[str] = field(default_factory=list)

    @property
    def max_abs(self) -> float:
        return max((c.max_abs_diff or 0.0 for c in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max(self.max_rel_diff.values(), default=0.0)


def accepted_settings(graph: Graph, settings: RunnerSettings) -> RunnerSettings:
    """`settings` with the batch and sequence length of a token input whose dims are literals (an export fixed to
    its example's shape refuses, or breaks inside, any other); unchanged for dynamic dims."""
    for info in graph.inputs:
        shape = info.shape
        if "input_ids" not in info.name.lower() or not shape or len(shape) != 2:
            continue
        batch, seq = shape
        return replace(settings, batch_size=batch if isinstance(batch, int) and batch > 0 else settings.batch_size,
                       sequence_length=seq if isinstance(seq, int) and seq > 0 else settings.sequence_length)
    return settings


def verify(original: onnx.ModelProto, original_dir: Path, fixed: onnx.ModelProto, fixed_dir: Path, graph: Graph,
           probes: list[Probe], routers: list[tuple[str, int]], settings: RunnerSettings = VERIFY_SETTINGS
           ) -> VerifyResult:
    """Run both models on ORT CPU and compare. `probes`: rewritten nodes' outputs present in both graphs; `routers`:
    (router logits value, k) of each rewritten MoE block, for the tie check."""
    settings = accepted_settings(graph, settings)
    signature = graph_signature(graph)
    dims, step = resolve_dims(signature, settings, {}, window=sliding_window(graph, None), head=head_size(None, None),
                              policy_file=None)
    vocab = token_inputs(graph, None)
    outputs = [o.name for o in original.graph.output]
    extra = list(dict.fromkeys([p.value for p in probes] + [r for r, _ in routers]))
    reference = _session(_with_outputs(original, extra), original_dir)
    best: tuple[float, int, Feeds, dict] | None = None
    for seed in SEEDS:
        feeds = synthesize(signature, dims, step, vocab, seed=seed)
        results = _run(reference, feeds)
        margin = _routing_margin([results[r] for r, _ in routers], [k for _, k in routers])
        if best is None or margin > best[0]:
            best = (margin, seed, feeds, results)
        if margin >= TIE_MARGIN.get(graph.dtype(routers[0][0]) or "", TIE_MARGIN_16BIT) if routers else True:
            break
    assert best is not None
    margin, seed, feeds, ref = best
    del reference  # one model's weights in memory at a time
    fixed_session = _session(_with_outputs(fixed, [p.value for p in probes]), fixed_dir)
    got = _run(fixed_session, feeds)
    comparisons = compare_outputs({k: got[k] for k in outputs if k in got}, {k: ref[k] for k in outputs},
                                  written=written_positions(graph, step))
    checked = []
    first = None
    for probe in probes:
        if probe.value in got and probe.value in ref:
            probe.comparison = compare_one(probe.value, got[probe.value], ref[probe.value])
            if first is None and (probe.comparison.mismatched or not probe.comparison.compared):
                first = probe
        checked.append(probe)
    passed = all(c.mismatched == 0 for c in comparisons) and first is None
    result = VerifyResult(passed, comparisons, checked, first, seed, margin if routers else None,
                          {k: list(v.shape) for k, v in feeds.arrays.items()})
    for c in result.outputs:
        rel = _relative(got.get(c.output), ref.get(c.output))
        if rel is not None:
            result.max_rel_diff[c.output] = rel
    return result


def _relative(a: np.ndarray | None, r: np.ndarray | None) -> float | None:
    """max |a - r| over max |r|: the largest difference on the scale of the output."""
    if a is None or r is None or a.shape != r.shape or r.dtype.kind not in "fc" or r.size == 0:
        return None
    a64, r64 = a.astype(np.float64), r.astype(np.float64)
    finite = np.isfinite(a64) & np.isfinite(r64)
    scale = np.abs(r64[finite]).max() if finite.any() else 0.0
    return float(np.abs(a64 - r64)[finite].max() / scale) if scale > 0 else 0.0


def _routing_margin(logits: list[np.ndarray], ks: list[int]) -> float:
    """Smallest gap between the k-th and (k+1)-th logit of any token, relative to that router's logit scale."""
    margin = float("inf")
    for values, k in zip(logits, ks):
        flat = values.astype(np.float64).reshape(-1, values.shape[-1])
        if flat.shape[-1] <= k or flat.size == 0:
            continue
        ordered = -np.sort(-flat, axis=-1)
        gap = ordered[:, k - 1] - ordered[:, k]
        scale = max(float(np.abs(flat).max()), 1e-30)
        margin = min(margin, float(gap.min()) / scale)
    return margin


def _with_outputs(model: onnx.ModelProto, extra: list[str]) -> bytes:
    existing = {o.name for o in model.graph.output}
    if not [e for e in extra if e not in existing]:
        return model.SerializeToString()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for name in extra:
        if name not in existing:
            copy.graph.output.add().name = name
            existing.add(name)
    return copy.SerializeToString()


def _session(model_bytes: bytes, folder: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(folder))
    with captured_output():
        try:
            return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        except Exception as exc:
            raise InputError(f"ONNX Runtime cannot load the model for verification: {tidy(str(exc))}", folder) from None


def _run(session, feeds: Feeds) -> dict[str, np.ndarray]:
    names = [o.name for o in session.get_outputs()]
    inputs = {i.name for i in session.get_inputs()}
    with captured_output():
        try:
            values = session.run(names, {k: v for k, v in feeds.arrays.items() if k in inputs})
        except Exception as exc:
            raise VerificationError(f"ONNX Runtime failed to run the model: {tidy(str(exc))}") from None
    return dict(zip(names, values))


class VerificationError(Exception):
    """The fixed model does not run: as good as a mismatch (nothing is written)."""


# ---- per block: for graphs whose whole-model session ORT cannot build in reasonable time ---------------------------

# ORT's session creation grows faster than linearly with the node count of an unrolled expert loop (seen on 1.31.1
# CPU: 2,380 nodes 13 s, 4,684 nodes 50 s, 9,352 nodes 230 s). Above this many nodes the original is not run whole:
# each rewritten block is run on its own, its hidden state synthesised.
WHOLE_MODEL_MAX_NODES = 3000
PREFIX_MAX_NODES = 2000  # nodes allowed to compute a block's other inputs (shape arithmetic) from the graph inputs
HIDDEN_SCALE = 1.0  # a normalised hidden state: unit RMS


@dataclass
class BlockCheck:
    node: str  # the rewritten node
    hidden: str
    output: str
    logits: str
    k: int
    hidden_size: int


def verify_blocks(original: onnx.ModelProto, original_dir: Path, fixed: onnx.ModelProto, fixed_dir: Path,
                  graph: Graph, blocks: list[BlockCheck], settings: RunnerSettings = VERIFY_SETTINGS) -> VerifyResult:
    """Each block alone: the original nodes from its hidden state to its routed sum against the rewritten node(s)
    from the same hidden state, on the same synthesised inputs (hidden state, and the graph inputs the block's shape
    arithmetic reads)."""
    settings = accepted_settings(graph, settings)
    signature = graph_signature(graph)
    dims, step = resolve_dims(signature, settings, {}, window=sliding_window(graph, None), head=head_size(None, None),
                              policy_file=None)
    vocab = token_inputs(graph, None)
    result = VerifyResult(True, mode="per block")
    fixed_graph_producers = {o: n for n in fixed.graph.node for o in n.output}
    original_producers = {o: n for n in original.graph.node for o in n.output}
    for block in blocks:
        hidden_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(_hidden_dtype(graph, block.hidden)))
        ref_model = _block_model(original, original_producers, block, hidden_type)
        new_model = _block_model(fixed, fixed_graph_producers, block, hidden_type)
        probe = Probe(block.node, block.output)
        result.probes.append(probe)
        if ref_model is None or new_model is None:
            probe.note = "the block reads values it cannot be run without the rest of the model"
            result.passed = False
            result.first_divergent = result.first_divergent or probe
            continue
        reference, fused = _session(ref_model.SerializeToString(), original_dir), None
        best = None
        for seed in SEEDS:
            feeds = synthesize(signature, dims, step, vocab, seed=seed)
            feeds.arrays[block.hidden] = _hidden(graph, block, step, seed)
            ref = _run(reference, feeds)
            margin = _routing_margin([ref[block.logits]], [block.k])
            if best is None or margin > best[0]:
                best = (margin, seed, feeds, ref)
            if margin >= TIE_MARGIN.get(graph.dtype(block.logits) or "", TIE_MARGIN_16BIT):
                break
        assert best is not None
        margin, seed, feeds, ref = best
        del reference
        fused = _session(new_model.SerializeToString(), fixed_dir)
        got = _run(fused, feeds)
        # The block's output scale depends on its weights, not on the model's: compare on the reference's scale, so
        # the absolute tolerance means the same for a tiny test model and a real one.
        scale = float(np.abs(ref[block.output].astype(np.float64)).max()) or 1.0
        probe.comparison = compare_one(block.output, (got[block.output] / scale).astype(np.float32),
                                       (ref[block.output] / scale).astype(np.float32))
        result.outputs.append(probe.comparison)
        rel = _relative(got[block.output], ref[block.output])
        if rel is not None:
            result.max_rel_diff[block.output] = rel
        result.routing_margin = margin if result.routing_margin is None else min(result.routing_margin, margin)
        result.seed = max(result.seed, seed)
        result.feeds = {k: list(v.shape) for k, v in feeds.arrays.items()}
        if not probe.comparison.ok:
            result.passed = False
            result.first_divergent = result.first_divergent or probe
    return result


def _hidden(graph: Graph, block: BlockCheck, step, seed: int) -> np.ndarray:
    value = block.hidden
    rank = _rank(graph, value)
    lead = [step.batch_size, step.sequence_length] if rank == 3 else [step.batch_size * step.sequence_length]
    width = block.hidden_size
    dtype = _hidden_dtype(graph, value)
    rng = np.random.default_rng(1000 + seed)
    return (rng.standard_normal([*lead, width]) * HIDDEN_SCALE).astype(dtype)


def _rank(graph: Graph, value: str) -> int:
    """The hidden state's rank: declared, or the length of the shape a Reshape gave it; else [batch, seq, hidden]."""
    shape = graph.shape(value)
    if shape is not None:
        return len(shape)
    node = graph.producer(value)
    if node is not None and node.op_type == "Reshape":
        target = graph.constant_value(node.input(1))
        if target is not None:
            return len(target)
    return 3


def _hidden_dtype(graph: Graph, value: str):
    return {"float16": np.float16, "float64": np.float64}.get(graph.dtype(value) or "", np.float32)


def _block_model(model: onnx.ModelProto, producers: dict[str, onnx.NodeProto], block: BlockCheck,
                 hidden_type: int) -> onnx.ModelProto | None:
    """A model computing (routed sum, router logits) from the block's hidden state (a graph input), plus the
    nodes that compute the block's other inputs from the graph inputs (shape arithmetic), if few."""
    inits = {t.name: t for t in model.graph.initializer}
    graph_inputs = {i.name: i for i in model.graph.input}
    chosen: dict[int, onnx.NodeProto] = {}
    order = {id(n): i for i, n in enumerate(model.graph.node)}
    boundary: set[str] = set()

    def closure(targets: list[str], stop: set[str], limit: int) -> bool:
        stack = list(targets)
        count = 0
        while stack:
            value = stack.pop()
            if not value or value in stop or value in inits:
                continue
            node = producers.get(value)
            if node is None:
                if value in graph_inputs:
                    boundary.add(value)
                    continue
                return False
            key = order[id(node)]
            if key in chosen:
                continue
            chosen[key] = node
            count += 1
            if count > limit:
                return False
            stack.extend(node.input)
            for attr in node.attribute:
                if attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    return False  # control flow inside a block: not isolated here
        return True

    if not closure([block.output, block.logits], {block.hidden}, 200_000):
        return None
    if block.hidden in {o for n in chosen.values() for o in n.output}:
        return None
    # Graph inputs reached from the block (e.g. the token count read from input_ids' shape) stay inputs; the nodes
    # computing such values (not from the hidden state) must be few, or the block is not separable.
    nodes = [chosen[i] for i in sorted(chosen)]
    derived = {block.hidden}
    independent = 0
    for n in nodes:
        if any(i in derived for i in n.input):
            derived.update(o for o in n.output if o)
        else:
            independent += 1
    if independent > PREFIX_MAX_NODES:
        return None
    needed = {i for n in nodes for i in n.input if i}
    g = onnx.helper.make_graph(
        nodes, "block",
        [_input_info(model, block.hidden, hidden_type)] + [graph_inputs[b] for b in sorted(boundary)],
        [onnx.ValueInfoProto(name=block.output), onnx.ValueInfoProto(name=block.logits)],
        initializer=[inits[n] for n in sorted(needed) if n in inits])
    return onnx.helper.make_model(g, ir_version=model.ir_version, opset_imports=list(model.opset_import))


def _input_info(model: onnx.ModelProto, name: str, elem_type: int) -> onnx.ValueInfoProto:
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if vi.name == name and vi.type.tensor_type.elem_type:
            return vi
    return onnx.helper.make_tensor_value_info(name, elem_type, None)
