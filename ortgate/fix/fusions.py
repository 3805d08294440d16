"""Norm, rotary and attention fusions through onnxscript's rewriter (`onnxscript.rewriter.ort_fusions`).

ortgate does not write these matchers again: it runs onnxscript's rules (the `ortgate[fix]` extra) on the graph the
MoE rewrite left, then reads the result with its own patterns to say, per decoder layer, what was fused and what is
still decomposed, and why where it can tell. Weights stay where they are: onnxscript sees external tensors it never
needs to load (constant folding is limited to small tensors).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortgate.errors import InputError
from ortgate.graph import build_graph
from ortgate.graph.index import Graph
from ortgate.graph.patterns.attention import attention_cores
from ortgate.graph.patterns.norms import decomposed_rmsnorms
from ortgate.graph.patterns.rotary import decomposed_rotaries
from ortgate.rules.base import FixKind

# Fusion kinds ortgate asks onnxscript for, by the rule whose finding each repairs, in the order onnxscript needs them
# (SkipRMSNorm builds on RMSNorm; the attention rules on SDPA).
# A function named "ortgate.<module>.<name>" is one of ortgate's own rules (ortgate.fix.norms,
# ortgate.fix.attention), written with onnxscript's rewriter API for the forms onnxscript's rules do not read.
FUSION_STEPS: tuple[tuple[str, str, str], ...] = (
    (FixKind.rmsnorm, "layer_norm_no_bias", "ortgate.norms.fuse_layer_norms"),
    (FixKind.rmsnorm, "rms_normalization", "fuse_rms_normalization"),
    (FixKind.rmsnorm, "rms_norm_forms", "ortgate.norms.fuse_rms_forms"),
    (FixKind.rmsnorm, "skip_rms_normalization", "ortgate.norms.fuse_skip_rms"),
    # before onnxscript's rotary rules: ortgate's GroupQueryAttention rule reads the rotation as the graph has it
    (FixKind.attention, "gqa_with_cache", "ortgate.attention.fuse_gqa_with_cache"),
    (FixKind.rotary, "rotary_embedding", "fuse_rotary_embedding"),
    (FixKind.rotary, "cos_sin_cache", "fuse_cos_sin_cache"),
    (FixKind.rotary, "partial_rotary_embedding", "fuse_partial_rotary_embedding"),
    (FixKind.attention, "sdpa", "fuse_sdpa"),
    (FixKind.attention, "gqa", "fuse_gqa"),
    (FixKind.attention, "packed_qkv_for_gqa", "fuse_qkv_gqa"),
    (FixKind.attention, "mha1", "fuse_mha1"),
    (FixKind.attention, "mha2", "fuse_mha2"),
    (FixKind.attention, "mha_scale", "fuse_mha_scale"),
    (FixKind.attention, "mha_bias", "fuse_mha_bias"),
    (FixKind.attention, "attention", "fuse_attention"),
    (FixKind.attention, "sdpa_via_mha", "replace_sdpa_by_mha"),
)
FUSED_OPS = {
    FixKind.rmsnorm: {("ai.onnx", "SimplifiedLayerNormalization"), ("com.microsoft", "SkipSimplifiedLayerNormalization"),
                ("ai.onnx", "RMSNormalization"), ("ai.onnx", "LayerNormalization")},
    FixKind.rotary: {("com.microsoft", "RotaryEmbedding"), ("ai.onnx", "RotaryEmbedding")},
    FixKind.attention: {("com.microsoft", "MultiHeadAttention"), ("com.microsoft", "GroupQueryAttention"),
                  ("com.microsoft", "Attention"), ("ai.onnx", "Attention")},
}


@dataclass
class LayerFusions:
    layer: int | None
    applied: dict[str, int] = field(default_factory=dict)  # kind -> fused nodes in this layer after the pass
    became: dict[str, int] = field(default_factory=dict)  # fused op type -> nodes of it the pass added in this layer
    missed: dict[str, tuple[int, str]] = field(default_factory=dict)  # kind -> (still decomposed, why)


@dataclass
class FusionReport:
    kinds: tuple[str, ...]
    counts: dict[str, int] = field(default_factory=dict)  # onnxscript's count per fusion rule
    layers: list[LayerFusions] = field(default_factory=list)
    available: bool = True
    note: str | None = None
    attention_near_miss: str | None = None  # why ortgate's GroupQueryAttention rule stopped where it came closest
    attention_plain: list[str] = field(default_factory=list)  # the attention's form GQA does not express, in words
    attention_notes: list[str] = field(default_factory=list)  # why ortgate's GQA rule matched but wrote no node
    options: dict = field(default_factory=dict)  # for ortgate's own steps: context_length in; notes out

    def total(self, kind: str) -> int:
        return sum(layer.applied.get(kind, 0) for layer in self.layers)


def onnxscript_available() -> bool:
    try:
        import onnxscript.rewriter.ort_fusions  # noqa: F401
    except ImportError:
        return False
    return True


def run_fusions(model: onnx.ModelProto, kinds: tuple[str, ...], weights_dir: Path, *,
                model_path: Path | None = None, context_length: int | None = None) -> tuple[onnx.ModelProto, FusionReport]:
    """Apply onnxscript's fusions of `kinds` (rmsnorm, rotary, attention) to `model`; the new model and the report.
    A model onnx_ir cannot take (a recursive local function, a tensor it cannot read) is an InputError naming
    `model_path` and onnx_ir's reason."""
    try:
        return _run_fusions(model, kinds, weights_dir, context_length)
    except InputError:
        raise
    except Exception as exc:
        if not _from_onnx_ir(exc):
            raise
        raise InputError(f"onnxscript's fusions cannot take this model: {_root_cause(exc)} (--select "
                         "moe-not-fused skips them)", model_path) from None


