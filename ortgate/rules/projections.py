"""Projection rules (OGF): Q/K/V not packed, gate/up not merged, SwiGLU not fused."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ortgate.cost.repairs import RepairKind
from ortgate.findings import Severity
from ortgate.graph.index import MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import is_op
from ortgate.graph.patterns.moe import fused_moe_nodes, moe_blocks
from ortgate.graph.patterns.projections import GatedMlp, QkvProjections, gated_mlps, linear_dims, qkv_projections
from ortgate.knowledge.families import swiglu_parameters_text
from ortgate.knowledge.fusions import fusions_version, optimizer_pass, pass_applies
from ortgate.knowledge.moe import moe_inputs
from ortgate.knowledge.providers import graph_optimization_levels
from ortgate.rules.advice import builder_advice
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext
from ortgate.rules.targets import Target, by_layer, judged_graph, layer_text, ort_pass_note, short_providers, target

QKV_FIX = (
    "Pack Q, K and V into one projection: one MatMul (or MatMulNBits) with the weights concatenated to "
    "[hidden, (num_heads + 2 * kv_num_heads) * head_size], then GroupQueryAttention with the packed QKV as its "
    "query input and key/value left empty (do_rotary=1 folds the rotary in), or a Split when q_norm/k_norm or a "
    "gate sit between projection and attention. On CUDA, ORT's GroupQueryAttentionFusion packs q/k/v MatMuls that "
    "feed RotaryEmbedding -> GroupQueryAttention directly."
)
GATE_UP_FIX = (
    "Export the experts as com.microsoft MoE / QMoE with activation_type=swiglu and swiglu_fusion=1: fc1 holds gate "
    "and up interleaved row by row ([experts, 2 * inter, hidden]), fc3 stays empty, so one grouped GEMM computes both "
    "and the SwiGLU runs in its epilogue (swiglu_fusion=2 concatenates instead; ORT's CPU kernel accepts only 1). "
    "`ortgate fix MODEL -o OUT` writes this form where it rewrites the MoE block (moe-not-fused's fix says where)."
)
SWIGLU_FIX = (
    "For MoE experts use com.microsoft MoE / QMoE activation_type=swiglu, swiglu_fusion=1 (activation_alpha / "
    f"activation_beta / swiglu_limit: {swiglu_parameters_text()}). For dense MLPs and shared experts, let ORT fuse "
    f"the SiLU: create the session at {optimizer_pass('QuickGeluFusion').level} or above, where QuickGeluFusion "
    "turns x * Sigmoid(x) into com.microsoft QuickGelu(alpha=1) "
    f"({short_providers(optimizer_pass('QuickGeluFusion').providers)})."
)


def _weight_dtype(graph: Graph, node: Node) -> str | None:
    if node.op_type == "MatMulNBits":
        return graph.dtype(node.input(2))  # scales carry the float type
    return graph.dtype(node.input(1))


def _ort_packs(graph: Graph, found: QkvProjections, tgt: Target) -> bool:
    """Whether ORT's GroupQueryAttentionFusion (CUDA) repacks this exact form at session creation."""
    node = found.attention
    if not (node.domain == MS_DOMAIN and node.op_type == "GroupQueryAttention") or node.attr("do_rotary", 0):
        return False
    if not pass_applies("GroupQueryAttentionFusion", tgt.provider, tgt.level):
        return False
    pre_q, pre_k, pre_v = (graph.producer(node.input(i)) for i in range(3))
    for rotary, proj in ((pre_q, found.q), (pre_k, found.k)):
        if not is_op(rotary, "RotaryEmbedding", domain=MS_DOMAIN) or graph.producer(rotary.input(0)) is not proj:
            return False
    if pre_v is not found.v:
        return False
    projections = [p for p in (found.q, found.k, found.v) if p is not None]
    if len(projections) != 3:
        return False
    if all(p.op_type == "MatMulNBits" and int(p.attr("bits", 4)) == 4 for p in projections):
        return all(_weight_dtype(graph, p) == "float16" for p in projections)
    if all(p.op_type == "MatMul" for p in projections):
        return all(_weight_dtype(graph, p) == "float16" for p in projections)
    return False


