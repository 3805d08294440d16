"""Fusion rules (OGF): the graph computes with many small standard ops what one ORT kernel does."""

from __future__ import annotations

from collections import Counter, defaultdict

from ortgate.cost.repairs import RepairKind
from ortgate.findings import Severity
from ortgate.graph.index import DEFAULT_DOMAIN, Graph, Node
from ortgate.graph.patterns.attention import attention_cores, fused_attention_nodes, kv_expanded
from ortgate.graph.patterns.common import QDQ_OPS
from ortgate.graph.patterns.moe import MoeBlock, moe_blocks, moe_misses
from ortgate.graph.patterns.moe_anatomy import block_verdict, moe_anatomies
from ortgate.graph.patterns.moe_group_routing import GroupVerdict, group_verdict
from ortgate.graph.patterns.projections import decomposed_heads
from ortgate.knowledge.group_router import group_router_facts
from ortgate.rules.advice import FIX_COMMAND, WAIVE, builder_advice
from ortgate.rules.base import FixKind, rule
from ortgate.rules.context import RuleContext

MOE_HOW = (
    "one com.microsoft.MoE node (QMoE for int4/int8 experts): activation_type=swiglu, swiglu_fusion=1 (gate and up "
    "interleaved in fc1), k=top_k, normalize_routing_weights as the model's norm_topk_prob"
)
MOE_NO_PASS = "ORT has no optimizer pass that fuses MoE, so no session setting can repair this graph."


def moe_fix(ctx: RuleContext, block: MoeBlock) -> str:
    """What repairs this block, as `ortgate fix`'s planner decides it (graph/patterns/moe_anatomy.rewrite_refusal):
    `ortgate fix` where it rewrites the block, a builder only for a family it builds and for the deployment's
    provider, and for a router no com.microsoft.MoE form expresses, that, and what remains."""
    verdict = block_verdict(ctx.model, block) if block.router is not None and block.router.graph is None else None
    builder = builder_advice(ctx.expect.value("family"), ctx.deployment.provider, "it", "moe_fused")
    grouped = _group_verdict(ctx, block) if verdict is not None and not verdict.rewritable else None
    if grouped is not None and grouped.anatomy is not None:
        router = group_router_facts()
        return (f"Run `{FIX_COMMAND} --policy P`: for the policy's onnxruntime release it rewrites this block into "
                f"com.microsoft.{router.op_type} (sigmoid scores, correction bias, expert groups) + com.microsoft.MoE, "
                f"checks the result equals the original on ORT CPU (where the installed onnxruntime has "
                f"{router.op_type}: {router.first_release} on) and lints it again. {MOE_NO_PASS}")
    if grouped is not None and grouped.expressible:
        return (f"No com.microsoft.MoE form expresses this router: {grouped.reason}. With onnxruntime "
                f"{group_router_facts().first_release} or later pinned in the policy, `ortgate fix` rewrites it; "
                f"else {WAIVE}.")
    if grouped is not None:
        return (f"No com.microsoft.MoE form expresses this router: {grouped.reason}. Neither `ortgate fix` nor a "
                f"re-export can fuse it; {WAIVE}.")
    if verdict is not None and verdict.rewritable:
        return (f"Run `{FIX_COMMAND}`: it rewrites this block into {MOE_HOW}, checks the result equals the original on "
                f"ORT CPU and lints it again (`--dry-run` shows the plan). {builder} {MOE_NO_PASS}")
    if verdict is not None and not verdict.expressible:
        return (f"No com.microsoft.MoE form expresses this router: {verdict.reason}. Neither `ortgate fix` nor a "
                f"re-export can fuse it; {WAIVE}.")
    refused = f"`ortgate fix` leaves this block unchanged: {verdict.reason}. " if verdict is not None else ""
    return (f"{refused}Export the layer as {MOE_HOW}. {builder} {MOE_NO_PASS}")


