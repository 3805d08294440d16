"""Model rules (OGM): MoE routing, GroupQueryAttention configuration and tensor-parallel splits against the policy
and the model family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortgate.config.expectations import Expected
from ortgate.findings import Location, Severity
from ortgate.graph.index import MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.attention import attention_cores, gqa_nodes
from ortgate.graph.patterns.common import find_down, is_op, matmul_weight
from ortgate.graph.patterns.moe import fused_moe_nodes, moe_blocks
from ortgate.graph.patterns.projections import decomposed_heads, gated_mlps, projection_dims
from ortgate.knowledge.contracts import op_contract
from ortgate.knowledge.families import family_labels, family_names, swiglu_parameters_text
from ortgate.knowledge.fusions import attribute_default
from ortgate.knowledge.moe import moe_inputs
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext, layers_text
from ortgate.rules.norms import close, resolved_family

MOE_ROUTING_FIX = (
    "Re-export the MoE nodes with the model's routing: k = num_experts_per_tok, normalize_routing_weights = "
    f"norm_topk_prob (1 for {', '.join(family_labels(lambda f: bool(f.norm_topk_prob)))}), use_sparse_mixer=1 only "
    f"for {', '.join(family_labels(lambda f: bool(f.use_sparse_mixer)))}, activation_type=swiglu for SiLU-gated "
    "experts with activation_alpha / activation_beta / swiglu_limit as the family's "
    f"({swiglu_parameters_text()}). Builders write these from config.json (onnxruntime-genai's builder does). If the policy is "
    "wrong, correct model.top_k / norm_topk_prob / activation / family."
)


def _layers(nodes: list[Node]) -> str:
    text = layers_text(nodes)
    return f" {text}" if text else ""


def _int(value: Any) -> int | None:
    """An integer attribute; None for anything else (a hostile graph may write k as text or a list)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fc3(node: Node) -> str:
    return node.input(moe_inputs(node.op_type).fc3_experts_weights)


@rule("OGM001", "moe-routing-mismatch", Severity.ERROR, needs=("moe",))
def moe_routing_mismatch(ctx: RuleContext):
    """MoE / QMoE routing or activation attributes differ from the policy or the model family.

    ## What it checks
    Every com.microsoft MoE / QMoE node of the exported model (attributes ORT fills in when absent, ORT's schema
    defaults: k=1, normalize_routing_weights=0, activation_type=relu, activation_alpha=1, activation_beta=0):
    - `k` against the policy's `model.top_k` (and the `k` input of TopK in an unfused MoE);
    - `normalize_routing_weights` against the policy's `model.norm_topk_prob`, else the family's
      (ortgate/knowledge/model_families.json), and `use_sparse_mixer` for families routed by a sparse mixer (PhiMoE);
    - the activation against the policy's `model.activation`, else the family's (`swiglu` for gated SiLU experts;
      `activation_type=silu` with fc3 weights is the same math, unmerged), and for SwiGLU the family's
      `activation_alpha`, `activation_beta` and `swiglu_limit` (GPT-OSS: 1.702, 1.0, 7.0).
    The family is the policy's `model.family`, else genai_config.json's `model.type`; an unknown family name is
    reported as undecided. One finding per attribute and value, listing the layers.

    ## Why it costs throughput
    These attributes change what the model computes: a wrong `k` routes each token to too few or too many experts
    (too many costs expert GEMMs on every token), unnormalised weights scale every MoE output, a wrong activation or
    alpha computes a different MLP. Throughput measured on a model that computes something else is no measurement.

    ## Bad
    ```yaml
    model: {family: qwen3_moe, top_k: 8}   # Qwen3-30B-A3B: top-8 routing, norm_topk_prob true
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float16[T, 8] h) => (float16[T, 8] y)
    <float16[8, 4] router_w, float16[4, 32, 8] fc1, float16[4, 8, 16] fc2>
    {
      logits = MatMul(h, router_w)
      y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 0>(
          h, logits, fc1, , fc2)
    }
    ```

    ## Good
    ```yaml
    model: {family: qwen3_moe, top_k: 8}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    moe_layer (float16[T, 8] h) => (float16[T, 8] y)
    <float16[8, 4] router_w, float16[4, 32, 8] fc1, float16[4, 8, 16] fc2>
    {
      logits = MatMul(h, router_w)
      y = com.microsoft.MoE<k = 8, activation_type = "swiglu", swiglu_fusion = 1, normalize_routing_weights = 1,
                            activation_alpha = 1.0, activation_beta = 0.0>(h, logits, fc1, , fc2)
    }
    ```

    ## Fix
    Re-export with the routing from the model's config.json (onnxruntime-genai's builder reads it), or correct the
    policy when it is the policy that is wrong.
    """
    graph = ctx.model
    nodes = fused_moe_nodes(graph)
    topks = [b.topk for b in moe_blocks(graph) if b.fused is None and b.topk is not None]
    if not nodes and not topks:
        return
    unknown = _unknown_family(ctx)
    if unknown is not None:
        yield ctx.undecided(unknown, graph=graph)
    wants = routing_wants(ctx)
    found: dict[tuple[str, Any], tuple[RoutingWant, list[Node]]] = {}
    for node, attr, have in [*((n, a, h) for n in nodes for a, h in _moe_attributes(n, wants)),
                             *((t, "TopK k", graph.scalar(t.input(1))) for t in topks)]:
        want = wants.get("k" if attr == "TopK k" else attr)
        if want is not None and have is not None and not _agrees(attr, have, want.value):
            found.setdefault((attr, have), (want, []))[1].append(node)
    for (attr, have), (want, where) in found.items():
        what = attr if attr == "TopK k" else f"{where[0].key} {attr}"
        yield ctx.finding(
            f"{what}={'absent' if have is _ABSENT else have}{_layers(where)} ({len(where)} "
            f"node{'s' if len(where) > 1 else ''}), but {want.source}: expected {want.value}",
            node=where[0], graph=graph, related=where[1:], fix=MOE_ROUTING_FIX,
            fix_form="moe_swiglu_limit" if attr == "swiglu_limit" and have is _ABSENT else None,
            properties={"attribute": attr, "found": None if have is _ABSENT else have, "expected": want.value,
                        "nodes": len(where)},
        )


