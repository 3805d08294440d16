"""Inventory rules (OGM): what the graph holds, counted, against what the policy declares: layer counts, ops it
requires by explicit count, ops it forbids."""

from __future__ import annotations

from ortgate.config.expectations import POLICY
from ortgate.findings import Severity
from ortgate.graph.index import Graph, op_key, parse_op_key
from ortgate.graph.patterns.attention import attention_cores, fused_attention_nodes
from ortgate.graph.patterns.moe import moe_blocks
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext


def _count_mismatch(ctx: RuleContext, key: str, what: str, graph: Graph, found: int, detail: str):
    """The finding when the graph's count of `what` differs from the declared `key`, else nothing."""
    expected = ctx.expect.declared(key)
    if expected is None or not isinstance(expected.value, int) or found == expected.value:
        return
    where = expected.location.key_path if expected.location and expected.location.key_path else f"model.{key}"
    declarer = "the policy" if expected.origin == POLICY else "genai_config.json"
    yield ctx.finding(
        f"{declarer} and the graph disagree on {what}: {expected.describe()} ({where}), {graph.path} has {found} "
        f"({detail})",
        location=expected.location,
        fix=f"Correct {where} if it describes another model than this one; re-export if the graph lost {what}.",
        properties={"expected": expected.value, "found": found},
    )


@rule("OGM008", "moe-layer-count-mismatch", Severity.ERROR)
def moe_layer_count_mismatch(ctx: RuleContext):
    """The graph has another number of MoE layers than the policy's `model.moe_layers`.

    ## What it checks
    MoE layers in the exported model, fused com.microsoft MoE / QMoE nodes and MoE blocks computed with standard
    ops alike, against the policy's `model.moe_layers`. The finding says both numbers and how the graph's count
    splits up. A layer the graph has but computes with standard ops is moe-not-fused's; here the count differs.

    ## Why it costs throughput
    Either the export lost or duplicated layers (a different model, whose speed means nothing), or the policy
    describes another model than the one it gates, and every check judged against it is off too. Re-exporting
    cannot fix a policy that counts 48 MoE layers on a 4-layer graph.

    ## Bad
    ```yaml
    model: {moe_layers: 48}   # the model has 2 com.microsoft.MoE nodes
    ```

    ## Good
    ```yaml
    model: {moe_layers: 2}
    ```

    ## Fix
    Correct `model.moe_layers` when the policy describes another model (a tiny test export, another checkpoint);
    re-export when MoE layers are missing from the graph.
    """
    blocks = moe_blocks(ctx.model)
    fused = sum(1 for b in blocks if b.fused is not None)
    detail = f"{fused} fused as com.microsoft MoE/QMoE, {len(blocks) - fused} computed with standard ops"
    yield from _count_mismatch(ctx, "moe_layers", "MoE layers", ctx.model, len(blocks), detail)


@rule("OGM009", "attention-layer-count-mismatch", Severity.ERROR)
def attention_layer_count_mismatch(ctx: RuleContext):
    """The graph has another number of softmax-attention layers than the policy or genai_config.json declares.

    ## What it checks
    Softmax-attention layers in the executed graph (the optimized dump when given, else the model):
    GroupQueryAttention, other fused attention, or decomposed MatMul -> Softmax -> MatMul, one per decoder layer
    (one per node outside the layers), against `model.attention_layers`, else genai_config.json's layer types,
    else `model.layers` minus the linear-attention layers a hybrid model has. Attention the graph has but does not
    compute with GroupQueryAttention is gqa-not-fused's; here the count differs.

    ## Why it costs throughput
    Either the export lost attention layers (a different model, whose speed means nothing), or the policy
    describes another model than the one it gates (a hybrid model has fewer softmax layers than layers), and every
    check judged against it is off too.

    ## Bad
    ```yaml
    model: {layers: 2, attention_layers: 8}   # the model has 2 GroupQueryAttention layers
    ```

    ## Good
    ```yaml
    model: {layers: 2, attention_layers: 2}
    ```

    ## Fix
    Correct `model.attention_layers` (or `model.layers`) when the policy describes another model; re-export when
    attention layers are missing from the graph.
    """
    graph = ctx.executed
    sites: dict[str, set] = {"GroupQueryAttention": set(), "other fused attention": set(), "decomposed": set()}
    for node in fused_attention_nodes(graph):
        kind = "GroupQueryAttention" if node.op_type == "GroupQueryAttention" else "other fused attention"
        sites[kind].add(node.layer if node.layer is not None else f"node {node.index}")
    for core in attention_cores(graph):
        sites["decomposed"].add(core.layer if core.layer is not None else f"node {core.softmax.index}")
    found = set().union(*sites.values())
    detail = ", ".join(f"{len(v)} {k}" for k, v in sites.items() if v) or "none found"
    yield from _count_mismatch(ctx, "attention_layers", "softmax-attention layers", graph, len(found), detail)