@rule("OGF007", "qkv-not-packed", Severity.WARNING, needs=("attention",), price=RepairKind.qkv)
def qkv_not_packed(ctx: RuleContext):
    """Attention reads Q, K and V from separate projections of the same hidden state instead of one packed QKV GEMM.

    ## What it checks
    For every softmax attention in the executed graph (GroupQueryAttention, MultiHeadAttention, Attention, or a
    decomposed MatMul -> Softmax -> MatMul core), its query, key and value are followed upstream through
    reshapes, transposes, casts, q_norm/k_norm, rotary, the KV-cache Concat and repeat_kv to the MatMul / Gemm /
    MatMulNBits projections they come from. Reported when they come from two or three different projections that
    read the same input. A packed projection followed by a Split is packed: onnxruntime-genai's Qwen3.5-MoE graph
    feeds GroupQueryAttention separate q, k and v because q_norm/k_norm and the output gate sit between projection
    and attention, but it computes them with one `qkv_proj` MatMul and splits afterwards, so it is not reported.
    Linear-attention projections (Qwen3.5's qkv/z/b/a) feed no softmax attention and are never considered.
    Without a dump, the one form ORT repacks itself (CUDA, ORT_ENABLE_EXTENDED+: float16 MatMuls or 4-bit
    MatMulNBits -> com.microsoft RotaryEmbedding -> GroupQueryAttention with do_rotary=0) is qkv-packed-by-ort's
    information. Attention whose inputs do not each lead to one projection is reported as undecided.

    ## Why it costs throughput
    Three GEMMs read the same activation three times and launch three kernels where one GEMM of width
    (num_heads + 2 * kv_num_heads) * head_size does the work; at decode (one token) each is a thin,
    launch-bound GEMV. The CANN Qwen3-MoE recipe packs them (merged_qkv_proj) for the same reason.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float[1, T, 64] h, float[1, 2, P, 16] past_k, float[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float[1, T, 64] o, float[1, 2, S, 16] present_k, float[1, 2, S, 16] present_v)
    <float[64, 64] w_q, float[64, 32] w_k, float[64, 32] w_v>
    {
      q = MatMul(h, w_q)
      k = MatMul(h, w_k)
      v = MatMul(h, w_v)
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          q, k, v, past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float[1, T, 64] h, float[1, 2, P, 16] past_k, float[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float[1, T, 64] o, float[1, 2, S, 16] present_k, float[1, 2, S, 16] present_v)
    <float[64, 128] w_qkv>
    {
      qkv = MatMul(h, w_qkv)
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Fix
    Concatenate Wq, Wk, Wv into one weight and split after the projection (or let GroupQueryAttention take the
    packed input); onnxruntime-genai's builder does this.
    """
    graph, _ = judged_graph(ctx)
    for untraced in (p for p in qkv_projections(graph) if not p.traced and not p.packed):
        yield ctx.undecided(
            f"{untraced.attention.key} {layer_text(untraced.layer)}: its query, key and value do not each lead to one "
            "projection (MatMul / Gemm / MatMulNBits / FusedMatMul / MatMulInteger with a constant weight), so whether "
            "they are packed is unknown",
            graph=graph, node=untraced.attention)
    for found, repacked in separate_qkv(ctx):
        if not repacked:
            yield _qkv_finding(ctx, found, repacked)


def separate_qkv(ctx: RuleContext) -> list[tuple[QkvProjections, bool]]:
    """(attention reading q, k, v from separate projections of one input, whether ORT repacks it), in layer order."""
    graph, is_dump = judged_graph(ctx)
    tgt = target(ctx)
    candidates = [p for p in qkv_projections(graph) if not p.packed and p.shared_input]
    return [(found, not is_dump and _ort_packs(graph, found, tgt))
            for _, group in by_layer(candidates, lambda p: p.attention, lambda p: p.layer) for found in group]


