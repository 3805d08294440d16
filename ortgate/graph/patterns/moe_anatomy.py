"""What an unfused MoE block computes, read from its graph: the detail a rewrite into com.microsoft.MoE needs.

`moe_blocks` reads a block once (its router, TopK, routing and expert nodes, its expert form, routing form and k).
`moe_anatomies` adds the detail a rewrite needs to each unfused block, from the same graph, metadata only: whether
the top-k weights are renormalised, the tensors the routing hands the experts (weights, indices, logits), the
hidden tensor the experts read, where the routed sum ends, and for every expert its index, the gate / up / down
weights as views of initializers (which initializer, which slice of a stacked one, transposed or not, which
rows of a merged gate_up), and the activation. Forms and k are the block's, never read again here. A block the op
cannot express gets a `refusal` that says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import (
    CAST_OPS,
    QDQ_OPS,
    RESHAPE_OPS,
    cached,
    dequantized_output,
    is_op,
    memo_table,
    producer_through,
    skip_back,
    view_chain,
)
from ortgate.graph.patterns.moe import ExpertForm, MoeBlock, RoutingForm, moe_blocks, sum_of_weights
from ortgate.knowledge.moe_op import moe_op_facts

# Pass-through ops, composed from the one set in common (VIEW_OPS and its parts). A rewrite moves exact values, so
# it never reads through QuantizeLinear / DequantizeLinear (a value up to rounding): a block whose routing passes
# Q/DQ is refused with that reason (`_refusal`), one whose experts read DQ'd weights is refused at the weight.
_CAST_VIEWS = CAST_OPS - QDQ_OPS  # Cast, Identity: before a scorer, between the logits and their consumers
# Between a value and what it means here (a routing weight, a hidden state, an expert output): the views that keep
# every element (a rewrite reads the value whole, so no Gather of some of its entries, no Transpose).
_VIEW_OPS = _CAST_VIEWS | RESHAPE_OPS | frozenset({"Expand"})
# A constant's values read through the views that keep them in order and count.
_CONSTANT_VIEWS = _CAST_VIEWS | (RESHAPE_OPS - {"Flatten"})
_COMBINE_OPS = frozenset({"Add", "ScatterND", "ScatterElements"})
# Views looked through before one particular op: an activation, a projection, gathered rows (the unit-dim reshapes
# each form's export writes there, no more: a Reshape after a projection may split its features).
_ACTIVATION_VIEWS = _CAST_VIEWS | (RESHAPE_OPS & {"Unsqueeze", "Squeeze"})
_PROJECTION_VIEWS = _CAST_VIEWS | (RESHAPE_OPS & {"Squeeze"})
_ROW_VIEWS = _CAST_VIEWS | (RESHAPE_OPS & {"Reshape", "Squeeze"})


@dataclass(frozen=True)
class WeightView:
    """One expert matrix in [out_features, in_features] order, as a view of an initializer.

    The initializer holds a 2-D matrix, or a 3-D stack of experts of which `index` is taken; `transposed` says
    that the (selected) matrix is stored [in, out]; `rows` (start, stop, step) picks out-feature rows after
    orientation (a gate or up half of a merged gate_up projection)."""

    initializer: str
    index: int | None
    transposed: bool
    rows: tuple[int, int, int] | None = None
    bias: tuple[str, int | None] | None = None  # (initializer, index in its [E, N] stack): added to the output

    def describe(self) -> str:
        at = f"[{self.index}]" if self.index is not None else ""
        t = ".T" if self.transposed else ""
        r = f" rows {self.rows[0]}:{self.rows[1]}" + (f":{self.rows[2]}" if self.rows[2] != 1 else "") if self.rows else ""
        return f"{self.initializer}{at}{t}{r}"


@dataclass
class ExpertAnatomy:
    index: int  # the expert's column in the router logits
    up: WeightView  # gated: the linear branch; not gated: fc1
    down: WeightView
    gate: WeightView | None = None  # gated: the branch the activation is applied to
    nodes: list[Node] = field(default_factory=list)


@dataclass
class MoeAnatomy:
    """The rewrite's detail of one unfused `MoeBlock`."""

    block: MoeBlock
    layer: int | None
    normalize: bool = False
    weights: str = ""  # the [tokens, k] routing weights the experts' outputs are scaled by
    indices: str = ""  # the [tokens, k] expert indices they are picked by
    hidden: str = ""  # the [tokens, H] (or [B, S, H]) tensor the experts read
    logits: str = ""  # router logits, [.., E]
    output: str = ""  # the routed sum (same shape as `hidden`)
    combine: Node | None = None  # the node producing `output`
    activation: str = ""  # swiglu (gated SiLU) | silu | gelu | relu | identity
    swiglu: tuple[float, float, float | None] = (1.0, 0.0, None)  # alpha, beta, limit (GPT-OSS: 1.702, 1, 7)
    jitter_eps: float | None = None  # sparsemixer routing: the relative band 2 * eps a pick's softmax runs over
    experts: list[ExpertAnatomy] = field(default_factory=list)
    num_experts: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    refusal: str | None = None  # why the block cannot become one com.microsoft.MoE node
    # False when the refusal is the routing's meaning (sigmoid, group-limited, bias-corrected, capacity, scaled
    # weights), which no com.microsoft.MoE attribute expresses; True when it is this graph's form only.
    expressible: bool = True

    @property
    def anchor(self) -> Node:
        return self.block.anchor

    @property
    def k(self) -> int | None:
        return self.block.k

    @property
    def routing(self) -> RoutingForm:
        return self.block.routing_form

    @property
    def pattern(self) -> str:
        """The unfused form the rewrite replaces: dense_loop | gather_loop | batched_matmul."""
        return self.block.expert_form.rewrite_pattern


def moe_anatomies(graph: Graph) -> list[MoeAnatomy]:
    """One anatomy per unfused MoE block of the main graph (fused blocks have nothing to rewrite)."""

    def compute(g: Graph) -> list[MoeAnatomy]:
        return [_anatomy(g, b) for b in moe_blocks(g) if b.fused is None and b.router is not None
                and (b.topk is not None or b.routing_form is RoutingForm.SPARSEMIXER) and b.router.graph is None]

    return cached(graph, "moe_anatomies", compute)


class _Refuse(Exception):
    pass


class _Inexpressible(_Refuse):
    """The routing computes something com.microsoft.MoE has no attribute for: no rewrite of any form expresses it."""


def _anatomy(graph: Graph, block: MoeBlock) -> MoeAnatomy:
    anatomy = MoeAnatomy(block, block.layer, num_experts=block.experts)
    try:
        if block.zero:
            raise _Inexpressible(
                f"{len(block.zero)} of the router's {block.experts} columns are zero-computation experts (the hidden "
                "state times its routing weight, no projection: LongCat-Flash), which com.microsoft.MoE has no "
                "expert form for: every column it routes to is an FFN of fc1 / fc2")
        qdq = [n for n in block.routing_nodes if n.op_type in QDQ_OPS]
        if qdq:
            raise _Refuse(
                f"the routing passes {len(qdq)} QuantizeLinear / DequantizeLinear node(s) (a QDQ graph, first "
                f"{qdq[0].display_name}): the rewrite reads float routing only")
        if block.weighting == "input":
            raise _Inexpressible(
                "the routing weights scale each expert's input (Llama-4: the tokens times their score, then the "
                "experts), not its output: a gated FFN of s * x is not s times the FFN of x, and com.microsoft.MoE "
                "weights the experts' outputs")
        if block.topk is None:
            _read_sparsemixer(graph, anatomy)
        else:
            _read_routing(graph, anatomy)
        _read_experts(graph, anatomy)
    except _Refuse as why:
        anatomy.refusal = str(why)
        anatomy.expressible = not isinstance(why, _Inexpressible)
    return anatomy


@dataclass(frozen=True)
class RewriteVerdict:
    """Whether `ortgate fix` rewrites one MoE block into com.microsoft.MoE, and if not why (weight-free)."""

    rewritable: bool
    reason: str | None = None  # why not, when not
    expressible: bool = True  # False: no com.microsoft.MoE form computes this routing (not only fix's reading)