def _group_verdict(ctx: RuleContext, block: MoeBlock) -> GroupVerdict | None:
    """What `ortgate fix` decides for a sigmoid / bias-corrected / group-limited router on the policy's release."""
    anatomy = next((a for a in moe_anatomies(ctx.model) if a.block is block), None)
    if anatomy is None:
        return None
    release = ctx.policy.get("execution_provider", "onnxruntime_version") if ctx.policy is not None else None
    return group_verdict(ctx.model, anatomy, str(release) if release is not None else None)


@rule("OGF001", "moe-not-fused", Severity.ERROR, needs=("moe",), price=RepairKind.moe, fix=FixKind.moe)
def moe_not_fused(ctx: RuleContext):
    """A Mixture-of-Experts layer is computed with standard ops instead of com.microsoft MoE / QMoE.

    ## What it checks
    Every MoE layer of the exported model: a router projection whose expert logits feed TopK / Softmax
    routing (Gather, Scatter, Where, NonZero) and per-expert MatMul/Gemm groups, or a dense loop that runs
    every expert on every token, instead of one `com.microsoft.MoE` (or `QMoE`) node. One finding per layer,
    naming the router and the routing and expert nodes. A router-like structure (a TopK / ArgMax over a
    projection's logits) that no expert form reads is reported as undecided, naming its node and why it was not
    read. How many MoE layers the graph has against the policy's `model.moe_layers` is moe-layer-count-mismatch's
    to say.

    ## Why it costs throughput
    ORT has no optimizer pass that fuses MoE: whatever the exporter wrote is what runs. A per-expert loop
    launches three GEMMs per expert per layer (128 experts x 48 layers x 3 = 18,432 GEMMs per step for
    Qwen3-30B-A3B), most on tokens the router did not pick, plus the routing ops. The fused MoE kernel sorts tokens
    by expert and runs grouped GEMMs: one launch sequence per layer and only the top-k experts' work.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    moe_layer (float[T, 8] x) => (float[T, 8] y)
    <float[8, 2] router_w, int64[1] k = {1},
     int64[1] e0 = {0}, int64[1] e1 = {1}, int64[1] e2 = {2}, int64[1] last = {-1},
     float[8, 16] gate_0, float[8, 16] up_0, float[16, 8] down_0,
     float[8, 16] gate_1, float[8, 16] up_1, float[16, 8] down_1>
    {
      logits = MatMul(x, router_w)                       # router: one logit per expert
      probs = Softmax<axis = -1>(logits)
      top_w, top_i = TopK(probs, k)
      shape = Shape(logits)
      zeros = ConstantOfShape(shape)
      routing = ScatterElements<axis = -1>(zeros, top_i, top_w)   # [T, experts]: top-k weights, 0 elsewhere
      g0 = MatMul(x, gate_0)                             # expert 0 runs on every token
      s0 = Sigmoid(g0)
      a0 = Mul(g0, s0)
      u0 = MatMul(x, up_0)
      h0 = Mul(a0, u0)
      d0 = MatMul(h0, down_0)
      w0 = Slice(routing, e0, e1, last)
      y0 = Mul(d0, w0)
      g1 = MatMul(x, gate_1)                             # expert 1 too
      s1 = Sigmoid(g1)
      a1 = Mul(g1, s1)
      u1 = MatMul(x, up_1)
      h1 = Mul(a1, u1)
      d1 = MatMul(h1, down_1)
      w1 = Slice(routing, e1, e2, last)
      y1 = Mul(d1, w1)
      y = Add(y0, y1)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float[T, 8] x) => (float[T, 8] y)
    <float[8, 2] router_w, float[2, 32, 8] fc1, float[2, 8, 16] fc2>
    {
      logits = MatMul(x, router_w)
      y = com.microsoft.MoE<k = 1, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 1>(
          x, logits, fc1, , fc2)
    }
    ```

    ## Fix
    Run `ortgate fix MODEL -o OUT`: it rewrites every block whose routing com.microsoft.MoE expresses
    (softmax then top-k, or top-k then softmax, renormalised or not) into one MoE node, stacking the experts'
    gate/up weights into fc1 `[experts, 2*inter, hidden]` (interleaved for swiglu_fusion=1) and the down weights into
    fc2 `[experts, hidden, inter]`, with the router logits as `router_probs`; it checks the result on ORT CPU and
    says of each block it leaves why. Or re-export with a builder that emits com.microsoft.MoE, for a family it
    builds and with the deployment's execution provider (onnxruntime-genai's model builder builds Qwen3.5/3.6-MoE,
    GPT-OSS, PhiMoE, LFM2-MoE, GraniteMoeHybrid and Gemma4-MoE; not Mixtral, Qwen2-MoE, OLMoE, GraniteMoE,
    DeepSeek or Qwen3-MoE). A router no com.microsoft.MoE form expresses (sigmoid, group-limited or bias-corrected
    scoring as in DeepSeek-V3; PhiMoE's sparsemixer outside the cases ORT's CUDA kernel implements) can only be
    waived with a reason, or its cost accepted. Each finding's fix says which of these applies to its block.
    """
    graph = ctx.model
    blocks = moe_blocks(graph)
    for block in blocks:
        if block.fused is not None or block.router is None:
            continue
        yield ctx.finding(
            f"MoE layer with {block.experts} experts computed with standard ops: {moe_structure(block)}, instead "
            "of one com.microsoft.MoE",
            node=block.router, graph=graph, layer=block.layer,
            related=[*block.routing_nodes, *block.expert_linears],
            fix=moe_fix(ctx, block), fix_form="moe_fused",
            properties={
                "experts": block.experts, "top_k": block.k, "routing_form": block.routing_form.value,
                "expert_form": block.expert_form.value, "routed_experts": block.routed_experts_found,
                "expert_projections": len(block.routed_linears), "shared_experts": len(block.shared),
                "shared_expert_projections": len(block.shared_linears), "shared_expert_gates": len(block.shared_gates),
            },
        )
    for miss in moe_misses(graph):  # a router-like structure no form read: said, never passed over in silence
        yield ctx.undecided(
            f"whether {miss.node.display_name} routes an MoE layer computed with standard ops: {miss.reason}",
            node=miss.node, graph=graph,
            properties={"selection": miss.selection.name if miss.selection is not None else None,
                        "reason": miss.reason},
        )