@dataclass(frozen=True)
class RoutingWant:
    """What a MoE attribute should be, and who says so (for the message)."""

    value: Any
    source: str


_ABSENT = "absent"  # swiglu_limit not written: the family clamps and the node does not (or the reverse)


def _unknown_family(ctx: RuleContext) -> str | None:
    """Why the family's defaults cannot be used, when the family named is unknown and the policy does not say."""
    name = ctx.expect.value("family")
    if not name or resolved_family(ctx) is not None:
        return None
    if ctx.expect.declared("norm_topk_prob") is not None and ctx.expect.declared("activation") is not None:
        return None
    return (f"model family {name!r} is not in ortgate's model_families.json (known: {', '.join(family_names())}): "
            "normalize_routing_weights and the activation are checked only against the policy's model.norm_topk_prob "
            "and model.activation")


def routing_wants(ctx: RuleContext) -> dict[str, RoutingWant]:
    """Attribute -> its expected value: the policy's model.top_k / norm_topk_prob / activation, else the family's."""
    family = resolved_family(ctx)
    label = f"the {family.name} family" if family else ""
    wants: dict[str, RoutingWant] = {}
    top_k = ctx.expect.declared("top_k")
    if top_k is not None and _int(top_k.value) is not None:
        wants["k"] = RoutingWant(top_k.value, f"{top_k.describe()} (model.top_k)")
    norm = ctx.expect.declared("norm_topk_prob")
    if norm is not None:
        wants["normalize_routing_weights"] = RoutingWant(int(bool(norm.value)), f"{norm.describe()} (model.norm_topk_prob)")
    elif family is not None and family.norm_topk_prob is not None:
        wants["normalize_routing_weights"] = RoutingWant(
            int(family.norm_topk_prob), f"{label} renormalises the top-k weights ({family.source('norm_topk_prob')})")
    activation = ctx.expect.declared("activation")
    if activation is not None:
        wants["activation_type"] = RoutingWant(activation.value, f"{activation.describe()} (model.activation)")
    elif family is not None and family.moe_activation:
        wants["activation_type"] = RoutingWant(family.moe_activation, f"{label} uses {family.moe_activation} experts")
    if family is None:
        return wants
    if family.use_sparse_mixer:
        wants["use_sparse_mixer"] = RoutingWant(
            family.use_sparse_mixer, f"{label} routes with a sparse mixer ({family.source('use_sparse_mixer')})")
    if family.moe_activation == "swiglu":
        for attr, value in (("activation_alpha", family.swiglu_alpha), ("activation_beta", family.swiglu_beta)):
            if value is not None:
                wants[attr] = RoutingWant(value, f"{label} uses {value:g} ({family.source('swiglu_alpha')})")
        limit = family.swiglu_limit
        wants["swiglu_limit"] = RoutingWant(
            limit, f"{label} clamps at {limit}" if limit is not None else f"{label} does not clamp")
    return wants


