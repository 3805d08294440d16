"""Inventory rules (OGM): what the graph holds, counted, against what the policy declares: layer counts, ops it
requires by explicit count, ops it forbids; and a KV cache the graph returns but cannot be given back."""

from __future__ import annotations

import re

from ortgate.config.expectations import POLICY
from ortgate.findings import Severity
from ortgate.graph.index import Graph, ValueInfo, op_key, parse_op_key
from ortgate.graph.patterns.attention import attention_cores, fused_attention_nodes
from ortgate.graph.patterns.moe import moe_blocks
from ortgate.knowledge.dims import dim_kind
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


# A graph output holding a KV cache: named for it (present.N.key, present_key_values, present_value) and of rank 4,
# or a fused attention op's present_key / present_value output.
_PRESENT_NAME = re.compile(r"(^|[._/])present", re.IGNORECASE)
# A graph input that carries state from the previous step: a KV cache, a linear-attention or convolution state.
_STATE_NAME = re.compile(r"past|cache|state|recurrent|conv", re.IGNORECASE)


def _cache_outputs(graph: Graph) -> list[str]:
    by_attention = {name for node in fused_attention_nodes(graph) if node.graph is None
                    for name in node.outputs[1:3] if name}
    return [o.name for o in graph.outputs
            if o.name in by_attention or (_PRESENT_NAME.search(o.name) and o.shape is not None and len(o.shape) == 4)]


def _carries_state(info: ValueInfo) -> bool:
    return bool(_STATE_NAME.search(info.name)) or any(
        isinstance(d, str) and dim_kind(d) == "kv" for d in (info.shape or ()))


@rule("OGM012", "kv-cache-not-fed-back", Severity.ERROR)
def kv_cache_not_fed_back(ctx: RuleContext):
    """The graph returns a KV cache (present tensors) but takes none back: every token recomputes the whole sequence.

    ## What it checks
    The exported graph's outputs that hold a KV cache (rank-4 outputs named `present...`, or a fused attention op's
    present_key / present_value) against its inputs: at least one input must carry state from the previous step
    (a past KV cache, named `past...` / `...cache...` or with a dim that grows during decode, or a linear-attention
    state). A graph with present outputs and no such input was exported for a cache it cannot be given.

    ## Why it costs throughput
    Without the cache as an input, a decode step cannot attend to what earlier steps computed: the runtime (or
    onnxruntime-genai, which refuses such a model) has to run the whole sequence again for every new token, every
    projection and every expert included. The step reads the same weights but computes, and for attention reads,
    L tokens instead of one: at a context of a few thousand tokens that is orders of magnitude per token, and the
    present tensors are written for nothing.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    decoder (float[B, 2, T, 16] k) => (float[B, 2, T, 16] present_key)
    {
      present_key = Identity(k)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    decoder (float[B, 2, T, 16] k, float[B, 2, P, 16] past_key) => (float[B, 2, S, 16] present_key)
    {
      present_key = Concat<axis = 2>(past_key, k)
    }
    ```

    ## Fix
    Re-export with the cache as inputs: optimum's task `text-generation-with-past`, torch.onnx with
    `past_key_values` among the example inputs and their dims dynamic, Olive's conversion with a with-past task;
    onnxruntime-genai's builder always writes them. A model meant for prefill only should not return present tensors.
    """
    graph = ctx.model
    present = _cache_outputs(graph)
    if not present or any(_carries_state(i) for i in graph.inputs):
        return
    shown = ", ".join(present[:4]) + (f" and {len(present) - 4} more" if len(present) > 4 else "")
    yield ctx.finding(
        f"the graph returns {len(present)} KV-cache tensor{'s' if len(present) != 1 else ''} ({shown}) but takes no "
        "cache or state input: the cache cannot be fed back, so every generated token recomputes the whole sequence",
        graph=graph,
        fix="Re-export with the past KV cache as inputs (optimum: task text-generation-with-past; torch.onnx: "
            "past_key_values among the inputs, their sequence dims dynamic).",
        properties={"present_outputs": len(present), "first_outputs": present[:4]},
    )