@rule("OGM010", "required-ops", Severity.ERROR)
def required_ops(ctx: RuleContext):
    """The graph has fewer nodes of an op than `model.required_ops` demands.

    ## What it checks
    Node counts per (domain, op_type) in the executed graph (the optimized dump when given, else the model)
    against the policy's explicit minimums, e.g. `com.microsoft.MoE: 40`. Keys are `[domain.]op_type`; no domain
    means the ONNX domain. Subgraph nodes count.

    ## Why it costs throughput
    An explicit inventory is the bluntest guard against a re-export that silently lost a fusion: one
    layer exported without its `GroupQueryAttention` still runs, slower, and still produces the right
    numbers.

    ## Bad
    ```yaml
    model:
      required_ops: {com.microsoft.MoE: 48}   # the model has 2: the others fell back to standard ops, or were lost
    ```

    ## Good
    ```yaml
    model:
      required_ops: {com.microsoft.MoE: 2, com.microsoft.GroupQueryAttention: 2}
    ```

    ## Fix
    Re-export the model so that every layer has the fused op, or correct the count in the policy when the
    architecture changed (hybrid models have fewer attention layers than layers).
    """
    graph = ctx.executed
    for key, expected in sorted((ctx.expect.required_ops or {}).items()):
        domain, op_type = parse_op_key(key)
        found = graph.count(domain, op_type)
        if found < expected.value:
            yield ctx.finding(
                f"{found} {op_key(domain, op_type)} node{'s' if found != 1 else ''} in {graph.path}; "
                f"the policy requires at least {expected.value}",
                location=expected.location,
                fix=f"Re-export so every layer has its {op_type} node, or correct model.required_ops.",
                properties={"op": op_key(domain, op_type), "expected": expected.value, "found": found},
            )


MAX_FORBIDDEN_NODES = 20  # findings per forbidden op; the rest are counted in the last one


@rule("OGM011", "forbidden-op", Severity.ERROR)
def forbidden_op(ctx: RuleContext):
    """The graph holds an op that the policy's `model.forbidden_ops` bans.

    ## What it checks
    Every node of the executed graph (the optimized dump when given, else the model) whose (domain, op_type) is
    listed in the policy's `model.forbidden_ops`, e.g. `MemcpyToHost`, `Loop`, `NonZero`. Keys are
    `[domain.]op_type`; no domain means the ONNX domain. One finding per node, at most 20 per op: the last one
    counts the rest.

    ## Why it costs throughput
    A team bans an op because it knows what it costs on its deployment: a Memcpy is a device round trip, a Loop
    blocks CUDA graph capture, a NonZero syncs the host. The ban keeps a re-export from bringing it back unseen.

    ## Bad
    ```yaml
    model: {forbidden_ops: [NonZero]}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    dispatch (bool[T, 4] routed) => (int64[2, N] token_expert)
    {
      token_expert = NonZero(routed)     # an expert loop's dispatch: a host sync at every token
    }
    ```

    ## Good
    ```yaml
    model: {forbidden_ops: [NonZero]}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    dispatch (float[T, 4] probs) => (float[T, 2] weights, int64[T, 2] experts)
    <int64[1] k = {2}>
    {
      weights, experts = TopK(probs, k)
    }
    ```

    ## Fix
    Remove the op from the graph (re-export), or drop it from model.forbidden_ops.
    """
    graph = ctx.executed
    for key in ctx.expect.forbidden_ops or []:
        domain, op_type = parse_op_key(key)
        nodes = graph.by_op(domain, op_type)
        shown = nodes[:MAX_FORBIDDEN_NODES]
        for i, node in enumerate(shown):
            more = len(nodes) - len(shown) if i == len(shown) - 1 else 0
            yield ctx.finding(
                f"{node.key} is forbidden by the policy (model.forbidden_ops)"
                + (f"; {more} more {op_key(domain, op_type)} nodes are not listed" if more else ""),
                node=node, graph=graph,
                fix=f"Remove {op_type} from the graph (re-export), or drop it from model.forbidden_ops.",
                properties={"op": op_key(domain, op_type), "more": more} if more else None,
            )
