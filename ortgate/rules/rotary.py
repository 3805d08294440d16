"""Rotary embedding rule (OGF): the rotate_half pattern instead of a fused rotary op."""

from __future__ import annotations

from ortgate.cost.repairs import RepairKind
from ortgate.findings import Severity
from ortgate.graph.patterns.rotary import decomposed_rotaries, rotary_misses
from ortgate.knowledge.fusions import fusions_version
from ortgate.rules.advice import builder_advice, fusion_fix_advice
from ortgate.rules.base import FixKind, rule
from ortgate.rules.context import RuleContext
from ortgate.rules.targets import by_layer, judged_graph, layer_text

ROTARY_FIX = (
    "Fold the rotary into GroupQueryAttention (do_rotary=1 with cos_cache/sin_cache inputs [max_position, "
    "rotary_dim/2], rotary_interleaved as the model's) or export com.microsoft RotaryEmbedding (input, position_ids, "
    "cos_cache, sin_cache; interleaved=0 for half-split pairs, 1 for interleaved) / MRotaryEmbedding for multimodal RoPE. "
    "onnxscript's ort_fusions rewrites the pattern into RotaryEmbedding only when cos/sin come from cached tables "
    "(fuse_cos_sin_cache)."
)


def rotary_fix(ctx: RuleContext) -> str:
    """ROTARY_FIX, then `ortgate fix` (onnxscript's rotary fusions) and a builder for a family it builds."""
    return " ".join(filter(None, (ROTARY_FIX, fusion_fix_advice("the rotary"),
                                   builder_advice(ctx.expect.value("family"), ctx.deployment.provider, "both"))))


PAIRING_TEXT = {
    "half": "half-split pairs (x[i] with x[i + d/2], rotate_half)",
    "interleaved": "interleaved pairs (x[2i] with x[2i+1])",
}


def _partial(graph, rotary) -> tuple[int, int] | None:
    """(rotated dims, head dims) when the rotation covers only the first part of each head (partial rotary: a Slice
    of the head's last axis is rotated, the rest passed through), from the declared shapes; else None."""
    source = graph.producer(rotary.input)
    if source is None or source.op_type not in ("Slice", "Split") or not source.inputs:
        return None
    rotated, whole = graph.shape(rotary.input), graph.shape(source.inputs[0])
    if not rotated or not whole or len(rotated) != len(whole):
        return None
    d, full = rotated[-1], whole[-1]
    if isinstance(d, int) and isinstance(full, int) and 0 < d < full:
        return d, full
    return None