def _qkv_finding(ctx: RuleContext, found: QkvProjections, repacked: bool):
    """The one message of qkv-not-packed and qkv-packed-by-ort."""
    graph, is_dump = judged_graph(ctx)
    note = ort_pass_note("GroupQueryAttentionFusion", target(ctx), True) if repacked else (
        "ORT cannot repack it: GroupQueryAttentionFusion (CUDA only) needs q/k/v MatMuls feeding "
        "RotaryEmbedding -> GroupQueryAttention directly")
    projections = found.separate
    kind = found.attention.key if found.fused else "decomposed attention"
    widths = [linear_dims(graph, p) for p in projections]
    shapes = ", ".join(f"{p.display_name} {list(w)}" if w else p.display_name for p, w in zip(projections, widths))
    where = " in ORT's optimized dump" if is_dump else ""
    return ctx.finding(
        f"{kind} {layer_text(found.layer)} reads q, k and v from {len(projections)} separate projections of the "
        f"same input ({shapes}){where}: {len(projections)} GEMMs where one packed QKV GEMM would do; {note}",
        node=projections[0], graph=graph, layer=found.layer,
        related=[*projections[1:], found.attention], fix=_with_builder(ctx, QKV_FIX, "one packed qkv_proj"),
        fix_form="qkv_packed",
        properties={"projections": len(projections), "ort_packs": repacked},
    )


@rule("OGF011", "qkv-packed-by-ort", Severity.INFO, needs=("attention",))
def qkv_packed_by_ort(ctx: RuleContext):
    """Separate Q, K and V projections that ORT's GroupQueryAttentionFusion is expected to pack at session creation.

    ## What it checks
    What qkv-not-packed checks, on the exported model (no optimized dump given), for the one form ORT repacks
    itself on CUDA at ORT_ENABLE_EXTENDED and above: float16 MatMuls or 4-bit MatMulNBits for q, k and v, with q
    and k through com.microsoft RotaryEmbedding, into GroupQueryAttention with do_rotary=0.

    ## Why it costs throughput
    If ORT packs it as expected, nothing: the session runs one packed GEMM. The expectation is the pass's
    documented match, not an observation; an optimized dump (`--optimized`) confirms it.

    ## Bad
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 64] h, int64[1, T] pos, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v,
               int32[1] seqlens_k, int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k,
                                                            float16[1, 2, S, 16] present_v)
    <float16[64, 64] w_q, float16[64, 32] w_k, float16[64, 32] w_v, float16[256, 8] cos, float16[256, 8] sin>
    {
      q = MatMul(h, w_q)
      k = MatMul(h, w_k)
      v = MatMul(h, w_v)
      q_rot = com.microsoft.RotaryEmbedding(q, pos, cos, sin)
      k_rot = com.microsoft.RotaryEmbedding(k, pos, cos, sin)
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          q_rot, k_rot, v, past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Good
    ```yaml
    execution_provider: {name: CUDAExecutionProvider}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 64] h, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    <float16[64, 128] w_qkv, float16[256, 8] cos, float16[256, 8] sin>
    {
      qkv = MatMul(h, w_qkv)
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2, do_rotary = 1>(
          qkv, , , past_k, past_v, seqlens_k, total_len, cos, sin)
    }
    ```

    ## Fix
    Nothing is required; export the packed form to stop depending on the pass, and lint the optimized dump to
    confirm.
    """
    for found, repacked in separate_qkv(ctx):
        if repacked:
            yield _qkv_finding(ctx, found, repacked)


def _fc3_input(node: Node) -> str:
    return node.input(moe_inputs(node.op_type).fc3_experts_weights)