def moe_structure(block: MoeBlock) -> str:
    """What an unfused MoE block computes, each kind of node counted on its own."""
    ops = Counter(n.op_type for n in block.routing_nodes if n.op_type not in QDQ_OPS)
    qdq = sum(1 for n in block.routing_nodes if n.op_type == "QuantizeLinear")
    listed = ", ".join(f"{op} x{count}" if count > 1 else op for op, count in sorted(ops.items())) + (
        f"; through {qdq} QuantizeLinear -> DequantizeLinear" if qdq else "")
    form = block.routing_form.words
    k = f", k={block.k}" if block.k else ""
    extras = [w for w, on in (("renormalised", block.normalized), (f"scaled by {block.scaled:g}" if block.scaled else "",
                                                                    bool(block.scaled))) if on]
    routing = f"router {block.router.display_name if block.router else '?'} -> {form}{k}" + (
        f" ({', '.join(extras)})" if extras else "") + f" [{listed}]"
    found = block.routed_experts_found
    loop = block.expert_form.words
    weighting = ", the routing scaling each expert's input" if block.weighting == "input" else ""
    routed = (f"{found} routed expert{'s' if found != 1 else ''} ({loop}{weighting}; {len(block.routed_linears)} "
              "projections)")
    parts = [routing, routed]
    if block.zero:
        parts.append(f"{len(block.zero)} zero-computation expert{'s' if len(block.zero) != 1 else ''} (x times its "
                     "routing weight, no projection)")
    if block.shared:
        parts.append(f"{len(block.shared)} shared expert{'s' if len(block.shared) != 1 else ''} "
                     f"({len(block.shared_linears)} projections)")
    if block.shared_gates:
        parts.append(f"{len(block.shared_gates)} shared-expert gate{'s' if len(block.shared_gates) != 1 else ''}")
    return "; ".join(parts)


