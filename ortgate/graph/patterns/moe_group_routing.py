"""Sigmoid, bias-corrected and group-limited routing (DeepSeek-V3's `noaux_tc`, GLM-4.5-MoE) as the pair ORT 1.32
computes it: com.microsoft.MoEGroupRouter, then com.microsoft.MoE (knowledge/ort_group_router.json).

MoEGroupRouter writes log(sigmoid(logits)) at the experts it picks and a sentinel elsewhere; MoE's softmax over that
row weights each picked expert by its sigmoid score divided by the sum of the picked scores. So the pair computes a
router whose weights are the picked *unbiased* sigmoid scores, renormalised to sum to 1, optionally times a constant
(the routed scaling factor, written as one Mul after the MoE). Anything else (weights that are not renormalised, the
bias-corrected scores as weights, a mask that is not -inf) is refused with the reason.

The graph read (torch.onnx of transformers' DeepSeek-V3 / GLM-4.5-MoE router):

    s = Sigmoid(logits); b = Add(s, bias[E])                       # bias optional
    groups = TopK(ReduceSum(TopK(Reshape(b, [-1, G, E/G]), g)[0], -1), topk_group)[1]
    masked = Where(Not(mask(groups)), -inf, b)                     # absent without groups
    idx = TopK(masked, k)[1]; w = GatherElements(s, idx)           # or TopK(s, k)[0] with neither
    w = w / ReduceSum(w)  [* scale]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ortgate.graph.index import Graph, Node
from ortgate.graph.patterns.common import producer_through, skip_back
from ortgate.graph.patterns.moe import RoutingForm, sum_of_weights
from ortgate.graph.patterns.moe_anatomy import (
    _CAST_VIEWS,
    MoeAnatomy,
    _read_experts,
    _Refuse,
    const_floats,
    const_ints,
    rewrite_refusal,
)
from ortgate.knowledge.group_router import group_router_facts

_VIEWS = _CAST_VIEWS  # the rewrite's exact casts (no Q/DQ: see moe_anatomy)


@dataclass(frozen=True)
class GroupRouting:
    """What MoEGroupRouter + MoE need to compute one block's routing."""

    logits: str  # the router projection's output, [.., E]
    bias: str | None  # the [E] correction bias initializer (None: no bias)
    n_group: int
    topk_group: int
    group_topk: int
    top_k: int
    scale: float  # the routed scaling factor (1.0: none)
    weights: str  # the value the experts' outputs are weighted by (renormalised, scaled)
    indices: str  # the top-k expert indices


class NotExpressed(Exception):
    """The block's routing is not what MoEGroupRouter + MoE compute; the message says why."""


# Routing forms MoEGroupRouter + MoE may compute (sigmoid scores, a correction bias, expert groups).
GROUP_FORMS = (RoutingForm.SIGMOID_TOPK, RoutingForm.SIGMOID_GROUP_TOPK, RoutingForm.GROUP_TOPK)


@dataclass(frozen=True)
class GroupVerdict:
    """Whether `ortgate fix` writes block `a` as MoEGroupRouter + MoE for a deployment's release, and if not why."""

    anatomy: MoeAnatomy | None  # the block read with this routing (its experts too), when it is written
    group: GroupRouting | None
    reason: str | None  # why not, when not
    expressible: bool  # the pair computes this routing (on a release that has MoEGroupRouter)


def group_verdict(graph: Graph, a: MoeAnatomy, release: str | None) -> GroupVerdict | None:
    """The verdict for a block com.microsoft.MoE alone cannot express because of its sigmoid / bias-corrected /
    group-limited routing, on onnxruntime `release` (the policy's; None: not named); None for any other block."""
    verdict = rewrite_refusal(a)
    if verdict.rewritable or verdict.expressible or a.routing not in GROUP_FORMS:
        return None
    why = verdict.reason or ""
    router = group_router_facts()
    try:
        group = read_group_routing(graph, a)
    except NotExpressed as exc:
        return GroupVerdict(None, None, f"{why}; {router.op_type} + MoE ({router.first_release} on) cannot express "
                                        f"it either: {exc}", False)
    if not router.available(release):
        named = (f"the deployment's onnxruntime {release} (the policy's execution_provider.onnxruntime_version) has "
                 "no such op" if release else "the policy names no onnxruntime release (execution_provider."
                 f"onnxruntime_version): set it to {router.first_release} or later to have it rewritten")
        return GroupVerdict(None, group, f"{why}; com.microsoft.{router.op_type}, which ONNX Runtime "
                                         f"{router.first_release} adds, computes it with MoE, but {named}", True)
    anatomy = replace(a, refusal=None, expressible=True, experts=[], logits=group.logits, weights=group.weights,
                      indices=group.indices, normalize=True)
    try:
        _read_experts(graph, anatomy)
    except _Refuse as exc:
        return GroupVerdict(None, group, f"routing expressible as {router.op_type} + MoE, but: {exc}", True)
    return GroupVerdict(anatomy, group, None, True)