def _routed(mlp: GatedMlp, routed_linears: set[int]) -> bool:
    """Whether this gated MLP is one of the block's routed experts (its gate or up projection is one of theirs:
    the block found them as the FFNs whose output the routing weights)."""
    return any(n is not None and n.index in routed_linears for n in (mlp.gate, mlp.up))


@rule("OGF008", "gate-up-not-merged", Severity.WARNING, needs=("moe",), price=RepairKind.gate_up)
def gate_up_not_merged(ctx: RuleContext):
    """MoE experts compute the gate and up projections as two GEMMs instead of one merged (w13) GEMM.

    ## What it checks
    - com.microsoft MoE / QMoE nodes with `fc3_experts_weights` (MoE input 6, QMoE input 8): the up projection runs
      as a second grouped GEMM (`swiglu_fusion=0`, or `activation_type=silu` with fc3) where `swiglu_fusion=1`
      merges gate and up into fc1.
    - Expert loops (MoE computed with standard ops): routed experts whose gate and up come from two MatMul/Gemm
      nodes of the same input. One finding per MoE layer.

    Dense MLPs and shared experts are not reported: ORT's CPU and CUDA providers have no kernel that consumes a
    merged dense gate|up projection (MoE's swiglu_fusion exists only inside MoE), at decode the two GEMVs read
    the same weight bytes as one, and ORT's own dense gated-MLP fusion (com.microsoft MatMulNBitsMlp) takes the
    separate form. onnxruntime-genai's builder keeps dense and shared-expert gate/up separate for that reason.

    ## Why it costs throughput
    For experts the second GEMM is a second grouped-GEMM launch per layer over the same routed tokens, plus an
    extra pass of the activation; the merged fc1 computes gate and up in one GEMM with SwiGLU in its epilogue
    (the CANN Qwen3-MoE recipe's w13 + fused SwiGLU). ORT's CPU MoE kernel rejects swiglu_fusion=0 outright.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float16[T, 8] h) => (float16[T, 8] y)
    <float16[8, 4] router_w, float16[4, 16, 8] fc1_gate, float16[4, 8, 16] fc2, float16[4, 16, 8] fc3_up>
    {
      logits = MatMul(h, router_w)
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 0, normalize_routing_weights = 1>(
          h, logits, fc1_gate, , fc2, , fc3_up)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float16[T, 8] h) => (float16[T, 8] y)
    <float16[8, 4] router_w, float16[4, 32, 8] fc1_gate_up_interleaved, float16[4, 8, 16] fc2>
    {
      logits = MatMul(h, router_w)
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 1>(
          h, logits, fc1_gate_up_interleaved, , fc2)
    }
    ```

    ## Fix
    Interleave each expert's gate and up rows into fc1 ([experts, 2 * inter, hidden]) and set swiglu_fusion=1;
    re-export with onnxruntime-genai's builder, which does.
    """
    graph, _ = judged_graph(ctx)
    for found in [*_fused_with_fc3(graph), *_loops_with_separate_gate_up(graph)]:
        yield ctx.finding(
            f"{found.what} {layer_text(found.layer)} {found.how}: gate and up run as two GEMMs instead of one merged "
            "gate_up (fc1) GEMM with swiglu_fusion=1",
            node=found.node, graph=graph, layer=found.layer, related=found.related, fix=_with_builder(ctx, GATE_UP_FIX, "this form", "moe_fused"),
            properties=found.properties,
        )


@dataclass(frozen=True)
class SeparateGateUp:
    """Gate and up (or SiLU and its product) computed apart: what, where, how, and the nodes to point at."""

    what: str
    layer: int | None
    how: str
    node: Node
    related: list[Node]
    properties: dict