def _moe_attributes(node: Node, wants: dict[str, RoutingWant]) -> list[tuple[str, Any]]:
    """(attribute, value as ORT reads it) of a MoE / QMoE node, for the attributes `wants` judges. An activation
    the operator's contract does not allow is the contract rule's (op-attribute-value); silu with fc3 is swiglu."""

    def value(attr: str) -> Any:
        have = node.attr(attr)
        return have if have is not None else attribute_default(MS_DOMAIN, node.op_type, attr)

    sparse = _int(value("use_sparse_mixer")) or 0
    act = str(value("activation_type") or "relu")
    out: list[tuple[str, Any]] = [("k", _int(value("k"))), ("use_sparse_mixer", sparse)]
    if not sparse:
        out.append(("normalize_routing_weights", _int(value("normalize_routing_weights")) or 0))
    if act in _allowed_activations(node):
        out.append(("activation_type", "swiglu" if act == "silu" and _fc3(node) else act))
    if act == "swiglu" and "swiglu_limit" in wants:
        out += [("activation_alpha", _float(value("activation_alpha"))), ("activation_beta", _float(value("activation_beta")))]
        limit = _float(node.attr("swiglu_limit"))
        out.append(("swiglu_limit", _ABSENT if limit is None and wants["swiglu_limit"].value is not None else limit))
    return out


def _allowed_activations(node: Node) -> tuple:
    contract = op_contract(MS_DOMAIN, node.op_type, 1)
    attr = contract.attributes.get("activation_type") if contract is not None else None
    return tuple(attr.values) if attr is not None and attr.values else ("relu", "gelu", "silu", "swiglu", "identity")


def _agrees(attr: str, have: Any, want: Any) -> bool:
    if attr == "swiglu_limit" and (have is None or want is None or have is _ABSENT):
        return have is None and want is None
    if isinstance(have, float) or isinstance(want, float):
        return isinstance(have, (int, float)) and isinstance(want, (int, float)) and close(float(have), float(want))
    if attr == "normalize_routing_weights":
        return bool(have) == bool(want)
    return have == want


def _o_proj_width(graph: Graph, node: Node) -> int | None:
    """The input width of the projection reading the attention's output (o_proj), through reshapes and scales."""
    if not node.outputs:
        return None
    o_proj = find_down(graph, node.outputs[0], lambda c, v: matmul_weight(graph, c) is not None and c.input(0) == v,
                       lambda c, v: c.outputs[:1] if is_op(c, "Mul", "Reshape", "Cast", "Transpose", "Identity") else [])
    dims = matmul_weight(graph, o_proj) if o_proj is not None else None
    return dims[0] if dims else None


def gqa_head_size(graph: Graph, node: Node) -> tuple[int | None, str]:
    """A GroupQueryAttention's head size from the graph: KV cache shapes, the query width, or o_proj's input width."""
    nh, kv = node.attr("num_heads"), node.attr("kv_num_heads")
    for value in (node.input(3), node.input(4), *node.outputs[1:3]):
        shape = graph.shape(value) if value else None
        if shape and len(shape) == 4 and isinstance(shape[3], int):
            return shape[3], f"{value} shape"
    if nh:
        query = graph.shape(node.input(0))
        if query and isinstance(query[-1], int):
            heads = nh + 2 * (kv or 0) if not node.input(1) else nh
            if query[-1] % heads == 0:
                return query[-1] // heads, f"query width {query[-1]} / {heads} heads"
        width = _o_proj_width(graph, node)
        if width and width % nh == 0:
            return width // nh, f"o_proj input width {width} / {nh} heads"
    return None, ""


# GroupQueryAttention attribute -> the model-config expectation it must equal.
_GQA_HEAD_ATTRIBUTES = (("num_heads", "num_heads"), ("kv_num_heads", "kv_num_heads"))