GQA_FIX = (
    "Export attention as com.microsoft.GroupQueryAttention (num_heads, kv_num_heads, packed QKV or separate "
    "q/k/v, past_key/past_value KV cache, seqlens_k, total_sequence_length; do_rotary=1 with cos/sin caches "
    "to fold the rotary embedding in)."
)


def gqa_fix(ctx: RuleContext, base: str = GQA_FIX) -> str:
    """`base`, then `ortgate fix` (onnxscript's attention fusions: GroupQueryAttention only with a KV cache) and a
    builder for a family it builds, with the deployment's provider."""
    fix = (f"`{FIX_COMMAND}` runs onnxscript's attention fusions, which write GroupQueryAttention only on a graph with "
           "a KV cache (past key/value inputs) and otherwise MultiHeadAttention at most, which still expands K/V "
           "(`--dry-run` says per layer what it fused).")
    return " ".join(filter(None, (base, fix, builder_advice(ctx.expect.value("family"), ctx.deployment.provider,
                                                             "it"))))


# ContribOperators.md: GroupQueryAttention's packed QKV is num_heads * head_size + 2 * kv_num_heads * head_size wide
# and key / value are both kv_hidden_size: one head_size. MultiHeadAttention's value is v_hidden_size wide.
MLA_FIX = (
    "Export attention as com.microsoft.MultiHeadAttention (its value and output are v_hidden_size wide, apart from "
    "the q/k hidden size), or as com.microsoft.GroupQueryAttention with V zero-padded per head to the q/k head size "
    "and the output sliced back (GroupQueryAttention takes one head_size for q, k and v: ORT's "
    "ContribOperators.md). Both ops scale by 1/sqrt(head size of q/k) unless told: set `scale` when the model's "
    "differs."
)


@rule("OGF002", "gqa-not-fused", Severity.ERROR, needs=("attention",), price=RepairKind.attention, fix=FixKind.attention)
def gqa_not_fused(ctx: RuleContext):
    """Attention runs as decomposed ops or as a kernel that expands K/V, instead of com.microsoft GroupQueryAttention.

    ## What it checks
    - Decomposed attention in the executed graph (the optimized dump when given, else the model):
      MatMul(Q, K^T) -> scale -> mask -> Softmax -> MatMul(P, V), usually with K/V repeated to the query
      head count (Expand/Tile). One finding per layer. Where the graph declares q/k and v head sizes that differ
      (multi-head latent attention, MLA: DeepSeek-V3), the message says so and that GroupQueryAttention, which has
      one head_size, runs it only with V zero-padded; the fix then names MultiHeadAttention first.
    - MultiHeadAttention or ONNX `Attention` while the model has fewer kv heads than q heads.
    The number of attention layers against the policy is attention-layer-count-mismatch's to judge, GroupQueryAttention's
    heads against the model config gqa-config-mismatch's, heads that do not group gqa-heads-not-grouped's, and attributes
    ORT rejects the contract rules' (op-attribute-missing, op-attribute-type).

    ## Why it costs throughput
    Decomposed attention materialises the full [heads, q, kv] score tensor, repeats K and V to every query
    head, and launches a handful of kernels per layer. GroupQueryAttention runs flash/memory-efficient
    kernels that read each KV head once for its query group and update the KV cache in place; at decode time
    it is the difference between memory-bound and launch-bound.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    attention (float[1, 4, T, 16] q, float[1, 2, S, 16] k, float[1, 2, S, 16] v) => (float[1, 4, T, 16] o)
    <int64[4] kv_shape, float scale>
    {
      k4 = Expand(k, kv_shape)
      v4 = Expand(v, kv_shape)
      kt = Transpose<perm = [0, 1, 3, 2]>(k4)
      qk = MatMul(q, kt)
      scores = Div(qk, scale)
      p = Softmax<axis = -1>(scores)
      o = MatMul(p, v4)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 128] qkv, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Fix
    Re-export with GroupQueryAttention (onnxruntime-genai's builder, for the families it builds), with
    `num_heads` / `kv_num_heads` from the model config; on a graph with a KV cache, `ortgate fix MODEL -o OUT`
    rewrites it with onnxscript's attention fusions. ORT's own
    GroupQueryAttentionFusion only packs Q/K/V and rotary into an existing GQA node; it never creates one.
    """
    graph = ctx.executed
    for kind, node, layer, related, heads in _unfused_attention(ctx, graph):
        if heads is None:
            yield ctx.finding(
                f"attention {kind}, instead of com.microsoft.GroupQueryAttention", node=node, graph=graph,
                layer=layer, related=related, fix=gqa_fix(ctx), fix_form="gqa_fused",
            )
            continue
        qk, v = heads
        yield ctx.finding(
            f"attention {kind}, instead of a fused attention kernel; its q/k head size ({qk}) differs from its v head "
            f"size ({v}), as in multi-head latent attention (MLA): GroupQueryAttention has one head_size for q, k and "
            f"v, so it can run this attention only with V zero-padded to {qk} per head and its output sliced back "
            f"to {v}; com.microsoft.MultiHeadAttention takes a v_hidden_size of its own",
            node=node, graph=graph, layer=layer, related=related, fix=gqa_fix(ctx, MLA_FIX),
            properties={"qk_head_size": qk, "v_head_size": v, "gqa_expresses_directly": False},
        )


