"""Inventory rules (OGM): what the graph holds, counted, against what the policy declares: layer counts, ops it
requires by explicit count, ops it forbids; a KV cache the graph returns but cannot be given back, and a decoder
with no KV cache at all."""

from __future__ import annotations

from ortgate.config.expectations import POLICY
from ortgate.cost.repairs import RepairKind
from ortgate.findings import Severity
from ortgate.graph.index import Graph, Node, ValueInfo
from ortgate.graph.patterns.attention import attention_cores, fused_attention_nodes
from ortgate.graph.patterns.decoder import cache_outputs, cacheless_decoder, carries_state, token_ids_input
from ortgate.graph.patterns.moe import moe_blocks, moe_misses
from ortgate.knowledge.cache_exports import cache_export, cache_export_otherwise
from ortgate.knowledge.kernels import op_key, parse_op_key
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


@rule("OGM008", "moe-layer-count-mismatch", Severity.ERROR, price=RepairKind.moe)
def moe_layer_count_mismatch(ctx: RuleContext):
    """The graph has another number of MoE layers than the policy's `model.moe_layers`.

    ## What it checks
    MoE layers in the exported model, fused com.microsoft MoE / QMoE nodes and MoE blocks computed with standard
    ops alike, against the policy's `model.moe_layers`. The finding says both numbers and how the graph's count
    splits up. A layer the graph has but computes with standard ops is moe-not-fused's; here the count differs.
    The count is a fact only when every router-like structure (a TopK / ArgMax over a projection's logits) was read
    as an MoE layer: when one was not, and the count read differs, the finding says "could not decide", naming each
    structure not read and why, never a count that contradicts the graph.

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
    blocks, misses = moe_blocks(ctx.model), moe_misses(ctx.model)
    fused = sum(1 for b in blocks if b.fused is not None)
    detail = f"{fused} fused as com.microsoft MoE/QMoE, {len(blocks) - fused} computed with standard ops"
    mismatch = list(_count_mismatch(ctx, "moe_layers", "MoE layers", ctx.model, len(blocks), detail))
    if mismatch and misses:
        # a count is a fact only when every router-like structure was read: say what was not, and why
        expected = ctx.expect.declared("moe_layers")
        where = expected.location.key_path if expected and expected.location and expected.location.key_path else \
            "model.moe_layers"
        yield ctx.undecided(
            f"whether the graph has the {expected.value if expected else '?'} MoE layers {where} declares: "
            f"{len(blocks)} read ({detail}), {len(misses)} router-like structure{'s' if len(misses) != 1 else ''} "
            f"not read: " + "; ".join(m.describe() for m in misses),
            node=misses[0].node, graph=ctx.model,
            properties={"read": len(blocks), "not_read": [m.node.name for m in misses],
                        "reasons": [m.reason for m in misses]},
        )
        return
    yield from mismatch


@rule("OGM009", "attention-layer-count-mismatch", Severity.ERROR, price=RepairKind.attention)
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


@rule("OGM012", "kv-cache-not-fed-back", Severity.ERROR, needs=("kv_cache",))
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
    present = cache_outputs(graph)
    if not present or any(carries_state(i) for i in graph.inputs):
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


@rule("OGM013", "decoder-without-kv-cache", Severity.ERROR)
def decoder_without_kv_cache(ctx: RuleContext):
    """A model deployed as a decoder has no KV cache: every generated token recomputes the whole sequence.

    ## What it checks
    The exported graph's interface: token ids in (`input_ids`), logits over the vocabulary out, and no state
    between steps (no past KV-cache or recurrent-state input, no present output; present outputs without past
    inputs are kv-cache-not-fed-back's). That is what torch.onnx exports with `use_cache=False` and optimum's
    `text-generation` task (without `-with-past`) write. It is an error when the deployment is a decoder: the
    policy's `model.kind: decoder`, or a genai_config.json (onnxruntime-genai runs decoders only). The graph
    alone cannot tell a causal LM from an encoder with a language-modelling head (a masked LM reads input_ids
    and returns logits too): without `model.kind` the rule says it could not decide, and `model.kind: encoder`
    silences it.

    ## Why it costs throughput
    With no cache, a decode step cannot reuse what earlier steps computed: to generate token L+1 the model
    runs again over all L positions, every projection and expert included, so one token costs a prefill of the
    whole context (at a context of 2,048, 2,048 times the compute of a cached step) and a sequence of N tokens
    costs O(N^2). The cost model prices the step that way; a run of such a graph measures a prefill, not a
    decode step. No session setting or fusion repairs it (ORT's attention fusions need a cache to write).

    ## Bad
    ```yaml
    model: {kind: decoder}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    lm (int64[B, T] input_ids) => (float[B, T, 8] logits)
    <float[8, 4] embed_tokens = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
                                  1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1},
     float[4, 8] lm_head = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
                            1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1}>
    {
      hidden = Gather(embed_tokens, input_ids)
      logits = MatMul(hidden, lm_head)
    }
    ```

    ## Good
    ```yaml
    model: {kind: decoder}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    lm (int64[B, T] input_ids, float[B, 2, P, 2] past_key) => (float[B, T, 8] logits, float[B, 2, P, 2] present_key)
    <float[8, 4] embed_tokens = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
                                  1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1},
     float[4, 8] lm_head = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
                            1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1}>
    {
      hidden = Gather(embed_tokens, input_ids)
      logits = MatMul(hidden, lm_head)
      present_key = Identity(past_key)
    }
    ```

    ## Fix
    Re-export with the KV cache: past KV inputs and present outputs (the advice names the call for the exporter
    that made the model: torch.onnx dynamo with `use_cache=True` and the cache among the example inputs,
    optimum's task `text-generation-with-past`, or onnxruntime-genai's builder, which always writes the cache).
    A model that is an encoder: declare `model.kind: encoder`.
    """
    graph = ctx.model
    found = cacheless_decoder(graph)
    if found is None:
        return
    kind = ctx.expect.kind
    interface = (f"{found.tokens} -> {found.logits}"
                 + (f" over {found.vocab:,} tokens" if found.vocab else "")
                 + " with no past KV-cache or state input and no present output")
    if kind is None:
        yield ctx.undecided(
            f"the graph reads {interface}: as a decoder every generated token would recompute the whole sequence, "
            "as an encoder (a masked LM) it needs no cache; the graph cannot tell which: declare model.kind "
            "(decoder or encoder) in the policy", graph=graph,
            properties={"tokens": found.tokens, "logits": found.logits, "vocab": found.vocab})
        return
    if kind.value != "decoder":
        return
    declared = ("the policy declares a decoder (model.kind: decoder)" if kind.origin == POLICY
                else "genai_config.json declares a decoder (onnxruntime-genai runs decoders only)")
    yield ctx.finding(
        f"{declared} but the graph has no KV cache: it reads {interface}, so every generated token recomputes the "
        "whole sequence (a decode step at a context of L positions costs a prefill of L)",
        graph=graph, fix=kv_cache_export_advice(graph),
        properties={"tokens": found.tokens, "logits": found.logits, "vocab": found.vocab,
                    "declared_by": kind.origin},
    )


def kv_cache_export_advice(graph: Graph) -> str:
    """The export that adds a KV cache, for the exporter that made `graph` (every way when it is unknown)."""
    keys = set(graph.early_metadata_keys())
    exporter = cache_export(graph.producer_name, keys)
    if exporter is None:
        return cache_export_otherwise()
    return f"This model was made by {exporter.label}: {exporter.adds_cache}."


# torch.onnx's option that keeps a dim dynamic (torch 2.13: `dynamic_shapes` with torch.export.Dim for the dynamo
# exporter, the default; `dynamic_axes` for the TorchScript one).
_DYNAMIC_SEQUENCE_FIX = (
    "Re-export with the sequence dim dynamic: torch.onnx.export(..., dynamo=True, dynamic_shapes={'input_ids': "
    "{0: torch.export.Dim('batch_size'), 1: torch.export.Dim('sequence_length')}, ...}) (dynamic_axes with the "
    "TorchScript exporter, dynamo=False). When torch.export refuses the dynamic dim (\"tracing inferred a static "
    "shape\"), the model's code depends on the length (a Python loop over the sequence, a shape used as a number): "
    "export a decode step of its own (one token, with its cache or state as inputs) or make that code "
    "length-independent."
)


def _token_input(graph: Graph) -> ValueInfo | None:
    """The decoder's token input: the token ids the embedding reads, else a rank-3 `inputs_embeds`."""
    return token_ids_input(graph) or next(
        (i for i in graph.inputs if "inputs_embeds" in i.name.lower() and i.shape is not None and len(i.shape) == 3),
        None)


def _is_decoder(graph: Graph) -> bool:
    """Logits or a cache out, and no encoder-only input (token_type_ids)."""
    if any("token_type" in i.name.lower() for i in graph.inputs):
        return False
    return (any("logits" in o.name.lower() for o in graph.outputs) or bool(cache_outputs(graph))
            or any(carries_state(i) for i in graph.inputs))


def _made_literal(graph: Graph, symbol: str) -> tuple[Node, tuple[int, ...]] | None:
    """A node that turns the sequence dim into a literal: a Reshape of a value holding it to a constant shape of
    literals only (no 0 or -1: the element count is the example's, whatever the length), or an Expand to a
    constant shape with a literal > 1 where its input has it. (The node, the constant shape.)"""
    for node in graph.by_op_type("Reshape", "Expand"):
        if node.graph is not None or len(node.inputs) < 2:
            continue
        source, target = graph.shape(node.inputs[0]), graph.constant_value(node.inputs[1])
        if not source or not target or symbol not in source or not all(isinstance(t, int) for t in target):
            continue
        if node.op_type == "Reshape":
            if all(t > 0 for t in target):
                return node, tuple(int(t) for t in target)
            continue
        axis = source.index(symbol) + len(target) - len(source)  # broadcast aligns from the right
        if 0 <= axis < len(target) and target[axis] > 1:
            return node, tuple(int(t) for t in target)
    return None


@rule("OGM014", "decode-shape-specialised", Severity.ERROR)
def decode_shape_specialised(ctx: RuleContext):
    """The decoder's sequence length is a literal greater than 1: it cannot run a decode step of one token.

    ## What it checks
    A decoder graph (logits or a KV cache out) whose token input (`input_ids`, or `inputs_embeds`) has a literal
    sequence dim (dim 1) greater than 1, or a symbolic one that a Reshape or Expand to a constant shape turns into
    a literal inside the graph (the exporter baked the example's length into the node).

    ## Why it costs throughput
    Generation feeds one token per step. ORT refuses the input of length 1 (`Got: 1 Expected: 7`), or the baked
    node fails or computes the wrong shape: the model can only ever be run at its example's length, so every
    token recomputes a whole padded window if it can serve at all.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    decoder (int64[1, 7] input_ids) => (float[1, 7, 128] logits)
    <float[128, 128] embed>
    {
      logits = Gather(embed, input_ids)
    }
    ```

    ## Good
    ```onnx
    <ir_version: 10, opset_import: ["" : 21]>
    decoder (int64[batch_size, sequence_length] input_ids) => (float[batch_size, sequence_length, 128] logits)
    <float[128, 128] embed>
    {
      logits = Gather(embed, input_ids)
    }
    ```

    ## Fix
    Re-export with the sequence dim dynamic (torch.onnx.export `dynamic_shapes`, `torch.export.Dim`; `dynamic_axes`
    with the TorchScript exporter), or make the model's code length-independent where torch.export specialises it.
    """
    graph = ctx.model
    token = _token_input(graph)
    if token is None or token.shape is None or not _is_decoder(graph):
        return
    seq = token.shape[1]
    if isinstance(seq, int) and seq > 1:
        yield ctx.finding(
            f"input '{token.name}' has sequence length {seq}, a literal ({list(token.shape)}): a decode step feeds "
            f"one token, which ORT refuses (\"Got: 1 Expected: {seq}\"); the export fixed the dim to its example's",
            graph=graph, fix=_DYNAMIC_SEQUENCE_FIX,
            properties={"input": token.name, "literal": seq, "where": "input", "option": "dynamic_shapes"},
        )
        return
    if isinstance(seq, str):
        made = _made_literal(graph, seq)
        if made:
            node, shape = made
            yield ctx.finding(
                f"input '{token.name}' has a dynamic sequence dim '{seq}', but {node.display_name} "
                f"({node.op_type}) gives a value holding it the constant shape {list(shape)}, the example's: a "
                "decode step of one token fails there or computes the wrong shape",
                node=node, graph=graph, fix=_DYNAMIC_SEQUENCE_FIX,
                properties={"input": token.name, "literal": list(shape), "where": node.name,
                            "option": "dynamic_shapes"},
            )