@rule("OGM002", "gqa-config-mismatch", Severity.ERROR, needs=("attention",))
def gqa_config_mismatch(ctx: RuleContext):
    """The attention's num_heads, kv_num_heads or head size in the graph differ from the model's config.

    ## What it checks
    Every com.microsoft GroupQueryAttention node of the graph ORT will run (the optimized dump when given, else the
    model): its `num_heads` and `kv_num_heads` attributes and its head size (from the KV cache shapes, the query
    width, or the input width of o_proj) against the policy's `model.num_heads`, `model.kv_num_heads` and
    `model.head_size`, else genai_config.json's `num_attention_heads`, `num_key_value_heads` and `head_size`.
    Decomposed attention too, where the graph shows its heads: the widths of its q and k projections over the head
    size of the first 4-D Reshape after them (or of a packed projection's Split). One finding per attribute and
    value, listing the layers. A GroupQueryAttention head size the graph does not show is reported as undecided.

    ## Why it costs throughput
    Heads that differ from the checkpoint compute a different attention: the wrong number of query groups, a KV
    cache of the wrong width, and a model whose throughput cannot be compared with the one it claims to be. When
    it is the policy that is wrong, every other check judged against it is off too.

    ## Bad
    ```yaml
    model: {num_heads: 16, kv_num_heads: 2}   # the graph's GroupQueryAttention has num_heads=4
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 128] qkv, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Good
    ```yaml
    model: {num_heads: 4, kv_num_heads: 2}
    ```

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
    Re-export with num_heads / kv_num_heads / head size from config.json (num_attention_heads, num_key_value_heads,
    head_dim), or correct the policy's model values when it is the policy that is wrong.
    """
    graph = ctx.executed
    nodes = gqa_nodes(graph)
    mismatches: dict[tuple[str, int], list[Node]] = {}
    how: dict[tuple[str, int], str] = {}
    for node in nodes:
        for attr, key in _GQA_HEAD_ATTRIBUTES:
            want, have = ctx.expect.declared(key), node.int_attr(attr)
            if want is not None and have is not None and have != int(want.value):
                mismatches.setdefault((attr, have), []).append(node)
    head_size = ctx.expect.declared("head_size")
    for node in nodes:
        if head_size is None:
            break
        size, source = gqa_head_size(graph, node)
        if size is None:
            yield ctx.undecided(
                f"the head size of {node.display_name} is not in the graph (no static KV cache or query shape, no "
                f"o_proj behind it) to compare with {head_size.describe()}", graph=graph, node=node)
        elif size != int(head_size.value):
            mismatches.setdefault(("head_size", size), []).append(node)
            how.setdefault(("head_size", size), source)
    for (attr, have), found in mismatches.items():
        want = ctx.expect.declared(attr)
        assert want is not None  # a mismatch is recorded only against a declared value
        shown = f"head size {have} ({how[(attr, have)]})" if attr == "head_size" else f"{attr}={have}"
        yield ctx.finding(
            f"GroupQueryAttention {shown}{_layers(found)} ({_nodes(found)}), but {want.describe()} "
            f"({_expectation_key(want, attr)})",
            node=found[0], graph=graph, related=found[1:],
            fix=f"Re-export with {attr} {want.value} from config.json, or correct the {_expectation_key(want, attr)} "
                f"if the model really has {have}.",
            properties={"attribute": attr, "expected": want.value, "found": have, "nodes": len(found)},
        )
    yield from _decomposed_heads_mismatch(ctx, graph)


_HEAD_WORDS = {"num_heads": "q heads", "kv_num_heads": "kv heads", "head_size": "head size"}


def _decomposed_heads_mismatch(ctx: RuleContext, graph: Graph):
    """Decomposed attention whose heads, as its projections show them, differ from the declared ones."""
    mismatches: dict[tuple[str, int], list[Node]] = {}
    how: dict[tuple[str, int], str] = {}
    for core in attention_cores(graph):
        heads = decomposed_heads(graph, core.softmax)
        if heads is None:
            continue
        for attr, have in (("num_heads", heads.q_heads), ("kv_num_heads", heads.kv_heads),
                           ("head_size", heads.head_size)):
            want = ctx.expect.declared(attr)
            if want is not None and _int(want.value) is not None and have != want.value:
                mismatches.setdefault((attr, have), []).append(core.softmax)
                how.setdefault((attr, have), heads.how)
    for (attr, have), found in mismatches.items():
        want = ctx.expect.declared(attr)
        assert want is not None  # a mismatch is recorded only against a declared value
        key = _expectation_key(want, attr)
        yield ctx.finding(
            f"decomposed attention has {have} {_HEAD_WORDS[attr]}{_layers(found)} ({how[(attr, have)]}), but "
            f"{want.describe()} ({key})",
            node=found[0], graph=graph, related=found[1:],
            fix=f"Correct the {key} to {have} if the export is the model you mean (every check judged against it is "
                f"off), or re-export with {attr} {want.value} from config.json.",
            properties={"attribute": attr, "expected": want.value, "found": have, "nodes": len(found)},
        )


