"""Proof that the rewritten model computes what the original does, on the artifact as delivered.

The verdict comes from the staged folder exactly as it will be written: its model.onnx and external data loaded from
disk by path into a fresh ORT CPU session with no added outputs and the session options the deployment's policy sets
(ORT's defaults without a policy), against the original loaded the same way. Graph outputs are what the user's
session computes; adding outputs would change ORT's memory plan, and a kernel whose result depends on it (ORT's CPU
MoE, knowledge/ort_moe.json cpu_inplace_defect) would be verified in a form nobody runs. Several steps are compared:
batch 1 and 2, one new token and a prompt of PROMPT_TOKENS, and, for a model with a KV cache, a decode step fed
each model's own present tensors from the prompt.

Top-k routing is discontinuous: two experts whose router logits tie may swap under a harmless change of rounding, and
the outputs then differ for a legitimate reason. So the inputs are chosen (among a few seeds) so that no token's k-th
and (k+1)-th logits are closer than TIE_MARGIN of their scale, and the margin reached is reported. The router logits
are read from a separate session of the original with those values added as outputs, never from the sessions compared.

Only after a mismatch, a diagnostic run exposes each rewritten node's output in both models (the MoE node's output
keeps the name of the sum it replaces) to name the first rewritten node whose output diverges.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from ortgate.errors import InputError
from ortgate.evidence import OutputComparison
from ortgate.graph.index import Graph
from ortgate.graph.patterns.decoder import token_ids_input
from ortgate.knowledge.dims import dim_role
from ortgate.knowledge.provider_names import CPU
from ortgate.runner.compare import compare_one, compare_outputs
from ortgate.runner.inputs import (
    Feeds,
    graph_dim_roles,
    graph_signature,
    head_size,
    resolve_dims,
    session_signature,
    sliding_window,
    synthesize,
    token_inputs,
    written_positions,
)
from ortgate.runner.session import captured_output, tidy
from ortgate.runner.settings import RunnerSettings

# A prompt of this many tokens: enough that every expert is likely routed to at least once.
PROMPT_TOKENS = 16
VERIFY_SETTINGS = RunnerSettings(batch_size=1, sequence_length=PROMPT_TOKENS, past_sequence_length=0)
SEEDS = (0, 1, 2, 3)
# Relative gap between the k-th and (k+1)-th router logit below which routing counts as tied: far above the
# rounding differences of a reordered float32 sum (~1e-7), and of float16/bfloat16 arithmetic (~1e-3).
TIE_MARGIN = {"float32": 1e-5, "float64": 1e-9}
TIE_MARGIN_16BIT = 1e-2


@dataclass(frozen=True)
class Step:
    """One step both models run: `batch` sequences of `tokens` new tokens; `decode`: then one more token per
    sequence, fed the prompt's present tensors as the past."""

    batch: int
    tokens: int
    decode: bool = False

    @property
    def label(self) -> str:
        what = f"batch {self.batch}, {self.tokens} new token{'s' if self.tokens > 1 else ''}"
        return f"{what}, then a decode step on its KV cache" if self.decode else what


STEPS = (Step(1, 1), Step(1, PROMPT_TOKENS), Step(2, 1), Step(2, PROMPT_TOKENS))


@dataclass
class Probe:
    """One rewritten node whose output both models expose (diagnostic run only)."""

    node: str
    value: str
    comparison: OutputComparison | None = None
    note: str | None = None


@dataclass
class StepResult:
    label: str
    feeds: dict[str, list[int]]
    seed: int
    routing_margin: float | None
    passed: bool
    max_rel: float
    outputs: list[OutputComparison] = field(default_factory=list)
    index: int = 0  # which chosen step (its prompt's inputs serve the diagnostic run)


