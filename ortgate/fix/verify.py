"""Proof that the rewritten model computes what the original does: both run on ORT's CPU provider with the runner's
synthesised inputs, every output compared with the runner's per-dtype tolerance.

Top-k routing is discontinuous: two experts whose router logits tie may swap under a harmless change of rounding, and
the outputs then differ for a legitimate reason. So the inputs are chosen (among a few seeds) so that no token's k-th
and (k+1)-th logits are closer than TIE_MARGIN of their scale, and the margin reached is reported. Each rewritten
node's output is compared too (the MoE node's output keeps the name of the sum it replaces), so a mismatch names the
first rewritten node whose output diverges.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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

    @property
    def max_abs(self) -> float:
        return max((c.max_abs_diff or 0.0 for c in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max(self.max_rel_diff.values(), default=0.0)


def verify(original: onnx.ModelProto, original_dir: Path, fixed: onnx.ModelProto, fixed_dir: Path, graph: Graph,
           probes: list[Probe], routers: list[tuple[str, int]], settings: RunnerSettings = VERIFY_SETTINGS
           ) -> VerifyResult:
    """Run both models on ORT CPU and compare. `probes`: rewritten nodes' outputs present in both graphs; `routers`:
    (router logits value, k) of each rewritten MoE block, for the tie check."""
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