def rewrite_refusal(a: MoeAnatomy) -> RewriteVerdict:
    """What the MoE rewrite decides for the block `a`: its anatomy's refusal, or sparsemixer routing, which ORT's CPU
    kernel (the one a rewrite is verified on) does not implement. `ortgate fix` plans from this verdict, and the
    rules that advise it read the same one."""
    if a.refusal is not None:
        return RewriteVerdict(False, a.refusal, a.expressible)
    facts = moe_op_facts()
    mixer = facts.sparse_mixer
    if a.routing == "sparsemixer" and not mixer.cpu_implemented:
        # ORT's CUDA kernel computes it for some expert counts and one jitter eps: there, a CUDA export expresses it.
        on_cuda = (len(a.experts) or a.num_experts) in mixer.cuda_experts and a.jitter_eps is not None and abs(
            a.jitter_eps - mixer.cuda_jitter_eps) <= 1e-6
        return RewriteVerdict(False, sparse_mixer_refusal(a), on_cuda)
    return RewriteVerdict(True)


def block_verdict(graph: Graph, block: MoeBlock) -> RewriteVerdict | None:
    """The rewrite's verdict for `block` of `graph`, or None when the rewrite does not consider it (fused, no
    router, in a subgraph)."""
    return next((rewrite_refusal(a) for a in moe_anatomies(graph) if a.block is block), None)


def sparse_mixer_refusal(a: MoeAnatomy) -> str:
    """Why a sparsemixer block stays as it is: ORT's CPU kernel, the one the rewrite is verified on, routes
    use_sparse_mixer=1 as plain softmax top-k."""
    facts = moe_op_facts()
    mixer = facts.sparse_mixer
    eps = f"{a.jitter_eps:.4g}" if a.jitter_eps is not None else "unknown"
    experts = len(a.experts) or a.num_experts
    differs = ([f"{experts} experts"] if experts not in mixer.cuda_experts else []) + (
        [f"jitter eps {eps}"] if a.jitter_eps is None or abs(a.jitter_eps - mixer.cuda_jitter_eps) > 1e-6 else [])
    cuda = (f"ORT's CUDA kernel implements it only for {' or '.join(map(str, mixer.cuda_experts))} experts with "
            f"jitter eps {mixer.cuda_jitter_eps:g}" + (f"; this block has {' and '.join(differs)}" if differs else ""))
    return (f"sparsemixer routing (PhiMoE, jitter eps {eps}): each of the {mixer.k} picks is weighted by a softmax over "
            f"only the experts within 2 x eps relative distance of it (the first pick masked out of the second), so "
            f"the weights need not sum to 1; com.microsoft.MoE's use_sparse_mixer=1 names this routing, but "
            f"onnxruntime {facts.ort_version}'s CPU kernel ignores it and {mixer.cpu_routes_as}: the rewrite cannot "
            f"be verified equal on CPU ({cuda})")


# ---- constants -------------------------------------------------------------------------------------------------


def const_ints(graph: Graph, value: str) -> tuple[int, ...] | None:
    """Integer values of a small constant (initializer or Constant node, through Cast/Identity), else None."""
    memo = memo_table(graph, "const_ints")
    found = memo.get(value, _UNSET)
    if found is not _UNSET:
        return found
    found = None
    for v in view_chain(graph, value, _CONSTANT_VIEWS):
        values = graph.constant_value(v)
        if values is not None:
            found = tuple(int(x) for x in values) if all(isinstance(x, (int, float)) for x in values) else None
            break
    memo[value] = found
    return found


_UNSET = object()


def const_floats(graph: Graph, value: str) -> tuple[float, ...] | None:
    memo = memo_table(graph, "const_floats")
    if value in memo:
        return memo[value]
    found = None
    for v in view_chain(graph, value, _CONSTANT_VIEWS):
        values = graph.constant_value(v)
        if values is not None:
            found = tuple(float(x) for x in values)
            break
    memo[value] = found
    return found


def _through_views(graph: Graph, value: str, ops=_VIEW_OPS) -> str:
    return skip_back(graph, value, ops)


def _single_consumer_through_views(graph: Graph, value: str) -> tuple[list[Node], str]:
    """Consumers of `value` past pass-through ops, and the value they read."""
    seen = {value}
    while True:
        consumers = graph.consumers(value)
        if len(consumers) == 1 and consumers[0].op_type in _VIEW_OPS and consumers[0].domain == DEFAULT_DOMAIN \
                and consumers[0].outputs and consumers[0].outputs[0] not in seen:
            value = consumers[0].outputs[0]
            seen.add(value)
            continue
        return consumers, value


def _last_axis(graph: Graph, value: str, axis: int | None) -> bool:
    if axis == -1:
        return True
    rank = _rank_of(graph, value)
    return axis is not None and rank is not None and axis == rank - 1


def _shape_length(graph: Graph, value: str) -> int | None:
    """How many dims a shape tensor holds: a constant's length, or the sum over a Concat of 1-element parts
    (Unsqueeze of a scalar, 1-element constants), as exporters build [-1, hidden]."""
    values = graph.constant_value(value)
    if values is not None:
        return len(values)
    node = graph.producer(value)
    if node is None or node.op_type != "Concat":
        return None
    total = 0
    for part in node.inputs:
        known = graph.constant_value(part)
        producer = graph.producer(part)
        if known is not None:
            total += len(known)
        elif producer is not None and producer.op_type == "Unsqueeze" and graph.shape(producer.inputs[0]) in ((), None):
            total += 1
        else:
            return None
    return total


def _rank_of(graph: Graph, value: str) -> int | None:
    """The rank of `value`: declared, else through the ops that keep it (elementwise, Softmax, TopK, MatMul of a
    2-D weight) up to a Reshape with a constant shape or a declared value."""
    seen: set[str] = set()
    while value not in seen:
        seen.add(value)
        shape = graph.shape(value)
        if shape is not None:
            return len(shape)
        node = graph.producer(value)
        if node is None:
            return None
        if node.op_type == "Reshape":
            return _shape_length(graph, node.input(1))
        if node.op_type == "Gemm":
            return 2
        if node.op_type not in ("MatMul", "Softmax", "TopK", "Sigmoid", "Add", "Mul", "Div", "Cast", "Identity",
                                "ReduceSum"):
            return None
        value = node.inputs[0] if node.inputs else ""
    return None


# ---- routing ---------------------------------------------------------------------------------------------------


def _read_routing(graph: Graph, a: MoeAnatomy) -> None:
    block = a.block
    topk = block.topk
    assert topk is not None and block.router is not None
    routing_ops = {n.op_type for n in block.routing_nodes}
    # Expert groups are the block's reading (its routing form), never a count of TopK nodes: transformers' token
    # sort (a TopK over the flattened expert indices, JetMoE, its own exporter) is a second TopK that ranks none.
    _refuse_unexpressible_scores(graph, block, topk.input(0),
                                 groups=block.routing_form in (RoutingForm.GROUP_TOPK, RoutingForm.SIGMOID_GROUP_TOPK))
    if "CumSum" in routing_ops and _token_sort(graph, block) is None:  # a token sort's CumSum is its offsets
        raise _Inexpressible("capacity-limited dispatch (CumSum over expert assignments): com.microsoft.MoE has no "
                      "expert capacity")
    if not topk.attr("largest", 1) or not _last_axis(graph, topk.input(0), topk.attr("axis", -1)):
        raise _Refuse("TopK is not the largest-k over the expert axis")
    if block.k is None:
        raise _Refuse("k of the router's TopK is not a constant")
    experts = block.experts
    if not experts:
        raise _Refuse("the router's expert count is unknown")
    ranked = topk.input(0)
    scorer = producer_through(graph, ranked, _CAST_VIEWS)
    values = topk.outputs[0]
    if scorer is not None and scorer.op_type == "Softmax" and scorer.domain == DEFAULT_DOMAIN:
        if not _last_axis(graph, scorer.input(0), scorer.attr("axis", -1)):
            raise _Refuse("the router's Softmax is not over the expert axis")
        read = RoutingForm.SOFTMAX_TOPK
        a.logits = _logits_value(graph, scorer.input(0), block)
        weights, a.normalize = _renormalised(graph, values)
    elif scorer is not None and scorer.op_type == "Sigmoid":
        raise _Inexpressible("sigmoid scoring: com.microsoft.MoE scores experts with softmax")
    elif scorer is not None and scorer.op_type == "Add":
        raise _Inexpressible("bias-corrected top-k (a bias is added to the expert scores before TopK: DeepSeek-V3 style); "
                      "com.microsoft.MoE ranks the router logits as they are")
    elif _through_views(graph, ranked) == _through_views(graph, block.router.outputs[0]) or _is_router_output(graph, ranked, block):
        consumers, _ = _single_consumer_through_views(graph, values)
        softmax = consumers[0] if len(consumers) == 1 and consumers[0].op_type == "Softmax" else None
        if softmax is None or not _last_axis(graph, softmax.input(0), softmax.attr("axis", -1)):
            raise _Refuse("top-k over raw logits without a Softmax over the chosen k: the weights are not the "
                          "softmax probabilities com.microsoft.MoE uses")
        read = RoutingForm.TOPK_SOFTMAX
        a.logits = _logits_value(graph, ranked, block)
        weights, a.normalize = softmax.outputs[0], True
    else:
        what = scorer.op_type if scorer is not None else "a graph input"
        raise _Refuse(f"the router's TopK ranks the output of {what}, not softmax(logits) or the logits")
    if read is not block.routing_form:
        raise _Refuse(f"the routing reads as {read.words} where the block was found as {block.routing_form.words}")
    width = graph.shape(a.logits)
    if width and isinstance(width[-1], int) and width[-1] != experts:
        raise _Refuse(f"router width {width[-1]} differs from the {experts} experts")
    a.weights = weights
    a.indices = topk.outputs[1] if len(topk.outputs) > 1 else ""
    _check_scaling(graph, weights)