def _nodes(nodes: list[Node]) -> str:
    return f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"


def _expectation_key(expected: Expected, attr: str) -> str:
    """Where an expectation was declared, as its key: model.num_heads, model.decoder.num_attention_heads."""
    if expected.location is not None and expected.location.key_path:
        return expected.location.key_path
    return f"model.{attr}"


@rule("OGM005", "gqa-heads-not-grouped", Severity.ERROR, needs=("attention",))
def gqa_heads_not_grouped(ctx: RuleContext):
    """A GroupQueryAttention's num_heads is not a multiple of its kv_num_heads: the query heads cannot be grouped.

    ## What it checks
    Every com.microsoft GroupQueryAttention node of the graph ORT will run whose `num_heads` and `kv_num_heads` are
    positive integers: `num_heads` must be a multiple of `kv_num_heads` (each kv head serves an equal group of
    query heads). A missing or mistyped attribute is op-attribute-missing's or op-attribute-type's.

    ## Why it costs throughput
    ORT refuses the node at the first run (the kernel checks the grouping). A deployment that cannot start
    measures nothing, and the usual way out is a rollback to an older, slower export.

    ## Bad
    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    attention (float16[1, T, 128] qkv, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
               int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    {
      o, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 3>(
          qkv, , , past_k, past_v, seqlens_k, total_len)
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
    Set num_heads and kv_num_heads on every GroupQueryAttention node from config.json (num_attention_heads,
    num_key_value_heads).
    """
    graph = ctx.executed
    for node in gqa_nodes(graph):
        kv, nh = node.int_attr("kv_num_heads"), node.int_attr("num_heads")
        if kv is not None and nh is not None and nh > 0 and kv > 0 and (kv > nh or nh % kv):
            yield ctx.finding(
                f"GroupQueryAttention num_heads={nh} is not a multiple of kv_num_heads={kv}: the query heads cannot be "
                "grouped over the kv heads, and ORT rejects the node",
                node=node, graph=graph,
                fix="Set kv_num_heads and num_heads from config.json (num_key_value_heads, num_attention_heads).",
                properties={"num_heads": node.attr("num_heads"), "kv_num_heads": node.attr("kv_num_heads")},
            )