def _fused_with_fc3(graph: Graph) -> list[SeparateGateUp]:
    with_fc3 = [n for n in fused_moe_nodes(graph) if _fc3_input(n)]
    return [SeparateGateUp(
        nodes[0].key, layer, f"has separate fc3 (up) weights ({_fc3_input(nodes[0])}), activation_type="
        f"{nodes[0].attr('activation_type', 'relu')}, swiglu_fusion={nodes[0].attr('swiglu_fusion', 0)}",
        nodes[0], nodes[1:], {"fc3": _fc3_input(nodes[0])})
        for (_, layer), nodes in by_layer(with_fc3, lambda n: n, lambda n: n.layer)]


def _loops_with_separate_gate_up(graph: Graph) -> list[SeparateGateUp]:
    """Expert loops whose routed experts read gate and up from two projections (each block its own layer's MLPs)."""
    loops = [(b, b.router) for b in moe_blocks(graph) if b.fused is None and b.router is not None]
    if not loops:  # nothing to look into: the gated MLPs of the whole graph are not worth finding
        return []
    mlps = [m for m in gated_mlps(graph) if m.gate is not None]
    # Indexed once, so that each block looks only at its own MLPs (not every MLP of the model per block).
    layer_mlps: dict[int | None, list[int]] = defaultdict(list)
    gate_mlps: dict[int, list[int]] = defaultdict(list)
    for position, m in enumerate(mlps):
        layer_mlps[m.layer].append(position)
        if m.gate is not None:
            gate_mlps[m.gate.index].append(position)
    out = []
    for block, router in loops:
        if block.layer is not None:
            positions = layer_mlps.get(block.layer, [])
        else:
            positions = sorted({p for n in block.expert_linears for p in gate_mlps.get(n.index, ())})
        candidates = [mlps[p] for p in positions]
        routed_linears = {n.index for n in block.routed_linears}
        routed = [m for m in candidates if _routed(m, routed_linears)]
        separate = [m for m in routed if m.separate and m.gate is not None and m.up is not None]
        if separate:
            gate, up = separate[0].gate, separate[0].up
            assert gate is not None and up is not None  # kept above
            out.append(SeparateGateUp(
                "MoE expert loop", block.layer, f"has {len(separate)} of {len(routed)} routed experts reading gate and "
                f"up from two projections (e.g. {gate.display_name} and {up.display_name})",
                router, [n for m in separate for n in (m.gate, m.up) if n is not None],
                {"experts_separate": len(separate), "experts": len(routed)}))
    return out


def _below(level: str, floor: str) -> bool:
    levels = graph_optimization_levels()
    return levels.get(level, 99) < levels[floor]