def _read_sparsemixer(graph: Graph, a: MoeAnatomy) -> None:
    """PhiMoE's sparsemixer (no TopK): pick i1 = argmax(s); weight it by softmax(s masked to the experts j with
    (s[i1] - s[j]) / max(|s[j]|, s[i1]) <= 2 eps)[i1]; pick i2 = argmax(s with i1 at -inf) and weight it the same way
    over s without i1 (relative to s[i2]). Read: the two picks, their weights, the logits and eps."""
    block = a.block
    assert block.router is not None
    picks = sorted((n for n in block.selection if n.op_type == "ArgMax"), key=lambda n: n.index)
    if len(picks) != 2 or len(block.selection) != 2:
        raise _Refuse(f"a max-based router with {len(block.selection)} selections: sparsemixer routing picks exactly 2")
    logits = _through_views(graph, picks[0].input(0), _CAST_VIEWS)
    if not _is_router_output(graph, logits, block):
        raise _Refuse("the sparsemixer's first pick does not read the router logits")
    weights, bands = [], []
    for stage, pick in enumerate(picks):
        if not _last_axis(graph, pick.input(0), pick.attr("axis", 0)) or not pick.attr("keepdims", 1):
            raise _Refuse("a sparsemixer pick is not an arg-max over the expert axis")
        scores = pick.input(0)
        if stage == 1 and not _first_pick_masked(graph, scores, logits, picks[0]):
            raise _Refuse("the sparsemixer's second pick does not rank the logits with the first pick masked out")
        gathered = [c for c in graph.consumers(pick.outputs[0]) if c.op_type == "GatherElements"]
        if len(gathered) != 1:
            raise _Refuse("a sparsemixer pick's weight is not gathered from a masked softmax")
        softmax = graph.producer(gathered[0].input(0))
        if softmax is None or softmax.op_type != "Softmax" or not _last_axis(graph, softmax.input(0),
                                                                             softmax.attr("axis", -1)):
            raise _Refuse("a sparsemixer pick's weight is not gathered from a softmax over the experts")
        bands.append(_sparsemixer_band(graph, softmax.input(0), scores, logits))
        weights.append(gathered[0].outputs[0])
    if abs(bands[0] - bands[1]) > 1e-6 * max(abs(bands[0]), 1e-12):
        raise _Refuse(f"the sparsemixer's two picks use different bands ({bands[0]:g}, {bands[1]:g})")
    combined = _concat_of(graph, weights)
    indices = _concat_of(graph, [p.outputs[0] for p in picks])
    if combined is None or indices is None:
        raise _Refuse("the sparsemixer's two weights or two picks are not joined into one [tokens, 2] tensor")
    a.normalize, a.jitter_eps = False, bands[0] / 2
    a.logits = _logits_value(graph, logits, block)
    width = graph.shape(a.logits)
    if width and isinstance(width[-1], int) and block.experts and width[-1] != block.experts:
        raise _Refuse(f"router width {width[-1]} differs from the {block.experts} experts")
    a.weights, a.indices = combined, indices


def _first_pick_masked(graph: Graph, scores: str, logits: str, first: Node) -> bool:
    """scores = ScatterElements(logits, first pick, -inf) along the expert axis."""
    node = graph.producer(scores)
    if node is None or node.op_type != "ScatterElements" or node.attr("reduction", "none") != "none":
        return False
    if _through_views(graph, node.input(0), _CAST_VIEWS) != logits or node.input(1) != first.outputs[0]:
        return False
    return _fill_value(graph, node.input(2)) == float("-inf")


def _fill_value(graph: Graph, value: str) -> float | None:
    """The one value a constant, ConstantOfShape or Expand of a scalar fills a tensor with."""
    node = graph.producer(value)
    if node is not None and node.op_type == "ConstantOfShape":
        fill = node.attr("value")
        values = getattr(fill, "values", None) if fill is not None else (0.0,)
        return float(values[0]) if values and len(set(values)) == 1 else None
    if node is not None and node.op_type == "Expand":
        return _fill_value(graph, node.input(0))
    values = const_floats(graph, value)
    return values[0] if values and len(set(values)) == 1 else None


def _sparsemixer_band(graph: Graph, masked: str, scores: str, logits: str) -> float:
    """The constant c of Where(Greater((max(scores) - logits) / Max(Abs(logits), max(scores)), c), -inf, scores):
    the relative band (2 eps) a pick's softmax runs over."""
    where = graph.producer(masked)
    if where is None or where.op_type != "Where" or where.input(2) != scores or \
            _fill_value(graph, where.input(1)) != float("-inf"):
        raise _Refuse("a sparsemixer softmax does not read the scores with the out-of-band experts at -inf")
    greater = graph.producer(where.input(0))
    band = const_floats(graph, greater.input(1)) if greater is not None and greater.op_type == "Greater" else None
    if greater is None or not band or len(band) != 1:
        raise _Refuse("the sparsemixer's band is not a constant threshold")
    div = graph.producer(greater.input(0))
    sub = graph.producer(div.input(0)) if div is not None and div.op_type == "Div" else None
    factor = graph.producer(div.input(1)) if div is not None and div.op_type == "Div" else None
    if sub is None or sub.op_type != "Sub" or factor is None or factor.op_type not in ("Max", "Clip"):
        raise _Refuse("the sparsemixer's band is not relative ((max - s) / max(|s|, max))")
    top = graph.producer(sub.input(0))
    if top is None or top.op_type != "ReduceMax" or top.input(0) != scores or \
            _through_views(graph, sub.input(1), _CAST_VIEWS) != logits:
        raise _Refuse("the sparsemixer's band is not measured from the pick's maximum")
    absolute = [graph.producer(i) for i in factor.inputs if i]
    if not any(n is not None and n.op_type == "Abs" and n.input(0) == logits for n in absolute) or \
            top.outputs[0] not in factor.inputs:
        raise _Refuse("the sparsemixer's band is not relative to max(|s|, max)")
    return band[0]


def _concat_of(graph: Graph, parts: list[str]) -> str | None:
    """The Concat (last axis) that joins exactly `parts`, in order."""
    for c in graph.consumers(parts[0]):
        if c.op_type == "Concat" and list(c.inputs) == parts and _last_axis(graph, parts[0], c.attr("axis", 0)):
            return c.outputs[0]
    return None