@rule("OGM006", "gqa-window-mismatch", Severity.ERROR, needs=("genai_config", "attention"))
def gqa_window_mismatch(ctx: RuleContext):
    """A GroupQueryAttention's local_window_size disagrees with genai_config.json's sliding-window layers.

    ## What it checks
    With genai_config.json's `sliding_window` (window size and the layers that use it), every com.microsoft
    GroupQueryAttention node of the exported model in a decoder layer: sliding-window layers need
    `local_window_size` = the window size, full-attention layers -1 (GPT-OSS alternates the two).

    ## Why it costs throughput
    A sliding layer exported with a full window attends to (and caches) the whole context instead of the window:
    at 32k tokens that is hundreds of times the attention work and KV-cache reads of a 128-token window, and a
    different model. A full layer exported with a window forgets the context.

    ## Bad
    ```json
    {"model": {"type": "gpt_oss", "decoder": {"sliding_window": {"window_size": 128, "layers": [0]}}}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    layer_0 (float16[1, T, 128] qkv, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
             int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    {
      ["/model/layers.0/attn/GroupQueryAttention"] o, present_k, present_v = com.microsoft.GroupQueryAttention<
          num_heads = 4, kv_num_heads = 2, local_window_size = -1>(qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Good
    ```json
    {"model": {"type": "gpt_oss", "decoder": {"sliding_window": {"window_size": 128, "layers": [0]}}}}
    ```

    ```onnx
    <ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
    layer_0 (float16[1, T, 128] qkv, float16[1, 2, P, 16] past_k, float16[1, 2, P, 16] past_v, int32[1] seqlens_k,
             int32[1] total_len) => (float16[1, T, 64] o, float16[1, 2, S, 16] present_k, float16[1, 2, S, 16] present_v)
    {
      ["/model/layers.0/attn/GroupQueryAttention"] o, present_k, present_v = com.microsoft.GroupQueryAttention<
          num_heads = 4, kv_num_heads = 2, local_window_size = 128>(qkv, , , past_k, past_v, seqlens_k, total_len)
    }
    ```

    ## Fix
    Re-export with the model's layer_types / sliding_window (onnxruntime-genai's builder writes
    local_window_size on sliding layers only).
    """
    genai = ctx.inputs.genai
    if genai is None:
        return
    window = genai.decoder.get("sliding_window")
    window_size = _int(window.get("window_size")) if isinstance(window, dict) else None
    sliding = set(genai.sliding_window_layers)
    if window_size is None or not sliding:
        return
    graph = ctx.model
    line = genai.line_of("model", "decoder", "sliding_window")
    for node in gqa_nodes(graph):
        have = _int(node.attr("local_window_size", -1))
        if node.layer is None or have is None:
            continue
        want = window_size if node.layer in sliding else -1
        if have != want:
            kind = "a sliding-window layer" if want != -1 else "a full-attention layer"
            yield ctx.finding(
                f"GroupQueryAttention in layer {node.layer} has local_window_size={have}, but genai_config.json "
                f"(line {line}) makes layer {node.layer} {kind}: expected {want}",
                node=node, graph=graph,
                fix="Re-export with the model's layer_types / sliding_window (onnxruntime-genai's builder writes "
                    "local_window_size on sliding layers only).",
                properties={"local_window_size": have, "expected": want},
            )


def _moe_intermediate(graph: Graph) -> int | None:
    for node in fused_moe_nodes(graph):
        if node.op_type != "MoE":
            continue  # QMoE packs and may prepack its weights: shapes do not say the width plainly
        fc2 = graph.value(node.input(moe_inputs(node.op_type).fc2_experts_weights))
        if fc2 is not None and fc2.shape and len(fc2.shape) == 3 and isinstance(fc2.shape[2], int):
            return fc2.shape[2]
    return None