@rule("OGF009", "swiglu-not-fused", Severity.WARNING, price=RepairKind.swiglu)
def swiglu_not_fused(ctx: RuleContext):
    """SiLU(gate) * up is computed with Sigmoid and Mul nodes that no ORT fusion before 1.32.0 folds.

    ## What it checks
    - SiLU written as `Mul(g, Sigmoid(g))` in gated MLPs (dense, shared experts, expert loops). In ORT terms a
      dense SiLU is fused when it is one com.microsoft `QuickGelu(alpha=1)` node; ORT's QuickGeluFusion makes
      it at ORT_ENABLE_EXTENDED and above on CPU, CUDA, DirectML, ROCm and ACL, and onnxruntime-genai relies on
      that for the shared expert of Qwen3.5-MoE. So the exported model is reported only when the deployment's
      optimization level is below ORT_ENABLE_EXTENDED; an optimized dump that still holds Sigmoid + Mul is always
      reported (it was made below EXTENDED or for a provider without the pass). The final `* up` stays an
      elementwise Mul in every ORT provider before 1.32.0: no dense SwiGLU kernel exists outside MoE. ORT 1.32.0
      adds the SwiGluFusion pass (QuickGelu + Mul into com.microsoft.SwiGLU); on the CPU provider it does not fire
      (SwiGLU has no CPU kernel: a SiLU(gate) * up MLP at ORT_ENABLE_ALL on 1.32.0 still ends as QuickGelu + Mul),
      and whether it fires on CUDA is not known, so the rule does not count on it.

    A com.microsoft MoE / QMoE with `activation_type=silu` and separate fc3 weights has no Sigmoid or Mul node to
    fuse: its one problem, gate and up in two GEMMs where `activation_type=swiglu` with `swiglu_fusion=1` merges
    them, is gate-up-not-merged's finding, not this rule's.

    ## Why it costs throughput
    Sigmoid, Mul and Mul are three kernels and three passes over the [tokens, intermediate] activation per MLP
    (per expert, in a loop); QuickGelu is one. Inside MoE, activation_type=swiglu applies the activation in the
    expert GEMM's epilogue and never materialises gate and up separately.

    ## Bad
    ```yaml
    session: {graph_optimization_level: ORT_ENABLE_BASIC}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    mlp (float[T, 64] h) => (float[T, 64] y)
    <float[64, 128] w_gate, float[64, 128] w_up, float[128, 64] w_down>
    {
      gate = MatMul(h, w_gate)
      up = MatMul(h, w_up)
      sig = Sigmoid(gate)
      silu = Mul(gate, sig)
      act = Mul(silu, up)
      y = MatMul(act, w_down)
    }
    ```

    ## Good
    ```yaml
    session: {graph_optimization_level: ORT_ENABLE_ALL}   # QuickGeluFusion turns x * Sigmoid(x) into QuickGelu
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    mlp (float[T, 64] h) => (float[T, 64] y)
    <float[64, 128] w_gate, float[64, 128] w_up, float[128, 64] w_down>
    {
      gate = MatMul(h, w_gate)
      up = MatMul(h, w_up)
      sig = Sigmoid(gate)
      silu = Mul(gate, sig)
      act = Mul(silu, up)
      y = MatMul(act, w_down)
    }
    ```

    ## Fix
    Run the session at ORT_ENABLE_EXTENDED or above (ORT_ENABLE_ALL is ORT's default), and export MoE experts with
    activation_type=swiglu, swiglu_fusion=1.
    """
    graph, _ = judged_graph(ctx)
    for found in _dense_silu_left_unfused(ctx, graph):
        yield ctx.finding(
            f"{found.what} {layer_text(found.layer)} {found.how}",
            node=found.node, graph=graph, layer=found.layer, related=found.related, fix=SWIGLU_FIX,
            properties=found.properties,
        )


def _dense_silu_left_unfused(ctx: RuleContext, graph: Graph) -> list[SeparateGateUp]:
    """Gated MLPs whose SiLU stays Sigmoid + Mul: in an optimized dump, or below the level where ORT fuses it."""
    tgt = target(ctx)
    if ctx.optimized is not None:
        why = (f"still Sigmoid + Mul in ORT's optimized dump: QuickGeluFusion did not run (the dump was made below "
               f"ORT_ENABLE_EXTENDED, or for a provider without the pass; ORT {fusions_version()})")
    elif _below(tgt.level, "ORT_ENABLE_EXTENDED"):
        why = ort_pass_note("QuickGeluFusion", tgt, False) + f" (set by {tgt.origin})"
    else:
        return []
    unfused = [m for m in gated_mlps(graph) if not m.fused_activation]
    return [SeparateGateUp(
        f"{len(group)} gated MLP{'s' if len(group) > 1 else ''}", layer,
        f"compute{'' if len(group) > 1 else 's'} SiLU(gate) * up as Sigmoid -> Mul -> Mul; {why}",
        group[0].activation[0], [n for m in group for n in (*m.activation, m.product)], {"gated_mlps": len(group)})
        for (_, layer), group in by_layer(unfused, lambda m: m.product, lambda m: m.layer)]


def _with_builder(ctx: RuleContext, fix: str, writes: str, form: str | None = None) -> str:
    """`fix`, then a builder that writes `writes` for this model's family and the deployment's provider."""
    builder = builder_advice(ctx.expect.value("family"), ctx.deployment.provider, writes, form)
    return f"{fix} {builder}" if builder else fix