def _refuse_unexpressible_scores(graph: Graph, block: MoeBlock, ranked: str, *, groups: bool = False) -> None:
    """Name every feature of the scores TopK ranks that com.microsoft.MoE cannot express (DeepSeek-V3 routers have
    all three): sigmoid scoring, a correction bias added before ranking, scores reshaped into expert groups."""
    found: list[str] = []
    value = ranked
    seen: set[str] = set()
    while value not in seen:
        seen.add(value)
        node = graph.producer(value)
        if node is None or node is block.router:
            break
        if node.op_type == "Sigmoid":
            found.append("sigmoid scoring (com.microsoft.MoE scores experts with softmax)")
        elif node.op_type == "Add" and any(graph.is_constant(i) for i in node.inputs):
            if graph.producer(_through_views(graph, next(i for i in node.inputs if not graph.is_constant(i)))) \
                    is block.router:
                pass  # a router bias (GPT-OSS): part of the logits
            else:
                found.append("bias-corrected top-k (a bias is added to the expert scores before TopK)")
        elif node.op_type == "Reshape":
            before, after = graph.shape(node.inputs[0]), graph.shape(node.outputs[0])
            if before and after and before[-1] != after[-1]:
                found.append("group-limited top-k (the scores are reshaped into expert groups before TopK)")
        elif node.op_type == "Where":
            found.append("group-limited top-k (scores outside the chosen expert groups are masked before TopK)")
            value = next((i for i in (node.input(2), node.input(1)) if i and not graph.is_constant(i)), "")
            if not value:
                break
            continue
        elif node.op_type != "Softmax" and node.op_type not in _CAST_VIEWS:
            break
        inputs = [i for i in node.inputs if i and not graph.is_constant(i)]
        if not inputs:
            break
        value = inputs[0]
    if groups and not any(f.startswith("group-limited") for f in found):
        found.append("group-limited top-k (the experts are ranked within chosen expert groups)")
    if len(found) > 1 or (found and "sigmoid" not in found[0]):
        raise _Inexpressible("; ".join(found) + ": DeepSeek-V3-style routing, which com.microsoft.MoE cannot express")
    if found:
        raise _Inexpressible(found[0])


def _is_router_output(graph: Graph, value: str, block: MoeBlock) -> bool:
    assert block.router is not None
    start = _through_views(graph, value)
    node = graph.producer(start)
    # Add of a constant bias after the router projection (GPT-OSS router bias): still the logits.
    if node is not None and node.op_type == "Add" and any(graph.is_constant(i) for i in node.inputs):
        start = next(i for i in node.inputs if not graph.is_constant(i))
    start = _through_views(graph, start)
    # a quantized router (MatMulInteger): its logits are the Mul that dequantizes its output
    return graph.producer(start) is block.router or start == dequantized_output(graph, block.router)


def _logits_value(graph: Graph, value: str, block: MoeBlock) -> str:
    """The router logits in the hidden state's dtype: a Cast to float32 before Softmax (fp16 models) is skipped."""
    node = graph.producer(value)
    if node is not None and node.op_type == "Cast" and node.inputs:
        return node.inputs[0]
    if not _is_router_output(graph, value, block):
        raise _Refuse("the router's scores do not come straight from the router projection")
    return value


def _renormalised(graph: Graph, values: str) -> tuple[str, bool]:
    """The top-k weights, and whether they are divided by their sum or L1 norm (Qwen3 norm_topk_prob, DBRX's
    ReduceL1, ERNIE's sum clamped to a minimum: `sum_of_weights`)."""
    consumers, seen = _single_consumer_through_views(graph, values)
    divs = [c for c in consumers if c.op_type == "Div" and c.domain == DEFAULT_DOMAIN and c.input(0) == seen]
    for div in divs:
        if sum_of_weights(graph, div.input(1), lambda r: r.input(0) == seen) is not None:
            return div.outputs[0], True
    return values, False


def _check_scaling(graph: Graph, weights: str) -> None:
    """A constant factor on the routing weights (DeepSeek routed_scaling_factor) is outside MoE's contract."""
    consumers, _ = _single_consumer_through_views(graph, weights)
    for c in consumers:
        if c.op_type == "Mul":
            other = c.input(1) if c.input(0) in (weights,) else c.input(0)
            factor = const_floats(graph, other)
            if factor is not None and len(factor) == 1 and abs(factor[0] - 1.0) > 1e-6:
                raise _Inexpressible(f"routing weights scaled by {factor[0]:g} (routed scaling factor): "
                              "com.microsoft.MoE has no such attribute")


# ---- experts ---------------------------------------------------------------------------------------------------


def _read_experts(graph: Graph, a: MoeAnatomy) -> None:
    routing_values = _descendants(graph, {a.weights, a.indices})
    contributions = _contributions(graph, a, routing_values)
    if not contributions:
        raise _Refuse(_unread_experts_reason(graph, a.block))
    experts: dict[int, ExpertAnatomy] = {}
    expert_inputs: set[str] = set()
    activations: set[tuple[str, tuple]] = set()
    if len(contributions) == 1 and _expert_index(graph, contributions[0][2], routing_values) is None:
        if a.block.expert_form is not ExpertForm.BATCHED:
            raise _Refuse(f"one weighted output for all experts, but the experts were found {a.block.expert_form.words}")
        _read_batched(graph, a, *contributions[0])
        return
    for mul, expert_out, weight in contributions:
        index = _expert_index(graph, weight, routing_values)
        if index is None:
            raise _Refuse(f"cannot tell which expert {mul.display_name} weights (no constant expert index)")
        expert, x_e, activation = _expert_mlp(graph, index, expert_out)
        if index in experts:
            raise _Refuse(f"expert {index} is computed twice")
        experts[index] = expert
        expert_inputs.add(x_e)
        activations.add(activation)
    count = a.num_experts or 0
    if sorted(experts) != list(range(count)):
        raise _Refuse(f"{len(experts)} expert outputs for a router of width {count} (expert count differs from the "
                      "router's width)")
    if len(activations) != 1:
        raise _Refuse(f"experts use different activations ({', '.join(sorted(str(x) for x in activations))})")
    a.activation, a.swiglu = activations.pop()
    a.experts = [experts[i] for i in range(count)]
    hidden = _common_hidden(graph, expert_inputs)
    if hidden is None:
        raise _Refuse("the experts do not read one common hidden state")
    a.hidden, pattern = hidden
    if pattern != a.pattern:
        raise _Refuse(f"the experts read their input as a {pattern.replace('_', ' ')}, but were found "
                      f"{a.block.expert_form.words}")
    a.output, a.combine = _combine_end(graph, [c[0] for c in contributions])
    _check_shapes(graph, a)


# Ops a routing weight passes through on its way to the expert it scales (selection and reshaping, no arithmetic).
_ROUTE_OPS = _VIEW_OPS | frozenset({"Slice", "Gather", "GatherND", "GatherElements", "ScatterElements", "Transpose",
                                    "Equal", "NonZero", "Where", "Split", "OneHot", "Not", "Greater", "Less"})


def _token_sort(graph: Graph, block: MoeBlock) -> Node | None:
    """A second TopK of the routing region that sorts the picked expert indices (tokens grouped by expert:
    transformers' grouped_mm translation, JetMoE's ParallelExperts): it ranks no expert."""
    topk = block.topk
    if topk is None or len(topk.outputs) < 2 or not topk.outputs[1]:
        return None
    indices = _descendants(graph, {topk.outputs[1]})
    return next((n for n in block.routing_nodes if n.op_type == "TopK" and n is not topk
                 and _through_views(graph, n.input(0)) in indices), None)