def _from_onnx_ir(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is onnx_ir's or onnxscript's error about the model it was given."""
    seen: BaseException | None = exc
    while seen is not None:
        module = type(seen).__module__ or ""
        if module.startswith(("onnx_ir", "onnxscript")):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _root_cause(exc: BaseException) -> str:
    while (exc.__cause__ or exc.__context__) is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return f"{type(exc).__name__}: {exc}"


def _run_fusions(model: onnx.ModelProto, kinds: tuple[str, ...], weights_dir: Path,
                 context_length: int | None = None) -> tuple[onnx.ModelProto, FusionReport]:
    report = FusionReport(kinds)
    report.options["context_length"] = context_length
    if not kinds:
        return model, report
    before = _inventory(build_graph(model, "before"))
    if not any(counts.get(kind, (0, 0))[0] for counts in before.values() for kind in kinds):
        # Nothing decomposed of these kinds: onnxscript's matchers would walk the whole graph (minutes on an LLM's
        # 10^4-10^5 nodes) to change nothing.
        report.note = "nothing to fuse: no decomposed norm, rotary or attention of the selected kinds"
        return model, report
    if not onnxscript_available():
        raise InputError("norm, rotary and attention fusions need onnxscript: pip install 'ortgate[fix]' "
                         "(or pass --select moe-not-fused)")
    before_ops = _fused_ops(build_graph(model, "before"))
    with _quiet():  # onnxscript's and onnx_ir's warnings and logs: never on ortgate's stderr
        out, ir_model = _fuse(model, kinds, weights_dir, report)
    after_graph = build_graph(out, "after")
    after = _inventory(after_graph)
    misses: dict[int | None, list[str]] = defaultdict(list)
    if "rmsnorm" in kinds:
        left = {norm.last.name: norm.layer for norm in decomposed_rmsnorms(after_graph) if norm.last.name}
        if left:
            from ortgate.fix.norms import near_misses

            with _quiet():
                found = near_misses(ir_model, set(left))
            for name, miss in found.items():
                misses[left[name]].append(miss.say())
    if "attention" in kinds and any(k.get("attention", (0, 0))[0] for k in after.values()):
        from ortgate.fix.attention import near_miss, plain_reasons

        with _quiet():
            why = near_miss(ir_model)
            plain = plain_reasons(ir_model)
        if why:
            report.attention_near_miss = why
        report.attention_plain = plain
    report.attention_notes = list(report.options.get("attention_notes", []))
    report.layers = _per_layer(before, after, kinds, has_kv_cache=_has_kv_cache(out), counts=report.counts,
                               near=misses, attention_why=report.attention_near_miss,
                               attention_plain=report.attention_plain,
                               rotary_why="; ".join(report.options.get("notes", [])) or None)
    after_ops = _fused_ops(after_graph)
    for entry in report.layers:
        grown = after_ops.get(entry.layer, Counter()) - before_ops.get(entry.layer, Counter())
        entry.became = dict(sorted(grown.items()))
    return out, report


def _fused_ops(graph: Graph) -> dict[int | None, Counter]:
    """layer -> fused op type -> nodes."""
    fused = {op for ops in FUSED_OPS.values() for op in ops}
    out: dict[int | None, Counter] = defaultdict(Counter)
    for node in graph.nodes:
        if (node.domain, node.op_type) in fused:
            out[node.layer][node.op_type] += 1
    return out


@contextlib.contextmanager
def _quiet():
    """stdout, stderr and Python warnings go to a sink while onnxscript works (logging's last-resort handler writes
    to whatever sys.stderr is then)."""
    sink = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        warnings.simplefilter("ignore")
        yield


def _fuse(model: onnx.ModelProto, kinds: tuple[str, ...], weights_dir: Path, report: FusionReport):
    """The fused model, and the onnx_ir model it was serialised from (asked afterwards why a norm was left)."""
    import onnx_ir as ir

    ir_model = ir.serde.deserialize_model(model)
    for value in ir_model.graph.initializers.values():
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor):
            # Weights the optimizer may read (small shape constants) are found beside the input model.
            value.const_value = ir.ExternalTensor(tensor.location, tensor.offset, tensor.length, tensor.dtype,
                                                  shape=tensor.shape, name=tensor.name, base_dir=weights_dir)
    try:
        _apply(ir_model, kinds, report)
    except Exception as exc:
        missing = _file_error(exc)
        if missing is None:
            raise
        raise InputError(f"onnxscript could not read the model's external weights: {missing}", weights_dir) from None
    return ir.serde.serialize_model(ir_model), ir_model


def _file_error(exc: BaseException) -> str | None:
    """The missing or unreadable weight file behind an onnxscript / onnx_ir pass error, if that is its cause."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError):
            return f"{current.strerror or current}: {current.filename}" if current.filename else str(current)
        if isinstance(current, ValueError) and "mmap" in str(current).lower():
            return str(current)
        current = current.__cause__ or current.__context__
    return None


def _apply(ir_model, kinds: tuple[str, ...], report: FusionReport) -> None:
    import onnx_ir.passes.common as common_passes
    from onnxscript.optimizer import optimize
    from onnxscript.rewriter.ort_fusions import _core, shape_optimization

    with _bounded_multi_output_matching():
        _steps(ir_model, kinds, report, common_passes, optimize, _core, shape_optimization)


def _steps(ir_model, kinds, report, common_passes, optimize, _core, shape_optimization) -> None:
    common_passes.ShapeInferencePass()(ir_model)
    optimize(ir_model)
    shape_optimization.rules.apply_to_model(ir_model)
    optimize(ir_model)
    for kind, label, function in FUSION_STEPS:
        if kind not in kinds:
            continue
        if function.startswith("ortgate."):
            from ortgate.fix import attention, norms

            module, name = function.removeprefix("ortgate.").split(".")
            step = getattr({"norms": norms, "attention": attention}[module], name)
            report.counts[label] = int(step(ir_model, report.options) if module == "attention" else step(ir_model))
            continue
        fuse = getattr(_core, function)
        options = {"apply_shape_inference": True} if label == "sdpa" else {}
        report.counts[label] = int(fuse(ir_model, **options) or 0)
    optimize(ir_model)


@contextlib.contextmanager
def _bounded_multi_output_matching():
    """While onnxscript works, its rules whose pattern ends in several nodes (SlicesSplit: two Slices of one x) look
    for the other end nodes among the consumers of the first one's inputs instead of among every node of the graph.

    onnxscript's SimplePatternMatcher pairs each candidate with every graph node of the other end nodes' op types,
    rebuilding that list from a full walk of the graph per candidate: O(nodes x Slices) per pass, which is what makes
    `optimize()` take minutes on a decoder of 10^4 nodes (2 layers of a 128-expert loop under cProfile: 80 s of 85
    in that one rule). Where each other end node shares an input variable with the first (checked on the pattern),
    any node that can match consumes the value the first one reads in that variable's place, so its consumers are a
    superset of the matches, tried in the order they were added as consumers (the graph's order on a loaded model,
    which is onnxscript's order): the same rewrites. Rules of any other shape keep onnxscript's matcher."""
    rules = [rule for rule in _multi_output_rules() if _ends_share_an_input(rule._target_pattern)]
    saved = [rule._matcher for rule in rules]
    try:
        for rule in rules:
            rule._matcher = _neighbour_matcher(rule._target_pattern)
        yield
    finally:
        for rule, matcher in zip(rules, saved):
            rule._matcher = matcher


def _multi_output_rules() -> list:
    from onnxscript import rewriter
    from onnxscript.rewriter import _matcher

    return [rule for rule in rewriter._DEFAULT_REWRITE_RULES
            if len(rule._target_pattern.output_nodes) > 1 and type(rule._matcher) is _matcher.SimplePatternMatcher]


def _ends_share_an_input(pattern) -> bool:
    first, *others = pattern.output_nodes
    first_inputs = {id(value) for value in first.inputs if value is not None}
    return all(any(value is not None and id(value) in first_inputs for value in node.inputs) for node in others)


def _neighbour_matcher(pattern):
    import itertools

    import onnx_ir as ir
    from onnxscript.rewriter import _basics, _matcher

    first, *others = pattern.output_nodes
    # per other end node: the input positions of the first end node whose variable it reads too
    shared = [[j for j, value in enumerate(first.inputs) if value is not None and any(value is v for v in node.inputs)]
              for node in others]

    class NeighbourMatcher(_matcher.SimplePatternMatcher):
        def match(self, model, graph_or_function, node, *, verbose=0, remove_nodes=True, tracer=None):
            self._tracer = tracer
            self._graph = graph_or_function if isinstance(graph_or_function, ir.Graph) else graph_or_function.graph

            def candidates(pattern_node, positions):
                wanted = pattern_node.op_identifier()
                found: dict[int, ir.Node] = {}
                for j in positions:
                    value = node.inputs[j] if j < len(node.inputs) else None
                    for consumer in value.consumers() if value is not None else ():
                        if consumer.graph is self._graph and (wanted is None or consumer.op_identifier() == wanted):
                            found.setdefault(id(consumer), consumer)
                return list(found.values())

            match = None
            ends = [candidates(pn, positions) for pn, positions in zip(others, shared)]
            for combination in itertools.product([node], *ends):
                self._init_match(verbose)
                match = self._multi_match(combination, check_removable=remove_nodes)
                if match:
                    return match
            return match if match is not None else _basics.MatchResult().fail("No match found.")

    return NeighbourMatcher(pattern)


def _inventory(graph: Graph) -> dict[int | None, dict[str, tuple[int, int]]]:
    """layer -> kind -> (decomposed, fused) counts."""
    out: dict[int | None, dict[str, list[int]]] = defaultdict(lambda: defaultdict(lambda: [0, 0]))
    for norm in decomposed_rmsnorms(graph):
        out[norm.layer]["rmsnorm"][0] += 1
    for rotary in decomposed_rotaries(graph):
        out[rotary.layer]["rotary"][0] += 1
    for core in attention_cores(graph):
        out[core.layer]["attention"][0] += 1
    for node in graph.nodes:
        for kind, ops in FUSED_OPS.items():
            if (node.domain, node.op_type) in ops:
                out[node.layer][kind][1] += 1
    return {layer: {k: (v[0], v[1]) for k, v in kinds.items()} for layer, kinds in out.items()}


def _has_kv_cache(model: onnx.ModelProto) -> bool:
    return any("past" in i.name.lower() for i in model.graph.input)


def _per_layer(before, after, kinds: tuple[str, ...], *, has_kv_cache: bool, counts: dict[str, int],
               near: dict[int | None, list[str]] | None = None, attention_why: str | None = None,
               rotary_why: str | None = None, attention_plain: list[str] | None = None) -> list[LayerFusions]:
    layers = sorted(set(before) | set(after), key=lambda x: (x is None, x or 0))
    out = []
    for layer in layers:
        entry = LayerFusions(layer)
        for kind in kinds:
            was_decomposed, was_fused = before.get(layer, {}).get(kind, (0, 0))
            still, fused = after.get(layer, {}).get(kind, (0, 0))
            if fused > was_fused:
                entry.applied[kind] = fused - was_fused
            if still:
                why = _why(kind, has_kv_cache, counts)
                if kind == "attention" and attention_plain:
                    # the form, in words, first; the rule's near-miss stays as the detail
                    why = "left as it is: " + "; ".join(attention_plain)
                if kind == "attention" and attention_why:
                    why += f"; {attention_why}"
                if kind == "rotary" and rotary_why:
                    why = rotary_why
                if kind == "rmsnorm" and near and near.get(layer):
                    why += "; onnxscript's MatchingTracer: " + "; ".join(dict.fromkeys(near[layer]))
                entry.missed[kind] = (still, why)
        if entry.applied or entry.missed:
            out.append(entry)
    return out


def _why(kind: str, has_kv_cache: bool, counts: dict[str, int]) -> str:
    if kind == "rotary" and counts.get("rotary_embedding") and not counts.get("cos_sin_cache"):
        return ("onnxscript matched the rotation (rotary_embedding) but not the cos/sin computation feeding it "
                "(cos_sin_cache), so no RotaryEmbedding node could be built and the rotation stays decomposed")
    if kind == "attention" and not has_kv_cache:
        return ("no attention rule matched; onnxscript's GroupQueryAttention rule needs a graph with a KV cache "
                "(past_key_values inputs), and ortgate's gives a cache-less export one only with --context-length "
                "and a rotary it can fold in")
    return f"no onnxscript {kind} rule matched this form"


def fusion_totals(report: FusionReport) -> Counter:
    totals: Counter = Counter()
    for layer in report.layers:
        totals.update(layer.applied)
    return totals