def read_group_routing(graph: Graph, a: MoeAnatomy) -> GroupRouting:
    """The group routing of block `a`, or NotExpressed with the reason."""
    block = a.block
    topk, router = block.topk, block.router
    if topk is None or router is None:
        raise NotExpressed("no TopK picks the experts")
    experts = block.experts
    if not experts:
        raise NotExpressed("the router's expert count is unknown")
    k = _constant_k(graph, topk)
    if k is None:
        raise NotExpressed("k of the expert TopK is not a constant")
    if k <= 0 or k > experts:
        raise NotExpressed(f"the expert TopK picks k={k} of {experts} experts: no MoE node has such a k")
    if not topk.attr("largest", 1) or not _last_axis(graph, topk, topk.input(0)):
        raise NotExpressed("the expert TopK is not the largest-k over the expert axis")
    ranked = _skip(graph, topk.input(0))
    n_group, topk_group, group_topk = 1, 1, 1
    node = graph.producer(ranked)
    if node is not None and node.op_type == "Where":
        biased, (n_group, topk_group, group_topk) = _group_mask(graph, node, experts)
    else:
        biased = ranked
    sigmoid, bias = _scores(graph, biased)
    logits = sigmoid.input(0)
    if _skip(graph, logits) != router.outputs[0] and producer_through(graph, logits, _VIEWS) is not router:
        raise NotExpressed("the sigmoid does not read the router projection's output")
    scores = sigmoid.outputs[0]
    weights = _picked_scores(graph, topk, scores, ranked)
    weights = _renormalised(graph, weights, k)
    weights, scale = _scaled(graph, weights)
    return GroupRouting(logits, bias, n_group, topk_group, group_topk, k, scale, weights, topk.outputs[1])


def _skip(graph: Graph, value: str) -> str:
    return skip_back(graph, value, _VIEWS)


def _constant_k(graph: Graph, topk: Node) -> int | None:
    values = const_ints(graph, topk.input(1)) if topk.input(1) else None
    return int(values[0]) if values and len(values) == 1 else None


def _last_axis(graph: Graph, node: Node, value: str) -> bool:
    axis = node.attr("axis", -1)
    if axis == -1:
        return True
    shape = graph.shape(value)
    return shape is not None and axis == len(shape) - 1