# Expert linears of integer arithmetic (quantize_dynamic: activations quantized at run time, int32 accumulation).
_INTEGER_LINEARS = frozenset({"MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})


def _unread_experts_reason(graph: Graph, block: MoeBlock) -> str:
    """Why no expert output weighted by the routing weights was read: the form the experts have, when it is known."""
    integer = [n for n in block.expert_linears if n.op_type in _INTEGER_LINEARS]
    if integer:
        ops = ", ".join(sorted({n.op_type for n in integer}))
        return (f"{len(integer)} of the block's {len(block.expert_linears)} expert linears are integer matmuls "
                f"({ops}: activations quantized at run time times int8 weights), which com.microsoft.MoE does not "
                "compute: it takes float expert weights")
    sort = _token_sort(graph, block)
    if sort is not None:
        return ("the experts read the tokens sorted by expert (a second TopK sorts the picked expert indices; each "
                "expert computes a slice of the sorted rows: transformers' grouped_mm translation, JetMoE's "
                "ParallelExperts), a dispatch the rewrite does not read")
    return "no expert output weighted by the routing weights was found"


def _read_batched(graph: Graph, a: MoeAnatomy, mul: Node, expert_out: str, weight: str) -> None:
    """The batched form torch exports (transformers' batched_mm experts): every token's k rows go through MatMuls
    whose weights are gathered from [E, ., .] stacks by the top-k indices, are scaled by their routing weights,
    reshaped to [tokens, k, H] and summed over k."""
    count = a.num_experts or 0
    experts: list[ExpertAnatomy] = []
    inputs: set[str] = set()
    activations: set[tuple[str, tuple]] = set()
    for e in range(count):
        expert, x, activation = _expert_mlp(graph, e, expert_out, pick=e)
        experts.append(expert)
        inputs.add(x)
        activations.add(activation)
    stacks = {v.initializer for ex in experts for v in (ex.gate, ex.up, ex.down) if v is not None}
    for name in stacks:
        if graph.initializers[name].dims[0] != count:
            raise _Refuse(f"stacked expert weight {name} holds {graph.initializers[name].dims[0]} experts for a router "
                          f"of width {count} (expert count differs from the router's width)")
    if len(inputs) != 1 or len(activations) != 1:
        raise _Refuse("the batched experts read different tensors or use different activations")
    a.experts = experts
    a.activation, a.swiglu = activations.pop()
    a.hidden = _unrepeat(graph, inputs.pop())
    a.output, a.combine = _sum_over_k(graph, mul, a.k or 0)
    _check_shapes(graph, a)


def _unrepeat(graph: Graph, value: str) -> str:
    """The [tokens, H] hidden state behind its k-fold repetition: [Unsqueeze(-1) of] Reshape(Expand|Tile(
    Unsqueeze(x, 1)), [-1, H]) is x repeated k times row by row (torch's repeat_interleave)."""
    node = graph.producer(value)
    if node is not None and node.op_type == "Unsqueeze":
        value, node = node.inputs[0], graph.producer(node.inputs[0])
    if node is None or node.op_type != "Reshape":
        raise _Refuse("the batched experts do not read the hidden state repeated k times")
    repeat = graph.producer(node.inputs[0])
    if repeat is None or repeat.op_type not in ("Expand", "Tile"):
        raise _Refuse("the batched experts do not read the hidden state repeated k times")
    inner = graph.producer(repeat.inputs[0])
    if inner is not None and inner.op_type == "Unsqueeze":
        return inner.inputs[0]
    return repeat.inputs[0]


def _sum_over_k(graph: Graph, mul: Node, k: int) -> tuple[str, Node]:
    consumers, value = _single_consumer_through_views(graph, mul.outputs[0])
    if len(consumers) != 1 or consumers[0].op_type != "ReduceSum":
        raise _Refuse("the batched experts' weighted rows are not summed over the k choices")
    total = consumers[0]
    axes = const_ints(graph, total.input(1)) if total.input(1) else None
    shape = graph.shape(value)
    if axes is None or len(axes) != 1 or (shape is not None and len(shape) == 3 and shape[axes[0]] not in (k, None)
                                          and not isinstance(shape[axes[0]], str)):
        raise _Refuse("the batched experts' weighted rows are not summed over the k choices")
    if total.attr("keepdims", 1):
        raise _Refuse("the sum over the k choices keeps its axis")
    return total.outputs[0], total


def _descendants(graph: Graph, start: set[str]) -> set[str]:
    """Values derived from the routing weights and indices by selection ops only."""
    seen = set(start)
    frontier = list(start)
    while frontier:
        value = frontier.pop()
        for c in graph.consumers(value):
            if c.domain != DEFAULT_DOMAIN or c.op_type not in _ROUTE_OPS:
                continue
            if c.op_type == "ScatterElements" and c.attr("reduction", "none") != "none":
                continue
            for o in c.outputs:
                if o and o not in seen:
                    seen.add(o)
                    frontier.append(o)
    return seen


def _contributions(graph: Graph, a: MoeAnatomy, routing_values: set[str]) -> list[tuple[Node, str, str]]:
    """(Mul, expert output, routing weight) for each expert: the expert's down projection times its weight."""
    out = []
    muls = {c.index: c for v in routing_values for c in graph.consumers(v) if c.op_type == "Mul"}
    for node in muls.values():
        if node.domain != DEFAULT_DOMAIN or len(node.inputs) != 2:
            continue
        left, right = node.inputs
        left_routed, right_routed = left in routing_values, right in routing_values  # _routed
        if left_routed == right_routed:
            continue
        weight, expert_out = (left, right) if left_routed else (right, left)
        if _down_projection(graph, expert_out) is None:
            continue
        out.append((node, expert_out, weight))
    out.sort(key=lambda t: t[0].index)
    return out


def _routed(graph: Graph, value: str, routing_values: set[str]) -> bool:
    return value in routing_values


def _down_projection(graph: Graph, value: str) -> Node | None:
    return _linear_and_bias(graph, value)[0]


def _linear_and_bias(graph: Graph, value: str) -> tuple[Node | None, str | None]:
    """The MatMul/Gemm producing `value` (through pass-through ops), and the constant bias added after it, if any."""
    memo = memo_table(graph, "moe_linear_and_bias")  # an expert's output is asked for its weighting, then its detail
    found = memo.get(value)
    if found is None:
        found = memo[value] = _find_linear_and_bias(graph, value)
    return found


def _find_linear_and_bias(graph: Graph, value: str) -> tuple[Node | None, str | None]:
    node = producer_through(graph, value, _VIEW_OPS)
    bias = None
    if node is not None and node.op_type == "Add" and node.domain == DEFAULT_DOMAIN and len(node.inputs) == 2:
        consts = [i for i in node.inputs if graph.is_constant(i) or _stack_row(graph, i)]
        others = [i for i in node.inputs if i not in consts]
        if len(consts) == 1 and len(others) == 1:
            bias = consts[0]
            node = producer_through(graph, others[0], _VIEW_OPS)
    if node is not None and node.domain == DEFAULT_DOMAIN and node.op_type in ("MatMul", "Gemm"):
        return node, bias
    return None, None


def _stack_row(graph: Graph, value: str) -> bool:
    """A row gathered from an [E, N] initializer (an expert's bias picked from its stack)."""
    node = graph.producer(value)
    if node is None or node.op_type not in ("Gather", "GatherND"):
        return False
    init = graph.initializers.get(node.input(0))
    return init is not None and len(init.dims) == 2
    return None


def _expert_index(graph: Graph, weight: str, routing_values: set[str]) -> int | None:
    """The expert column a per-expert routing weight selects: Slice [e:e+1] / Gather e on the expert axis of the
    routing matrix (or of a one-hot expert mask, transposed or not), or Equal(indices, e) of a token-dispatch loop.

    The walk goes back through routing values, and also through the index arithmetic a gathered weight is picked
    by: transformers' eager loop weights expert e's rows with routing_weights[top_x, idx], where (idx, top_x) =
    NonZero(one_hot(indices).permute(2, 1, 0)[e]), so the constant e lies behind the Gather's index input."""
    frontier = [weight]
    seen = set(frontier)
    for _ in range(16):  # the index arithmetic can lead far from the routing: only the nearest steps are read
        next_frontier = []
        for value in frontier:
            node = graph.producer(value)
            if node is None:
                continue
            if node.op_type == "Slice" and len(node.inputs) >= 3:
                starts, ends = const_ints(graph, node.input(1)), const_ints(graph, node.input(2))
                axes = const_ints(graph, node.input(3)) if node.input(3) else None
                if starts and ends and len(starts) == 1 and ends[0] == starts[0] + 1 and (
                        axes is None or _on_expert_axis(graph, node.input(0), axes[0])):
                    return starts[0]
            if node.op_type == "Gather" and node.input(0) in routing_values:
                index = const_ints(graph, node.input(1))
                if index and len(index) == 1 and _on_expert_axis(graph, node.input(0), node.attr("axis", 0)):
                    return index[0]
            if node.op_type == "Equal":
                for i, other in ((0, 1), (1, 0)):
                    index = const_ints(graph, node.input(i))
                    if index and len(index) == 1 and node.input(other) in routing_values:
                        return index[0]
            routed = value in routing_values
            for position, value in enumerate(node.inputs):
                if not value or value in seen or graph.is_constant(value):
                    continue
                follow = value in routing_values or (
                    # the index a routing weight is gathered by, and the arithmetic that computes it
                    (routed and node.op_type in _GATHER_OPS and position == 1)
                    or (not routed and node.op_type in _INDEX_OPS))
                if follow:
                    seen.add(value)
                    next_frontier.append(value)
        frontier = next_frontier
    return None


_GATHER_OPS = frozenset({"Gather", "GatherElements", "GatherND"})
# Ops that compute a row index from the routing indices (NonZero of an expert's mask, row * k + choice).
_INDEX_OPS = _VIEW_OPS | frozenset({"Add", "Mul", "Sub", "Split", "Transpose", "NonZero", "Concat", "Slice"})


def _on_expert_axis(graph: Graph, value: str, axis: int | None) -> bool:
    """Whether `axis` of `value` is its expert axis: the axis OneHot put the experts on, followed through
    Transpose; for any other routing tensor, its last axis."""
    if axis is None:
        return False
    memo = memo_table(graph, "moe_expert_axis")  # every expert of a layer asks it of the same routing tensor
    key = (value, axis)
    if key not in memo:
        memo[key] = _is_expert_axis(graph, value, axis)
    return memo[key]


def _is_expert_axis(graph: Graph, value: str, axis: int) -> bool:
    found = _expert_axis(graph, value)
    if found is None:
        return _last_axis(graph, value, axis)
    expert_axis, rank = found
    return (axis % rank if rank else axis) == expert_axis


def _expert_axis(graph: Graph, value: str) -> tuple[int, int] | None:
    """(expert axis, rank) of a one-hot expert mask, through Cast / Identity / Transpose; None for other tensors."""
    node = graph.producer(value)
    if node is None or node.domain != DEFAULT_DOMAIN:
        return None
    if node.op_type in _CAST_VIEWS:
        return _expert_axis(graph, node.input(0))
    if node.op_type == "Transpose":
        inner = _expert_axis(graph, node.input(0))
        if inner is None:
            return None
        axis, rank = inner
        perm = list(node.attr("perm", []) or range(rank - 1, -1, -1))
        return (perm.index(axis), rank) if axis in perm else None
    if node.op_type == "OneHot":
        indices_rank = _rank_of(graph, node.input(0))
        if indices_rank is None:
            return None
        rank = indices_rank + 1
        return node.attr("axis", -1) % rank, rank
    return None


def _expert_mlp(graph: Graph, index: int, expert_out: str, pick: int | None = None
                ) -> tuple[ExpertAnatomy, str, tuple[str, tuple]]:
    """The expert's weights, the value it reads, and its activation, from its down projection back. `pick`: the
    expert to take from weights gathered out of a stack by the routing indices (the batched form)."""
    down, down_bias = _linear_and_bias(graph, expert_out)
    assert down is not None
    down_view, h = _linear_view(graph, down, pick)
    if down_bias is not None:
        down_view = _with_bias(graph, down_view, down_bias, pick)
    h_node = graph.producer(h)
    if h_node is not None and h_node.op_type in _ACTIVATION_VIEWS:
        h_node = producer_through(graph, h, _ACTIVATION_VIEWS)  # no view in between: the producer is the one
    if h_node is None:
        raise _Refuse(f"expert {index}: the down projection reads a graph input")
    gated = _gated(graph, h_node)
    if gated is not None:
        gate_value, up_value, name = gated[:3]
        activation = (name, gated[3] if len(gated) > 3 else (1.0, 0.0, None))
        producer = graph.producer
        node = producer(gate_value)
        if node is not None and node.op_type == "MatMul" and node.domain == DEFAULT_DOMAIN:
            gate_view, x_gate = _linear_view(graph, node, pick)  # _projection_part's first case
        else:
            gate_view, x_gate = _projection_part(graph, gate_value, pick)
        node = producer(up_value)
        if node is not None and node.op_type == "MatMul" and node.domain == DEFAULT_DOMAIN:
            up_view, x_up = _linear_view(graph, node, pick)
        else:
            up_view, x_up = _projection_part(graph, up_value, pick)
        if x_gate != x_up:
            raise _Refuse(f"expert {index}: gate and up projections read different tensors")
        return ExpertAnatomy(index, up_view, down_view, gate_view), x_gate, activation
    name, pre = _plain_activation(graph, h)
    fc1_view, x = _projection_part(graph, pre, pick)
    return ExpertAnatomy(index, fc1_view, down_view), x, (name, (1.0, 0.0, None))


def _gated(graph: Graph, node: Node) -> tuple | None:
    """(gate value, up value, activation[, (alpha, beta, limit)]) of act(gate) * up, or of GPT-OSS's clamped form
    (up.clamp(-L, L) + beta) * g * sigmoid(alpha * g) with g = gate.clamp(max=L)."""
    if node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    first, second = graph.producer(node.inputs[0]), graph.producer(node.inputs[1])
    if first is not None and second is not None and (first.op_type, second.op_type) in (("Add", "Mul"), ("Mul", "Add")):
        clamped = _clamped_swiglu(graph, node)  # (up + beta) * glu: an Add and a Mul
        if clamped is not None:
            return clamped
    for act_side, up_side in ((0, 1), (1, 0)):
        gate = _silu_input(graph, node.input(act_side))
        if gate is not None:
            return gate, node.input(up_side), "swiglu"
        if _gelu_input(graph, node.input(act_side)) is not None:
            raise _Refuse("GELU-gated experts (GeGLU): com.microsoft.MoE gates with SiLU only")
    return None


def _clip_bounds(graph: Graph, value: str) -> tuple[str, float | None, float | None] | None:
    """(input, min, max) of a Clip with constant bounds."""
    node = graph.producer(value)
    if node is None or node.op_type != "Clip":
        return None
    low = const_floats(graph, node.input(1)) if node.input(1) else None
    high = const_floats(graph, node.input(2)) if node.input(2) else None
    return node.input(0), (low[0] if low else None), (high[0] if high else None)


def _clamped_swiglu(graph: Graph, node: Node) -> tuple | None:
    for lin_side, glu_side in ((0, 1), (1, 0)):
        shifted = graph.producer(node.input(lin_side))
        glu = graph.producer(node.input(glu_side))
        if shifted is None or glu is None or shifted.op_type != "Add" or glu.op_type != "Mul":
            continue
        beta_value = next((const_floats(graph, i) for i in shifted.inputs if graph.is_constant(i)), None)
        up_value = next((i for i in shifted.inputs if not graph.is_constant(i)), None)
        up_clip = _clip_bounds(graph, up_value) if up_value else None
        if not beta_value or up_clip is None:
            continue
        for g_side, s_side in ((0, 1), (1, 0)):
            sig = graph.producer(glu.input(s_side))
            if sig is None or sig.op_type != "Sigmoid":
                continue
            scaled = graph.producer(sig.input(0))
            if scaled is None or scaled.op_type != "Mul" or glu.input(g_side) not in scaled.inputs:
                continue
            alpha = next((const_floats(graph, i) for i in scaled.inputs if graph.is_constant(i)), None)
            gate_clip = _clip_bounds(graph, glu.input(g_side))
            if not alpha or gate_clip is None:
                continue
            limit = gate_clip[2]
            if limit is None or gate_clip[1] is not None or up_clip[1] != -limit or up_clip[2] != limit:
                raise _Refuse("a clamped SwiGLU whose bounds are not (gate <= L, -L <= up <= L)")
            return gate_clip[0], up_clip[0], "swiglu", (alpha[0], beta_value[0], limit)
    return None


def _silu_input(graph: Graph, value: str) -> str | None:
    """x for x * sigmoid(x) (either operand order), com.microsoft QuickGelu(alpha=1) or a Silu op."""
    node = graph.producer(value)
    if node is None:
        return None
    if node.op_type == "Mul" and len(node.inputs) == 2 and node.domain == DEFAULT_DOMAIN:
        for x_side, s_side in ((0, 1), (1, 0)):
            sig = graph.producer(node.input(s_side))
            if sig is not None and sig.op_type == "Sigmoid" and sig.input(0) == node.input(x_side):
                return node.input(x_side)
    if node.op_type == "QuickGelu" and node.domain == MS_DOMAIN and abs(float(node.attr("alpha", 1.0)) - 1.0) < 1e-6:
        return node.input(0)
    if node.op_type == "Silu":
        return node.input(0)
    return None


def _gelu_input(graph: Graph, value: str) -> str | None:
    node = graph.producer(value)
    if node is not None and node.op_type in ("Gelu", "FastGelu", "BiasGelu"):
        return node.input(0)
    return None


def _plain_activation(graph: Graph, value: str) -> tuple[str, str]:
    """(activation, its input) of a non-gated expert: down(act(fc1 x))."""
    node = producer_through(graph, value, _ACTIVATION_VIEWS)
    if node is None:
        raise _Refuse("the expert's activation reads a graph input")
    silu = _silu_input(graph, node.outputs[0])
    if silu is not None:
        return "silu", silu
    if node.op_type == "Gelu" and node.attr("approximate", "none") == "none":
        return "gelu", node.input(0)
    if node.op_type == "Relu":
        return "relu", node.input(0)
    if node.op_type in ("MatMul", "Gemm", "Split", "Slice"):
        return "identity", node.outputs[0] if node.op_type != "Split" else value
    raise _Refuse(f"expert activation {node.op_type} has no com.microsoft.MoE activation_type")


def _projection_part(graph: Graph, value: str, pick: int | None = None) -> tuple[WeightView, str]:
    """The weight view behind `value` (a linear's output, or one part of a merged linear's Split/Slice) and the
    value that linear reads."""
    node = graph.producer(value)
    if node is not None and node.op_type == "MatMul" and node.domain == DEFAULT_DOMAIN:
        return _linear_view(graph, node, pick)  # the usual case: what the walk below reads of a plain MatMul
    value = _through_views(graph, value, _PROJECTION_VIEWS)
    node = graph.producer(value)
    if node is None:
        raise _Refuse("an expert projection reads a graph input")
    if node.op_type in ("MatMul", "Gemm", "Add"):
        linear, bias = _linear_and_bias(graph, value)
        if linear is None:
            raise _Refuse(f"an expert projection is computed by {node.op_type}, not MatMul/Gemm")
        view, x = _linear_view(graph, linear, pick)
        return _with_bias(graph, view, bias, pick), x
    if node.op_type == "Split" and node.domain == DEFAULT_DOMAIN:
        # The gate and up parts of one merged projection read the same split: its view and sizes are read once.
        memo = memo_table(graph, "moe_split_view")
        key = (node.index, pick)
        split = memo.get(key)
        if split is None:
            split = memo[key] = _split_view(graph, node, pick)
        view, x, sizes = split
        position = node.outputs.index(value)
        start = sum(sizes[:position])
        return WeightView(view.initializer, view.index, view.transposed, (start, start + sizes[position], 1),
                          view.bias), x
    if node.op_type == "Slice" and node.domain == DEFAULT_DOMAIN:
        linear, bias = _linear_and_bias(graph, node.input(0))
        starts, ends = const_ints(graph, node.input(1)), const_ints(graph, node.input(2))
        axes = const_ints(graph, node.input(3)) if node.input(3) else (-1,)
        steps = const_ints(graph, node.input(4)) if node.input(4) else (1,)
        if linear is None or linear.op_type not in ("MatMul", "Gemm") or not (starts and ends and axes and steps) \
                or len(starts) != 1 or not _last_axis(graph, node.input(0), axes[0]) or steps[0] <= 0:
            raise _Refuse("an expert projection is sliced in a way the rewrite does not read")
        view, x = _linear_view(graph, linear, pick)
        view = _with_bias(graph, view, bias, pick)
        total = _out_features(graph, view) or 0
        stop = min(ends[0], total)
        return WeightView(view.initializer, view.index, view.transposed, (starts[0], stop, steps[0]), view.bias), x
    if node.op_type == "SequenceAt" and node.domain == DEFAULT_DOMAIN:
        raise _Refuse(_sequence_split_reason(graph, node))
    raise _Refuse(f"an expert projection is computed by {node.op_type}, not MatMul/Gemm")


def _sequence_split_reason(graph: Graph, at: Node) -> str:
    """Why the rewrite leaves a part taken by SequenceAt: what is split, by what, and the export that it reads."""
    split = graph.producer(at.input(0))
    linear = None
    if is_op(split, "SplitToSequence") and split.inputs:
        linear, _ = _linear_and_bias(graph, split.input(0))
    if linear is None:
        return (f"an expert's input is taken by SequenceAt {at.display_name} from a sequence the rewrite does not "
                "read (a SplitToSequence of a projection is the form it knows of)")
    return (f"the parts of expert projection {linear.op_type} {linear.display_name} (its gate and up halves) are "
            f"taken by SplitToSequence -> SequenceAt, which the rewrite does not read: torch.onnx writes them for a "
            "torch.split / chunk whose pieces it cannot make static; re-exported with static split sizes (a Python "
            "int list, or torch.chunk of a fixed count) the halves are a Split, which `ortgate fix` rewrites")


def _split_view(graph: Graph, node: Node, pick: int | None) -> tuple[WeightView, str, tuple[int, ...]]:
    """The weight view of the merged linear a Split cuts into parts, the value it reads, and the parts' sizes."""
    linear, bias = _linear_and_bias(graph, node.input(0))
    if linear is None or linear.op_type not in ("MatMul", "Gemm"):
        raise _Refuse("a split expert projection is not a MatMul/Gemm")
    if not _last_axis(graph, node.input(0), node.attr("axis", 0)):
        raise _Refuse("a merged gate_up projection is split on another axis than its features")
    view, x = _linear_view(graph, linear, pick)
    view = _with_bias(graph, view, bias, pick)
    total = _out_features(graph, view)
    sizes = const_ints(graph, node.input(1)) if node.input(1) else None
    if sizes is None:
        parts = len(node.outputs)
        if total is None or total % parts:
            raise _Refuse("cannot size the parts of a merged gate_up projection")
        sizes = (total // parts,) * parts
    return view, x, sizes


def _linear_view(graph: Graph, node: Node, pick: int | None = None) -> tuple[WeightView, str]:
    """The [out, in] weight view of a MatMul(x, W) / Gemm(x, W, transB) and its input x; with `pick`, also of a
    batched MatMul whose weight (either side) is gathered from an [E, ., .] stack by the routing indices."""
    if pick is None and node.op_type == "MatMul" and len(node.inputs) == 2:
        init = graph.initializers.get(node.inputs[1])
        if init is not None and len(init.dims) == 2:
            return WeightView(node.inputs[1], None, True), node.inputs[0]  # MatMul(x, W): the walk below's first step
    if pick is not None and node.op_type == "MatMul":
        for side in (0, 1):
            stack = _gathered_stack(graph, node.input(side))
            if stack is not None:
                # W[e] @ x: W[e] is [out, in]; x @ W[e]: W[e] is [in, out]
                return WeightView(stack, pick, transposed=side == 1), node.input(1 - side)
    if node.op_type == "Gemm":
        if node.attr("transA", 0) or abs(float(node.attr("alpha", 1.0)) - 1.0) > 1e-6 or (
                node.input(2) and abs(float(node.attr("beta", 1.0)) - 1.0) > 1e-6):
            raise _Refuse("an expert Gemm has transA, or alpha / beta other than 1")
        transposed = not node.attr("transB", 0)
    else:
        transposed = True  # MatMul(x, W): W is [in, out]
    value = node.input(1)
    index = None
    seen: set[str] = set()
    while value not in seen:
        seen.add(value)
        if value in graph.initializers:
            init = graph.initializers[value]
            rank = len(init.dims)
            if (index is None and rank != 2) or (index is not None and rank != 3):
                raise _Refuse(f"expert weight {value} has rank {rank}")
            view = WeightView(value, index, transposed)
            if node.op_type == "Gemm" and node.input(2):
                view = _with_bias(graph, view, node.input(2), None)
            return view, node.input(0)
        producer = graph.producer(value)
        if producer is None:
            break
        if producer.op_type == "Transpose" and producer.domain == DEFAULT_DOMAIN:
            perm = producer.attr("perm", [])
            if perm not in ([1, 0], [0, 2, 1]) and perm:
                raise _Refuse("an expert weight is transposed on other axes")
            transposed = not transposed
        elif producer.op_type == "Gather" and producer.domain == DEFAULT_DOMAIN and producer.attr("axis", 0) == 0:
            picked = const_ints(graph, producer.input(1))
            if index is not None or not picked or len(picked) != 1:
                raise _Refuse("an expert weight is gathered from its stack by a non-constant index")
            index = picked[0]
        elif producer.op_type == "Identity":
            pass
        else:
            raise _Refuse(f"an expert weight is computed by {producer.op_type} (quantized or cast weights are not "
                          "rewritten)")
        value = producer.input(0)
    raise _Refuse("an expert weight is not an initializer")


def _gathered_stack(graph: Graph, value: str) -> str | None:
    """The [E, ., .] initializer `value` gathers rows of (GatherND / Gather on axis 0 by non-constant indices)."""
    node = graph.producer(value)
    if node is None or node.domain != DEFAULT_DOMAIN:
        return None
    if (node.op_type == "GatherND" and not node.attr("batch_dims", 0)) or (
            node.op_type == "Gather" and node.attr("axis", 0) == 0 and const_ints(graph, node.input(1)) is None):
        init = graph.initializers.get(node.input(0))
        if init is not None and len(init.dims) == 3:
            return init.name
    return None


def _with_bias(graph: Graph, view: WeightView, bias: str | None, pick: int | None) -> WeightView:
    """`view` with the bias added after its projection: a 1-D initializer, or row e of an [E, N] stack."""
    if bias is None:
        return view
    if bias in graph.initializers and len(graph.initializers[bias].dims) == 1:
        return WeightView(view.initializer, view.index, view.transposed, view.rows, (bias, None))
    node = graph.producer(bias)
    if node is not None and node.op_type in ("Gather", "GatherND") and node.input(0) in graph.initializers:
        stack = graph.initializers[node.input(0)]
        picked = const_ints(graph, node.input(1)) if node.op_type == "Gather" else None
        index = picked[0] if picked and len(picked) == 1 else pick
        if len(stack.dims) == 2 and index is not None:
            return WeightView(view.initializer, view.index, view.transposed, view.rows, (stack.name, index))
    raise _Refuse("an expert bias is not an initializer (or a row of a stacked one)")


def _out_features(graph: Graph, view: WeightView) -> int | None:
    dims = graph.initializers[view.initializer].dims
    matrix = dims[1:] if view.index is not None else dims
    return matrix[1] if view.transposed else matrix[0]


def _in_features(graph: Graph, view: WeightView) -> int | None:
    dims = graph.initializers[view.initializer].dims
    matrix = dims[1:] if view.index is not None else dims
    return matrix[0] if view.transposed else matrix[1]


def view_shape(graph: Graph, view: WeightView) -> tuple[int, int]:
    """[out, in] of the view (rows applied)."""
    out = _out_features(graph, view) or 0
    if view.rows is not None:
        start, stop, step = view.rows
        out = len(range(start, min(stop, out), step))
    return out, _in_features(graph, view) or 0


def _common_hidden(graph: Graph, inputs: set[str]) -> tuple[str, str] | None:
    """(hidden tensor, pattern): every expert reads it directly (dense loop), or rows gathered from it (token
    dispatch loop)."""
    if len(inputs) == 1:
        return next(iter(inputs)), "dense_loop"
    sources = set()
    for value in inputs:
        source = _gathered_rows_of(graph, value)
        if source is None:
            return None
        sources.add(source)
    if len(sources) == 1:
        return next(iter(sources)), "gather_loop"
    return None


def _gathered_rows_of(graph: Graph, value: str) -> str | None:
    """x for rows of x gathered by token index (through reshapes): Gather(x, rows, axis=0), or torch's
    x[None, rows] = Gather(Unsqueeze(x, 0), rows, axis=1) that the legacy exporter writes."""
    node = producer_through(graph, value, _ROW_VIEWS)
    if node is None or node.op_type != "Gather" or node.domain != DEFAULT_DOMAIN:
        return None
    axis = node.attr("axis", 0)
    if axis == 0:
        return node.input(0)
    lifted = graph.producer(node.input(0))
    if axis == 1 and lifted is not None and lifted.op_type == "Unsqueeze" and lifted.domain == DEFAULT_DOMAIN:
        axes = const_ints(graph, lifted.input(1)) if lifted.input(1) else tuple(lifted.attr("axes", []) or ())
        if axes == (0,):
            return lifted.input(0)
    return None


def _combine_end(graph: Graph, muls: list[Node]) -> tuple[str, Node]:
    """The value where the chain of Add / ScatterND(add) over the experts' weighted outputs ends."""
    values = {m.outputs[0] for m in muls}
    members: dict[int, Node] = {}
    # A fixpoint: an Add joins once both its operands are in the sum (or zeros it starts from). Worked from a list
    # of the values that joined: a node is looked at again only when one of its inputs has just joined (each
    # condition only grows with `values`), not every node on every round (quadratic in the experts). The first
    # expert's output is taken first (popped last): a chain of Adds then joins in one pass, in the experts' order.
    pending = [m.outputs[0] for m in reversed(muls)]
    consumers = graph.consumers
    while pending:
        value = pending.pop()
        for c in consumers(value):
            if c.index in members or c.domain != DEFAULT_DOMAIN:
                continue
            op_type = c.op_type
            if op_type in _CAST_VIEWS or op_type == "Expand":
                ok = c.input(0) == value  # the weighted rows on their way to a scatter
            elif op_type == "Add":
                ok = True
                for i in c.inputs:
                    if i not in values and not _zeros(graph, i):
                        ok = False
                        break
            elif c.op_type in _COMBINE_OPS:  # ScatterND / ScatterElements of weighted outputs into the sum
                # reduction=add accumulates; reduction=none into zeros then added to the sum is torch's index_add_
                # as the legacy exporter writes it (exact: one expert's rows are distinct tokens).
                ok = c.input(2) in values and (
                    (c.attr("reduction", "none") == "add" and (c.input(0) in values or _zeros(graph, c.input(0))))
                    or (c.attr("reduction", "none") == "none" and _zeros(graph, c.input(0))))
            else:
                ok = False
            if ok:
                members[c.index] = c
                out = c.outputs[0]
                if out not in values:
                    values.add(out)
                    pending.append(out)
    chain = list(members.values())
    if not chain:
        raise _Refuse("the experts' weighted outputs are not summed")
    ends = []
    combines = 0
    for n in chain:
        if n.op_type in _COMBINE_OPS:
            combines += 1
            for c in consumers(n.outputs[0]):
                if c.index in members:
                    break
            else:
                ends.append(n)  # no member reads it
    if combines < len(muls) - 1:
        raise _Refuse("not every weighted expert output reaches the sum")
    if len(ends) != 1:
        raise _Refuse("the experts' weighted outputs are not summed into one tensor")
    end = ends[0]
    return end.outputs[0], end


def _zeros(graph: Graph, value: str) -> bool:
    """A tensor of zeros the sum starts from: ConstantOfShape(0), Expand(0) or a zero constant."""
    node = graph.producer(value)
    if node is None:
        values = graph.constant_value(value)
        return values is not None and all(v == 0 for v in values)
    if node.op_type == "ConstantOfShape":
        fill = node.attr("value")
        return fill is None or (getattr(fill, "values", None) is not None and all(v == 0 for v in fill.values))
    if node.op_type in ("Expand", "Cast", "Identity", "Reshape") and node.inputs:
        return _zeros(graph, node.inputs[0])
    if node.op_type == "Constant":
        values = graph.constant_value(value)
        return values is not None and all(v == 0 for v in values)
    return False


def _check_shapes(graph: Graph, a: MoeAnatomy) -> None:
    first = a.experts[0]
    inter, hidden = view_shape(graph, first.up)
    down_out, down_in = view_shape(graph, first.down)
    if down_in != inter or down_out != hidden:
        raise _Refuse(f"expert 0's down projection is [{down_out}, {down_in}], not [{hidden}, {inter}]")
    hidden_dtype = graph.dtype(a.hidden)
    # What an expert's check reads of each view: its initializer's dims and dtype, whether it is a slice of a stack,
    # its orientation and rows. Experts alike in these (all of a layer, as a rule) share one verdict.
    verdicts: dict[tuple, str | None] = {}
    initializers = graph.initializers
    for e in a.experts:
        up, down, gate = e.up, e.down, e.gate
        init_up, init_down = initializers[up.initializer], initializers[down.initializer]
        init_gate = initializers[gate.initializer] if gate is not None else None
        key = ((init_up.dims, init_up.dtype, up.index is None, up.transposed, up.rows),
               (init_down.dims, init_down.dtype, down.index is None, down.transposed, down.rows),
               None if gate is None or init_gate is None else (init_gate.dims, init_gate.dtype, gate.index is None,
                                                               gate.transposed, gate.rows))
        if key not in verdicts:
            verdicts[key] = _expert_shape_problem(graph, e, inter, hidden, hidden_dtype)
        problem = verdicts[key]
        if problem is not None:
            raise _Refuse(problem.format(index=e.index))
    a.hidden_size, a.intermediate_size = hidden, inter


def _expert_shape_problem(graph: Graph, e: ExpertAnatomy, inter: int, hidden: int, hidden_dtype: str | None
                          ) -> str | None:
    """Why expert `e` does not match expert 0's [inter, hidden] projections and the hidden state's dtype (a
    template with {index}), or None."""
    shapes = [view_shape(graph, e.up), view_shape(graph, e.down)] + ([view_shape(graph, e.gate)] if e.gate else [])
    expected = [(inter, hidden), (hidden, inter)] + ([(inter, hidden)] if e.gate else [])
    if shapes != expected:
        return "expert {index}'s projections differ in shape from expert 0's"
    dtypes = {graph.initializers[v.initializer].dtype for v in (e.up, e.down, e.gate) if v is not None}
    if len(dtypes) != 1 or dtypes != {hidden_dtype or next(iter(dtypes))}:
        return "expert weights and hidden state differ in dtype"
    return None