@dataclass
class VerifyResult:
    passed: bool
    outputs: list[OutputComparison] = field(default_factory=list)
    probes: list[Probe] = field(default_factory=list)
    first_divergent: Probe | None = None
    seed: int = 0
    routing_margin: float | None = None  # smallest relative top-k gap over every router, token and step
    feeds: dict[str, list[int]] = field(default_factory=dict)  # input -> shape (of the step `outputs` come from)
    max_rel_diff: dict[str, float] = field(default_factory=dict)  # output -> max |diff| / max |reference|
    mode: str = "whole model"  # or "per block" (the original is too large for ORT to build a session of it)
    notes: list[str] = field(default_factory=list)
    steps: list[StepResult] = field(default_factory=list)
    session: str = ""  # the session options both models ran with
    not_checked: list[str] = field(default_factory=list)  # what this verdict does not cover

    @property
    def max_abs(self) -> float:
        return max((c.max_abs_diff or 0.0 for c in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max(self.max_rel_diff.values(), default=0.0)


@dataclass(frozen=True)
class ModelSource:
    """A model as ORT loads it: a file on disk (`path`), or serialized bytes whose external data lie in `folder`."""

    path: Path | None = None
    data: bytes | None = None
    folder: Path | None = None

    def where(self) -> Path:
        return self.path if self.path is not None else (self.folder or Path("."))


@dataclass(frozen=True)
class SessionPlan:
    """The session options both models run with: the policy's (on CPU), or ORT's defaults."""

    options: Any = None  # a callable returning a fresh onnxruntime.SessionOptions
    label: str = "ORT's default session options"


def _literal_token_dims(graph: Graph) -> tuple[int | None, int | None] | None:
    """(batch, sequence length) of a rank-2 token input where they are literals (None where a dim is dynamic); None
    without such an input. An export fixed to its example's shape refuses, or breaks inside, any other."""
    info = token_ids_input(graph)
    if info is None or info.shape is None:
        return None
    batch, seq = info.shape
    return (batch if isinstance(batch, int) and batch > 0 else None,
            seq if isinstance(seq, int) and seq > 0 else None)


def pinned_steps(graph: Graph, steps: tuple[Step, ...], dims: dict[str, int]) -> tuple[Step, ...]:
    """The steps with the batch and new-token count the user pinned (runner.dims on a dim of that role)."""
    roles = graph_dim_roles(graph)
    pins = {(roles.get(d) or dim_role(d)): v for d, v in dims.items()}
    if "batch" not in pins and "query" not in pins:
        return steps
    return tuple(dict.fromkeys(replace(s, batch=pins.get("batch", s.batch), tokens=pins.get("query", s.tokens))
                               for s in steps))


def accepted_settings(graph: Graph, settings: RunnerSettings) -> RunnerSettings:
    """`settings` with the batch and sequence length of a token input whose dims are literals; unchanged for
    dynamic dims."""
    literal = _literal_token_dims(graph)
    if literal is None:
        return settings
    batch, seq = literal
    return replace(settings, batch_size=batch or settings.batch_size, sequence_length=seq or settings.sequence_length)


def accepted_steps(graph: Graph, steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """The steps at the shapes the graph accepts: a literal batch or sequence length replaces the step's."""
    literal = _literal_token_dims(graph)
    if literal is None:
        return steps
    batch, seq = literal
    return tuple(dict.fromkeys(replace(s, batch=batch or s.batch, tokens=seq or s.tokens) for s in steps))


def verify(original: ModelSource, fixed: ModelSource, graph: Graph, probes: list[Probe],
           routers: list[tuple[str, int]], *, original_model: onnx.ModelProto, fixed_model: onnx.ModelProto,
           plan: SessionPlan | None = None, steps: tuple[Step, ...] = STEPS,
           dims: dict[str, int] | None = None) -> VerifyResult:
    """Run both models as delivered on ORT CPU at every step and compare their graph outputs. `probes`: rewritten
    nodes' outputs present in both graphs (the diagnostic run after a mismatch); `routers`: (router logits value, k)
    of each rewritten MoE block, for the tie check. `original_model` / `fixed_model`: the graphs, for the runs with
    added outputs (routing margin, diagnosis)."""
    plan = plan or SessionPlan()
    cache = kv_cache_pairs(graph)
    pinned_dims = dict(dims or {})
    wanted = [Step(s.batch, s.tokens, decode=bool(cache) and s.tokens > 1)
              for s in pinned_steps(graph, accepted_steps(graph, steps), pinned_dims)]
    signature, vocab = graph_signature(graph), token_inputs(graph, None)
    window, head = sliding_window(graph, None), head_size(None, None)
    roles = graph_dim_roles(graph)

    def feeds_for(step: Step, seed: int, *, past: int = 0) -> Feeds:
        settings = RunnerSettings(batch_size=step.batch, sequence_length=1 if past else step.tokens,
                                  past_sequence_length=past, dims=pinned_dims)
        values, shape = resolve_dims(signature, settings, {}, window=window, head=head, policy_file=None,
                                     roles=roles)
        return synthesize(signature, values, shape, vocab, seed=seed)

    # Inputs: the seed whose routing is farthest from a tie, read from the original with the router logits exposed.
    chosen: list[tuple[Step, int, float | None, Feeds]] = []
    probe_session = (_session(ModelSource(data=_with_outputs(original_model, [r for r, _ in routers]),
                                          folder=original.path.parent if original.path else original.folder), plan)
                     if routers else None)
    threshold = TIE_MARGIN.get(graph.dtype(routers[0][0]) or "", TIE_MARGIN_16BIT) if routers else 0.0
    pinned = _pinned_shapes(probe_session) if probe_session is not None else {}
    for step in wanted:
        best: tuple[float, int, Feeds] | None = None
        if not _fits(pinned, feeds_for(step, SEEDS[0])):
            chosen.append((step, SEEDS[0], None, feeds_for(step, SEEDS[0])))  # the compared sessions skip it too
            continue
        for seed in SEEDS:
            feeds = feeds_for(step, seed)
            if probe_session is None:
                best = (float("inf"), seed, feeds)
                break
            results = _run(probe_session, feeds)
            margin = _routing_margin([results[r] for r, _ in routers], [k for _, k in routers])
            if step.decode and _fits(pinned, decode := _decode_feeds(feeds_for(step, seed, past=step.tokens),
                                                                      results, cache)):
                more = _run(probe_session, decode)
                margin = min(margin, _routing_margin([more[r] for r, _ in routers], [k for _, k in routers]))
            if best is None or margin > best[0]:
                best = (margin, seed, feeds)
            if margin >= threshold:
                break
        assert best is not None
        chosen.append((step, best[1], best[0] if routers else None, best[2]))
    del probe_session

    def run_all(source: ModelSource) -> tuple[list[dict[str, np.ndarray] | None], list[dict[str, np.ndarray] | None]]:
        session = _session(source, plan)
        fits = _pinned_shapes(session)
        prompts: list[dict[str, np.ndarray] | None] = []
        decodes: list[dict[str, np.ndarray] | None] = []
        for step, seed, _, feeds in chosen:
            if not _fits(fits, feeds):
                prompts.append(None)
                decodes.append(None)
                continue
            out = _run(session, feeds)
            prompts.append(out)
            decode = _decode_feeds(feeds_for(step, seed, past=step.tokens), out, cache) if step.decode else None
            decodes.append(_run(session, decode) if decode is not None and _fits(fits, decode) else None)
        return prompts, decodes

    ref_prompts, ref_decodes = run_all(original)
    got_prompts, got_decodes = run_all(fixed)
    outputs = [o.name for o in original_model.graph.output]
    result = VerifyResult(True, session=plan.label)
    worst: tuple[float, StepResult, dict, dict] | None = None
    for index, (step, seed, step_margin, feeds) in enumerate(chosen):
        runs: list[tuple[Step, Feeds | None, dict[str, np.ndarray] | None, dict[str, np.ndarray] | None, int]] = [
            (Step(step.batch, step.tokens), feeds, ref_prompts[index], got_prompts[index], 0)]
        if step.decode:
            runs.append((step, None, ref_decodes[index], got_decodes[index], step.tokens))
        for shown, step_feeds, ref, got, past in runs:
            label = shown.label if not past else f"batch {step.batch}, 1 new token after a {past}-token prompt's KV cache"
            if ref is None or got is None:
                result.not_checked.append(f"{label}: the session's pinned input shapes do not take it")
                continue
            written = written_positions(graph, feeds_for(step, seed, past=past).step)
            comparisons = compare_outputs({k: got[k] for k in outputs if k in got}, {k: ref[k] for k in outputs},
                                          written=written)
            rel = {c.output: r for c in comparisons
                   if (r := _relative(got.get(c.output), ref.get(c.output))) is not None}
            shapes = {k: list(v.shape) for k, v in (step_feeds or feeds_for(step, seed, past=past)).arrays.items()}
            ok = all(c.mismatched == 0 for c in comparisons)
            checked = StepResult(label, shapes, seed, step_margin, ok, max(rel.values(), default=0.0), comparisons, index)
            result.steps.append(checked)
            result.passed = result.passed and ok
            key = (0 if not ok else 1, -checked.max_rel)
            if worst is None or key < (0 if not worst[1].passed else 1, -worst[1].max_rel):
                worst = (checked.max_rel, checked, rel, shapes)
    if worst is None:
        raise InputError("no verification step fits the session's pinned input shapes", original.where())
    _, shown_step, rel, shapes = worst
    result.outputs, result.max_rel_diff, result.feeds, result.seed = shown_step.outputs, rel, shapes, shown_step.seed
    margins = [s.routing_margin for s in result.steps if s.routing_margin is not None]
    result.routing_margin = min(margins) if margins else None
    if not result.passed:
        failing = next(s for s in result.steps if not s.passed)
        _diagnose(result, original, fixed, original_model, fixed_model, probes, chosen[failing.index][3], plan)
    return result


def _diagnose(result: VerifyResult, original: ModelSource, fixed: ModelSource, original_model: onnx.ModelProto,
              fixed_model: onnx.ModelProto, probes: list[Probe], feeds: Feeds, plan: SessionPlan) -> None:
    """After a mismatch: both models again with each rewritten node's output exposed, to name the first that
    diverges. A model whose exposed values all agree while its plain outputs differ computes differently under
    another memory plan: an ORT kernel whose result depends on buffer reuse."""
    if not probes:
        return
    values = [p.value for p in probes]
    ref = _run(_session(ModelSource(data=_with_outputs(original_model, values), folder=_folder(original)), plan), feeds)
    got = _run(_session(ModelSource(data=_with_outputs(fixed_model, values), folder=_folder(fixed)), plan), feeds)
    for probe in probes:
        if probe.value in got and probe.value in ref:
            probe.comparison = compare_one(probe.value, got[probe.value], ref[probe.value])
            if result.first_divergent is None and (probe.comparison.mismatched or not probe.comparison.compared):
                result.first_divergent = probe
        result.probes.append(probe)
    outputs = [o.name for o in original_model.graph.output]
    exposed = compare_outputs({k: got[k] for k in outputs if k in got}, {k: ref[k] for k in outputs})
    if result.first_divergent is None and all(c.mismatched == 0 for c in exposed):
        result.notes.append("with the rewritten nodes' outputs exposed as graph outputs both models agree, but the "
                            "model as delivered does not: ORT computes it differently under the memory plan of the "
                            "plain session (see `ortgate explain moe-cpu-kernel-miscomputes`)")


def _folder(source: ModelSource) -> Path | None:
    return source.path.parent if source.path is not None else source.folder


def kv_cache_pairs(graph: Graph) -> dict[str, str]:
    """Past-state inputs -> the present output that feeds them on the next step (past_key_values.N.key ->
    present.N.key, past.N.conv -> present.N.conv), when every past input has one."""
    outputs = {o.name for o in graph.outputs}
    pairs: dict[str, str] = {}
    pasts = [i.name for i in graph.inputs if i.name.lower().startswith("past")]
    for name in pasts:
        for candidate in (name.replace("past_key_values", "present", 1), name.replace("past", "present", 1),
                          name.replace("past_key_values", "cache", 1)):  # transformers' exporter: cache.layers.N
            if candidate in outputs:
                pairs[name] = candidate
                break
    if pasts and len(pairs) != len(pasts):
        presents = [o.name for o in graph.outputs if o.name.lower().startswith("present")]
        if len(presents) == len(pasts):
            return dict(zip(pasts, presents))
        return {}
    return pairs


def _decode_feeds(feeds: Feeds, prompt: dict[str, np.ndarray], cache: dict[str, str]) -> Feeds:
    arrays = dict(feeds.arrays)
    for past, present in cache.items():
        if present in prompt:
            arrays[past] = prompt[present]
    return Feeds(arrays, feeds.elem_types, feeds.kinds, feeds.dims, feeds.step)


def _pinned_shapes(session) -> dict[str, tuple]:
    return {spec.name: spec.shape for spec in session_signature(session) if spec.shape is not None}


def _fits(pinned: dict[str, tuple], feeds: Feeds) -> bool:
    for name, shape in pinned.items():
        array = feeds.arrays.get(name)
        if array is None:
            continue
        if len(shape) != array.ndim or any(isinstance(w, int) and w != h for w, h in zip(shape, array.shape)):
            return False
    return True


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


def session_plan(setup=None) -> SessionPlan:
    """The session options of the policy's SessionSetup on CPU (its provider options belong to its provider), or
    ORT's defaults."""
    if setup is None:
        import onnxruntime as ort

        return SessionPlan(ort.SessionOptions, "ORT's default session options (ORT_ENABLE_ALL)")

    def options():
        return setup.ort_session_options(provider=CPU)[0]

    return SessionPlan(options, f"the policy's session options on CPU ({setup.effective_optimization_level})")


def _session(source: ModelSource, plan: SessionPlan | None = None):
    import onnxruntime as ort

    options = plan.options() if plan is not None and plan.options is not None else ort.SessionOptions()
    with captured_output():
        try:
            if source.path is not None:
                return ort.InferenceSession(str(source.path), options, providers=[CPU])
            options.add_session_config_entry("session.model_external_initializers_file_folder_path",
                                             str(source.folder or "."))
            return ort.InferenceSession(source.data, options, providers=[CPU])
        except Exception as exc:
            raise InputError(f"ONNX Runtime cannot load the model for verification: {tidy(str(exc))}",
                             source.where()) from None


def _block_session(model_bytes: bytes, folder: Path):
    """A block of a model, run alone: no optimizations, so that the block computes its nodes as written."""
    import onnxruntime as ort

    def options():
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        return so

    return _session(ModelSource(data=model_bytes, folder=folder), SessionPlan(options, "ORT_DISABLE_ALL"))


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

# Whether ORT builds a whole-model session of the original in reasonable time is measured, never guessed from the
# node count: session creation of an unrolled expert loop grew faster than linearly on 1.31.1 CPU (2,380 nodes 13 s,
# 9,352 nodes 230 s), while 1.32.0 built a 4,942-node Qwen3-Next export in 0.64 s. The original's session is built
# once in a child process stopped at this limit; only when it does not finish is each rewritten block run on its
# own, its hidden state synthesised.
SESSION_BUILD_LIMIT_S = 60.0


@dataclass(frozen=True)
class SessionBuild:
    """A bounded build of the original's session: how long it took, or that it did not finish within the limit."""

    seconds: float | None  # None: stopped at the limit, or failed
    limit_s: float
    failed: str | None = None  # ORT's refusal (the whole-model verification then reports it as such)

    @property
    def too_slow(self) -> bool:
        return self.seconds is None and self.failed is None


_BUILD_SCRIPT = f"""
import sys, time
import onnxruntime as ort
options = ort.SessionOptions()
if sys.argv[2]:
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, sys.argv[2])
options.log_severity_level = 4
start = time.perf_counter()
ort.InferenceSession(sys.argv[1], options, providers=[{CPU!r}])
print(time.perf_counter() - start)
"""


def measure_session_build(model: Path, plan: SessionPlan | None = None,
                          limit_s: float | None = None) -> SessionBuild:
    """Build the session of `model` (a file) on ORT CPU in a child process with the plan's optimization level, and
    stop it at `limit_s` (SESSION_BUILD_LIMIT_S): the measurement that decides whether the original is verified
    whole. The child is killed on the limit, and on any interrupt of this process."""
    import subprocess
    import sys

    limit = SESSION_BUILD_LIMIT_S if limit_s is None else limit_s
    level = ""
    if plan is not None and plan.options is not None:
        level = str(getattr(plan.options().graph_optimization_level, "name", "") or "")
    try:
        done = subprocess.run([sys.executable, "-c", _BUILD_SCRIPT, str(model), level], capture_output=True,
                              text=True, timeout=limit, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return SessionBuild(None, limit)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return SessionBuild(None, limit, failed=tidy(lines[-1]) if lines else f"exit {done.returncode}")
    try:
        return SessionBuild(float(done.stdout.strip().splitlines()[-1]), limit)
    except (ValueError, IndexError):
        return SessionBuild(None, limit, failed="the build printed no time")


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
                  graph: Graph, blocks: list[BlockCheck], settings: RunnerSettings = VERIFY_SETTINGS,
                  dims: dict[str, int] | None = None) -> VerifyResult:
    """Each block alone: the original nodes from its hidden state to its routed sum against the rewritten node(s)
    from the same hidden state, on the same synthesised inputs (hidden state, and the graph inputs the block's shape
    arithmetic reads)."""
    settings = replace(accepted_settings(graph, settings), dims=dict(dims or {}))
    signature = graph_signature(graph)
    dims, step = resolve_dims(signature, settings, {}, window=sliding_window(graph, None), head=head_size(None, None),
                              policy_file=None, roles=graph_dim_roles(graph))
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
        reference, fused = _block_session(ref_model.SerializeToString(), original_dir), None
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
        fused = _block_session(new_model.SerializeToString(), fixed_dir)
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
    lead = [step.batch, step.new_tokens] if rank == 3 else [step.batch * step.new_tokens]
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