def _unfused_attention(ctx: RuleContext, graph: Graph):
    """(what the attention is, the node to point at, its layer, related nodes) per unfused attention site:
    decomposed cores one per layer (every one outside the layers), K/V-expanding fused kernels one per node."""
    expect = ctx.expect
    cores_by_layer: dict[int | None, list] = defaultdict(list)
    for core in attention_cores(graph):
        cores_by_layer[core.layer].append(core)
    for layer, cores in sorted(cores_by_layer.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        repeated = " with K/V repeated to every query head" if any(c.repeat_kv for c in cores) else ""
        for core in cores if layer is None else cores[:1]:
            mla = (core.qk_head_size, core.v_head_size) if core.v_head_differs else None
            # Heads as the graph shows them (its projections over the head size); a config's are never stated
            # as the graph's (gqa-config-mismatch compares the two).
            found = decomposed_heads(graph, core.softmax)
            heads = (f" ({found.q_heads} q heads share {found.kv_heads} kv heads: {found.how})"
                     if found is not None and found.kv_heads < found.q_heads else "")
            yield (f"decomposed into MatMul -> Softmax -> MatMul{repeated}{heads}", core.softmax, layer,
                   [n for c in cores for n in c.nodes], mla)
    for node in fused_attention_nodes(graph):
        if node.op_type == "GroupQueryAttention" or node.op_type not in ("MultiHeadAttention", "Attention"):
            continue
        shown = any(kv_expanded(graph, node.input(i)) for i in (1, 2))
        if node.domain == DEFAULT_DOMAIN and node.op_type == "Attention":
            q, kv = node.int_attr("q_num_heads"), node.int_attr("kv_num_heads")
            shown = shown or (q is not None and kv is not None and kv < q)
        if shown:
            yield ((f"computed by {node.key} while kv heads < q heads: K/V are expanded to every query head, where "
                   "GroupQueryAttention reads each kv head once per group"), node, node.layer, [], None)
        elif expect.gqa_expected:
            q_heads, kv_heads = expect.num_heads, expect.kv_num_heads
            assert q_heads is not None and kv_heads is not None  # gqa_expected: both are known
            declared = (f"{_declarer(q_heads)} {q_heads.value} q heads and {kv_heads.value} kv heads"
                        if q_heads.origin == kv_heads.origin else
                        f"{_declarer(q_heads)} {q_heads.value} q heads and {_declarer(kv_heads)} {kv_heads.value} kv heads")
            yield ((f"computed by {node.key}, whose K/V the graph does not show expanded, while {declared}: if the "
                    "model has fewer kv heads, K/V are expanded to every query head before it, where "
                    "GroupQueryAttention reads each kv head once per group"), node, node.layer, [], None)


def _declarer(expected) -> str:
    """Who states a head count: the policy, genai_config.json (never the graph: those are read from it)."""
    return {"policy": "the policy declares", "genai_config": "genai_config.json declares"}.get(
        expected.origin, "the graph suggests")


@rule("OGF003", "fusedmatmul-missing", Severity.WARNING, needs=("optimized",))
def fusedmatmul_missing(ctx: RuleContext):
    """The optimized dump still has MatMuls that ORT's EXTENDED level folds into com.microsoft FusedMatMul.

    ## What it checks
    Only the optimized dump (`--optimized`, the file ORT writes for `optimized_model_filepath`): a MatMul
    fed by a Transpose that swaps its last two axes, or whose only consumer is a Mul/Div by a scalar
    constant. At ORT_ENABLE_EXTENDED and above, ORT folds both into FusedMatMul (transA/transB, alpha), so
    finding them means the dump was made below EXTENDED, or with those fusions disabled
    (`optimization.disable_specified_optimizers`), or for a provider/dtype FusedMatMul has no kernel for.

    ## Why it costs throughput
    Each leftover Transpose is a full copy of an activation (attention's K^T on every layer and every
    token), and each scale is one more elementwise kernel. FusedMatMul reads the operand transposed and
    scales in the GEMM epilogue, for free.

    ## Bad
    ```onnx optimized
    <ir_version: 10, opset_import: ["" : 21]>
    scores (float[1, 4, T, 16] q, float[1, 4, S, 16] k) => (float[1, 4, T, S] s)
    <float scale>
    {
      kt = Transpose<perm = [0, 1, 3, 2]>(k)
      qk = MatMul(q, kt)
      s = Div(qk, scale)
    }
    ```

    ## Good
    ```onnx optimized
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    scores (float[1, 4, T, 16] q, float[1, 4, S, 16] k) => (float[1, 4, T, S] s)
    {
      s = com.microsoft.FusedMatMul<transB = 1, alpha = 0.25>(q, k)
    }
    ```

    ## Fix
    Create the session with `graph_optimization_level = ORT_ENABLE_ALL` (or at least EXTENDED), do not
    disable MatMulScaleFusion / MatmulTransposeFusion, and dump again to confirm.
    """
    graph = ctx.optimized
    if graph is None:
        return
    for node in graph.by_op_type("MatMul"):
        reasons = []
        for i, side in ((0, "A"), (1, "B")):
            t = graph.producer(node.input(i))
            if t is None or t.domain != DEFAULT_DOMAIN or len(graph.consumers(t.outputs[0])) != 1:
                continue
            if t.op_type == "Transpose" and _swaps_last_two(t):
                reasons.append(f"Transpose {t.display_name} on input {side} (transpose of the last two axes)")
            elif _is_scalar_scale(graph, t):
                reasons.append(f"scalar {t.op_type} {t.display_name} on input {side}")
        consumers = graph.consumers(node.outputs[0]) if node.outputs else []
        if len(consumers) == 1 and _is_scalar_scale(graph, consumers[0], of=node.outputs[0]):
            reasons.append(f"scalar {consumers[0].op_type} {consumers[0].display_name} after it")
        if reasons:
            yield ctx.finding(
                f"MatMul with {' and '.join(reasons)} left unfused: ORT_ENABLE_EXTENDED folds this into "
                "com.microsoft.FusedMatMul, so the dump was made below EXTENDED or with the fusion disabled",
                node=node, graph=graph,
                fix="Optimize at ORT_ENABLE_ALL (at least ORT_ENABLE_EXTENDED) and re-dump.",
            )


def _is_scalar_scale(graph: Graph, node: Node, of: str | None = None) -> bool:
    """Mul(x, c) / Mul(c, x) / Div(x, c) with a scalar constant c (of `of`, when given)."""
    if node.domain != DEFAULT_DOMAIN or node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return False
    x, c = node.inputs
    if node.op_type == "Mul" and graph.scalar(x) is not None:
        x, c = c, x
    return (of is None or x == of) and graph.scalar(c) is not None


def _swaps_last_two(node: Node) -> bool:
    perm = node.attr("perm")
    if not perm or len(perm) < 2:
        return False
    rank = len(perm)
    return list(perm[:-2]) == list(range(rank - 2)) and list(perm[-2:]) == [rank - 1, rank - 2]