def _mlp_widths(graph: Graph) -> list[int]:
    widths = set()
    for mlp in gated_mlps(graph):
        if mlp.gate is None:
            continue
        dims = projection_dims(graph, mlp.gate)
        if dims:
            widths.add(dims[-1] // 2 if mlp.merged else dims[-1])
    return sorted(widths)


@rule("OGM004", "tensor-parallel-split", Severity.ERROR)
def tensor_parallel_split(ctx: RuleContext):
    """With `model.tensor_parallel: N`, heads, kv heads, experts or intermediate sizes do not split evenly over N ranks.

    ## What it checks
    Only when the policy declares `model.tensor_parallel` N > 1. Tensor parallelism shards attention by heads and
    the MLP/MoE by intermediate columns (and experts by rank in expert parallelism), so each of these must be a
    multiple of N: `num_heads`, `experts`, `moe_intermediate_size` (policy, else the MoE weights) and the gated MLPs'
    intermediate widths (graph). kv heads split as `max(kv_heads // N, 1)` per rank: N <= kv_heads needs
    kv_heads % N == 0; N > kv_heads replicates each kv head on N / kv_heads ranks, which needs N % kv_heads == 0
    (an even replication is tp-kv-heads-replicated's information). Values come from the policy,
    genai_config.json or the graph, as `ortgate` resolved them; findings point at the policy's `tensor_parallel`
    line.

    ## Why it costs throughput
    An uneven split leaves ranks with different shapes: the sharded runtime refuses it, or pads, and the slowest
    rank sets the pace of every all-reduce.

    ## Bad
    ```yaml
    model: {num_heads: 32, kv_num_heads: 4, experts: 128, tensor_parallel: 6}
    ```

    ## Good
    ```yaml
    model: {num_heads: 32, kv_num_heads: 4, experts: 128, tensor_parallel: 4}
    ```

    ## Fix
    Choose a tensor-parallel degree that divides num_heads, experts and the intermediate sizes (and divides or is a
    multiple of kv_num_heads), or correct the policy's model values.
    """
    tp = _tensor_parallel(ctx)
    if tp is None:
        return
    n, where = tp
    for what, value, origin in _tp_sharded_sizes(ctx):
        why = None
        if what == "kv_num_heads" and n > value:
            if n % value:
                why = f"{n} ranks are more than {value} kv heads but not a multiple of them: no even replication"
        elif value % n:
            why = f"{value} / {n} is not whole"
        if why is not None:
            yield ctx.finding(
                f"{what} {value} ({origin}) does not split over tensor_parallel {n}: {why}",
                location=where,
                fix=f"Use a tensor-parallel degree that divides {what} ({value})"
                    + (" or is a multiple of it" if what == "kv_num_heads" else "") + ", or correct the policy.",
                properties={"value": value, "tensor_parallel": n, "what": what},
            )


def _tensor_parallel(ctx: RuleContext) -> tuple[int, Location | None] | None:
    """(the declared tensor-parallel degree, where), when it is more than 1."""
    tp = ctx.expect.declared("tensor_parallel")
    if tp is None or not isinstance(tp.value, int) or isinstance(tp.value, bool) or tp.value <= 1:
        return None
    return tp.value, tp.location


def _tp_sharded_sizes(ctx: RuleContext) -> list[tuple[str, int, str]]:
    """(what, size, where the size comes from) for every size tensor parallelism shards."""
    expect = ctx.expect
    sizes: list[tuple[str, int | None, str]] = []
    for key in ("num_heads", "experts", "kv_num_heads"):
        expected: Expected | None = getattr(expect, key)
        if expected is not None:
            sizes.append((key, expected.value, expected.describe()))
    if expect.moe_intermediate_size is not None:
        sizes.append(("moe_intermediate_size", expect.moe_intermediate_size.value,
                      expect.moe_intermediate_size.describe()))
    else:
        sizes.append(("moe_intermediate_size", _moe_intermediate(ctx.model), "the MoE weights"))
    sizes += [("intermediate size", w, "a gated MLP's gate projection in the graph") for w in _mlp_widths(ctx.model)]
    return [(what, size, origin) for what, v, origin in sizes if (size := _int(v)) is not None and size > 0]


@rule("OGM007", "tp-kv-heads-replicated", Severity.INFO)
def tp_kv_heads_replicated(ctx: RuleContext):
    """With `model.tensor_parallel: N` above the kv head count, every kv head is replicated on N / kv_heads ranks.

    ## What it checks
    Only when the policy declares `model.tensor_parallel` N > 1 and N is a multiple of the kv head count
    (policy, genai_config.json or graph) and larger than it: each rank holds max(kv_heads // N, 1) = 1 kv head,
    and every kv head lives on N / kv_heads ranks. The finding points at the policy's `tensor_parallel` line.
    (A degree that neither divides nor is a multiple of the kv heads is tensor-parallel-split's error.)

    ## Why it costs throughput
    Replicated kv heads cost memory and KV-cache bandwidth on every rank that holds a copy: the k/v projections
    and the cache are computed and stored N / kv_heads times. It is how the CANN Qwen3-MoE recipe runs (4 kv heads
    over 8 cards), so it is information, not a fault.

    ## Bad
    ```yaml
    model: {num_heads: 32, kv_num_heads: 4, experts: 128, tensor_parallel: 8}   # each kv head on 2 ranks
    ```

    ## Good
    ```yaml
    model: {num_heads: 32, kv_num_heads: 4, experts: 128, tensor_parallel: 4}
    ```

    ## Fix
    Nothing to fix when the replication is intended; a degree up to the kv head count avoids it.
    """
    tp = _tensor_parallel(ctx)
    kv = ctx.expect.kv_num_heads
    heads = _int(kv.value) if kv is not None else None
    if tp is None or kv is None or heads is None or heads <= 0:
        return
    n, where = tp
    if n > heads and n % heads == 0:
        yield ctx.finding(
            f"tensor_parallel {n} > kv_num_heads {heads} ({kv.describe()}): each rank holds max({heads} // {n}, 1) = "
            f"1 kv head, every kv head replicated on {n // heads} ranks (KV cache and k/v projections duplicated)",
            location=where,
            properties={"value": heads, "tensor_parallel": n, "what": "kv_num_heads", "replicas": n // heads},
        )