@rule("OGF006", "rotary-not-fused", Severity.WARNING, price=RepairKind.rotary, fix=FixKind.rotary)
def rotary_not_fused(ctx: RuleContext):
    """The rotary position embedding is computed with Sin/Cos/Slice/Neg/Concat/Mul instead of a fused rotary op.

    ## What it checks
    A rotation of paired components of q or k by position-dependent cos/sin, in the executed graph (the
    optimized dump when given), written either way exporters write it: rotate_half (`Slice`/`Split` into halves,
    `Neg` of the second, `Concat`, then `x * cos + rotated * sin`), or both halves rotated apart and joined
    (`Concat(a * cos - b * sin, b * cos + a * sin)`, GPT-OSS, DeepSeek-V3), with cos/sin from `Sin`/`Cos` nodes or
    from cached tables. The finding says which components are paired: half-split (x[i] with x[i + d/2]) or
    interleaved (x[2i] with x[2i+1], strided `0::2` / `1::2` slices, or a Gather 0 / 1 of x viewed as pairs
    [..., d/2, 2]: Llama-4), because the fused op needs the matching
    `interleaved` / `rotary_interleaved` attribute. Fused forms are com.microsoft `RotaryEmbedding`, `MRotaryEmbedding` and
    `GemmaRotaryEmbedding`, ONNX (opset 23) `RotaryEmbedding`, and `GroupQueryAttention` with `do_rotary=1`; ops
    are matched by (domain, op_type). One finding per decoder layer (q and k together). A partial rotary (only the
    first d of each head's dims rotated, the rest passed through: GLM-4.5, Qwen3-Next) is said with its d, which the
    fused op needs as `rotary_embedding_dim`. A Mul of an activation by a table computed from `Sin` / `Cos` that no
    rotary form reads is reported as undecided, naming the Mul and its table (Q/DQ around the rotary's ops is
    looked through).

    ## Why it costs throughput
    Each rotated tensor costs two Slices, a Neg, a Concat, two Muls and an Add (plus the Sin/Cos tables computed
    in the graph): seven kernels and seven round trips through memory for q and again for k, per layer and per
    token. A fused rotary is one kernel, and inside GroupQueryAttention it costs nothing extra. ORT has no
    optimizer pass that builds RotaryEmbedding: what the exporter wrote is what runs.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    rotary (float[1, 4, T, 16] q, float[1, 1, T, 16] cos, float[1, 1, T, 16] sin) => (float[1, 4, T, 16] q_rot)
    <int64[1] zero = {0}, int64[1] half = {8}, int64[1] end = {16}, int64[1] last = {-1}>
    {
      q1 = Slice(q, zero, half, last)
      q2 = Slice(q, half, end, last)
      neg_q2 = Neg(q2)
      rotated = Concat<axis = -1>(neg_q2, q1)
      q_cos = Mul(q, cos)
      r_sin = Mul(rotated, sin)
      q_rot = Add(q_cos, r_sin)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    rotary (float[1, T, 64] q, int64[1, T] position_ids) => (float[1, T, 64] q_rot)
    <float[256, 8] cos_cache, float[256, 8] sin_cache>
    {
      q_rot = com.microsoft.RotaryEmbedding<num_heads = 4, interleaved = 0>(q, position_ids, cos_cache, sin_cache)
    }
    ```

    ## Fix
    Run `ortgate fix MODEL -o OUT`: onnxscript's rotary fusions rewrite it where cos/sin come from cached tables,
    and the report says per layer what they left. Or re-export with the rotary fused (onnxruntime-genai's builder,
    for the families it builds).
    """
    graph, is_dump = judged_graph(ctx)
    where = " in ORT's optimized dump" if is_dump else ""
    rotaries = decomposed_rotaries(graph)
    for (_, layer), group in by_layer(rotaries, lambda r: r.add, lambda r: r.layer):
        trig = "Sin/Cos computed in the graph" if any(r.trig for r in group) else "cached cos/sin tables"
        ops = sorted({n.op_type for r in group for n in r.nodes})
        pairings = sorted({r.pairing for r in group})
        pairing = " and ".join(PAIRING_TEXT[p] for p in pairings)
        interleaved = int(pairings == ["interleaved"])
        partial = {p for p in (_partial(graph, r) for r in group) if p}
        part, props = "", {}
        if len(partial) == 1:
            d, full = partial.pop()
            part = (f" on the first {d} of each head's {full} dims (partial rotary, factor {d / full:g}: the fused op "
                    f"needs rotary_embedding_dim={d})")
            props = {"rotary_dim": d, "head_dim": full}
        yield ctx.finding(
            f"rotary embedding applied to {len(group)} tensor{'s' if len(group) > 1 else ''} (q/k) "
            f"{layer_text(layer)}{part}, {pairing}, with {', '.join(ops)} ({trig}){where} instead of com.microsoft "
            f"RotaryEmbedding (interleaved={interleaved}) or GroupQueryAttention do_rotary=1 "
            f"(rotary_interleaved={interleaved}); ORT {fusions_version()} has no pass that fuses it",
            node=group[0].neg, graph=graph, layer=layer,
            related=[n for r in group for n in r.nodes] + [t for r in group for t in r.trig],
            fix=rotary_fix(ctx), fix_form="rotary_fused",
            properties={"rotated_tensors": len(group), "pairing": pairings[0] if len(pairings) == 1 else pairings,
                        **props},
        )
    for (_, layer), missed in by_layer(rotary_misses(graph), lambda m: m.node, lambda m: m.layer):
        # Sin / Cos tables applied to activations that no rotary form read: said, never passed over
        yield ctx.undecided(
            f"whether {layer_text(layer)}{where} a rotary embedding is computed with standard ops: "
            + "; ".join(m.reason for m in missed[:4]) + (f" (and {len(missed) - 4} more)" if len(missed) > 4 else ""),
            node=missed[0].node, graph=graph,
            properties={"table_products": len(missed)},
        )