def _group_mask(graph: Graph, where: Node, experts: int) -> tuple[str, tuple[int, int, int]]:
    """Where(Not(group mask), -inf, biased): the biased scores and (n_group, topk_group, group_topk)."""
    fill = const_floats(graph, where.input(1))
    if not fill or len(set(fill)) != 1 or fill[0] != float("-inf"):
        what = f"{fill[0]:g}" if fill and len(set(fill)) == 1 else "a value that is not a constant"
        raise NotExpressed(f"the experts outside the chosen groups are masked with {what}, not -inf: an expert of "
                           "another group can still be picked, which MoEGroupRouter never does")
    biased = where.input(2)
    # The group choice: TopK(ReduceSum(TopK(Reshape(biased, [-1, G, E/G]), g)[0], -1), topk_group)[1].
    group_topks = [n for n in graph.consumers(biased) if n.op_type == "Reshape"]
    for reshape in group_topks:
        dims = const_ints(graph, reshape.input(1))
        if not dims or len(dims) < 2 or dims[-1] <= 0 or dims[-2] * dims[-1] != experts:
            continue
        n_group = dims[-2]
        inner = [c for c in graph.consumers(reshape.outputs[0]) if c.op_type == "TopK"]
        if len(inner) != 1 or not inner[0].attr("largest", 1) or not _last_axis(graph, inner[0], reshape.outputs[0]):
            continue
        group_topk = _constant_k(graph, inner[0])
        sums = [c for c in graph.consumers(inner[0].outputs[0]) if c.op_type == "ReduceSum"]
        if group_topk is None or len(sums) != 1:
            continue
        axes = const_ints(graph, sums[0].input(1)) if len(sums[0].inputs) > 1 and sums[0].input(1) else None
        if axes not in ((-1,), (2,)):
            raise NotExpressed("the group scores are not summed over each group's top values")
        outer = [c for c in graph.consumers(sums[0].outputs[0]) if c.op_type == "TopK"]
        if len(outer) != 1 or not outer[0].attr("largest", 1):
            raise NotExpressed("the groups are not chosen by a largest-k TopK over their scores")
        topk_group = _constant_k(graph, outer[0])
        if topk_group is None or not 0 < topk_group <= n_group:
            raise NotExpressed(f"the group TopK's k ({topk_group}) is not a constant in 1..{n_group}")
        if not _mask_reads(graph, where.input(0), outer[0].outputs[1]):
            raise NotExpressed("the Where's mask is not built from the chosen groups")
        return biased, (n_group, topk_group, max(1, min(group_topk, experts // n_group)))
    raise NotExpressed("the masked scores are not limited to expert groups chosen by the sum of each group's top "
                       "scores (DeepSeek-V3's group selection)")


def _mask_reads(graph: Graph, mask: str, groups: str, depth: int = 10) -> bool:
    """Whether `mask` is true exactly at the experts outside the chosen groups: ScatterElements(zeros, chosen groups,
    ones), through views and an odd number of negations (Not, Equal to 0)."""
    value = mask
    negated = False
    for _ in range(depth):
        node = graph.producer(value)
        if node is None:
            return False
        if node.op_type == "ScatterElements":
            zeros, ones = _fill(graph, node.input(0)), _fill(graph, node.input(2))
            return node.input(1) == groups and negated and zeros == 0.0 and ones is not None and ones != 0.0
        if node.op_type == "Not":
            negated = not negated
        elif node.op_type == "Equal":
            other = [i for i in node.inputs if graph.is_constant(i)]
            if len(other) != 1 or const_floats(graph, other[0]) != (0.0,):
                return False
            negated = not negated
            value = next(i for i in node.inputs if not graph.is_constant(i))
            continue
        elif node.op_type not in ("Cast", "Reshape", "Expand", "Unsqueeze", "Identity"):
            return False
        value = node.input(0)
    return False


def _fill(graph: Graph, value: str) -> float | None:
    """The one value a constant, ConstantOfShape or Expand of a scalar fills a tensor with."""
    node = graph.producer(value)
    if node is not None and node.op_type == "ConstantOfShape":
        attr = node.attr("value")
        values = getattr(attr, "values", None) if attr is not None else (0.0,)
        return float(values[0]) if values and len(set(values)) == 1 else None
    if node is not None and node.op_type == "Expand":
        return _fill(graph, node.input(0))
    values = const_floats(graph, value)
    return values[0] if values and len(set(values)) == 1 else None


def _scores(graph: Graph, biased: str) -> tuple[Node, str | None]:
    """The Sigmoid of the scores and the bias initializer added to them (None: none)."""
    node = producer_through(graph, biased, _VIEWS)
    if node is not None and node.op_type == "Sigmoid":
        return node, None
    if node is None or node.op_type != "Add":
        raise NotExpressed(f"the ranked scores are the output of {node.op_type if node else 'a graph input'}, not "
                           "sigmoid(logits) (+ a bias)")
    constant = [i for i in node.inputs if graph.is_constant(i)]
    other = [i for i in node.inputs if not graph.is_constant(i)]
    sigmoid = producer_through(graph, other[0], _VIEWS) if len(other) == 1 else None
    if len(constant) != 1 or sigmoid is None or sigmoid.op_type != "Sigmoid":
        raise NotExpressed("the ranked scores are not sigmoid(logits) plus a constant bias")
    bias = constant[0]
    if bias not in graph.initializers:
        raise NotExpressed("the correction bias is not an initializer")
    dims = graph.initializers[bias].dims
    width = 1
    for d in dims:
        width *= d
    experts = graph.shape(biased)
    if len([d for d in dims if d != 1]) > 1 or (experts and isinstance(experts[-1], int) and width != experts[-1]):
        raise NotExpressed(f"the correction bias has shape {list(dims)}, not one value per expert")
    return sigmoid, bias


def _picked_scores(graph: Graph, topk: Node, scores: str, ranked: str) -> str:
    """The picked experts' unbiased sigmoid scores: GatherElements(sigmoid, indices), or the TopK's values when it
    ranks the sigmoid itself."""
    gathers = [c for c in graph.consumers(topk.outputs[1]) if c.op_type == "GatherElements"]
    for gather in gathers:
        if not _last_axis(graph, gather, gather.input(0)):
            raise NotExpressed("the routing weights are gathered along another axis than the experts'")
        source = _skip(graph, gather.input(0))
        if source == scores:
            return gather.outputs[0]
        raise NotExpressed("the routing weights are gathered from the bias-corrected scores: MoEGroupRouter's "
                           "weights are the scores without the bias")
    if _skip(graph, ranked) == scores and graph.consumers(topk.outputs[0]):
        return topk.outputs[0]
    raise NotExpressed("the routing weights are not the picked experts' sigmoid scores")


def _renormalised(graph: Graph, weights: str, k: int) -> str:
    divs = [c for c in graph.consumers(weights) if c.op_type == "Div" and c.input(0) == weights]
    for div in divs:
        if sum_of_weights(graph, div.input(1), lambda r: _skip(graph, r.input(0)) == weights) is not None:
            return div.outputs[0]
    raise NotExpressed(f"the {k} picked sigmoid scores are not renormalised to sum to 1 (norm_topk_prob false): "
                       "com.microsoft.MoE's softmax over MoEGroupRouter's log-scores always divides them by their "
                       "sum, so it would compute another model")


def _scaled(graph: Graph, weights: str) -> tuple[str, float]:
    muls = [c for c in graph.consumers(weights) if c.op_type == "Mul"]
    if len(muls) == 1 and len(graph.consumers(weights)) == 1:
        mul = muls[0]
        other = mul.input(1) if mul.input(0) == weights else mul.input(0)
        factor = const_floats(graph, other)
        if factor is not None and len(factor) == 1:
            return mul.outputs[0], float(factor[0])
        if factor is not None:
            raise NotExpressed("the routing weights are scaled by a tensor, not one routed scaling factor")
    return weights, 1.0
