"""Mixture-of-Experts blocks: fused (com.microsoft MoE / QMoE) and computed with standard ops.

A block is recognised by what it computes, not by one op:

- a router: a linear projection of the hidden state x to one logit per expert (width E);
- a selection fed by the router's logits: TopK, or ArgMax / ReduceMax (PhiMoE's sparsemixer), reached through
  any elementwise scoring (Softmax, Sigmoid, a correction bias, masks, group-limited top-k);
- E parallel expert FFNs reading x whose outputs are combined with weights derived from that selection.

The routing region is the forward data flow of the router's logits through nodes whose every input is derived
from the logits or is a constant / shape computation: it ends where routing meets something else (an expert's
output it weights, the tokens it picks, a stacked weight it gathers), so it is bounded by the graph's own
structure, not by a depth. Expert forms (`ExpertForm`):

    dense    every expert runs on every token, its output weighted by a column of the routing matrix
    gather   tokens are dispatched to each expert (NonZero / Where / Gather of the token rows), legacy traced loops
    batched  the stacked expert weights (and biases) are gathered per (token, expert) pair (Gather / GatherND) and
             run as one batched MatMul (transformers' batched_mm)
    fused    com.microsoft MoE / QMoE

Shared experts (an FFN of the same x whose output joins the routed sum unweighted, or scaled by
sigmoid(x @ w_gate)) and their gates are told apart from routed experts: only the routed ones are weighted by the
routing.

`moe_blocks` is the one reading of a graph's MoE layers: lint rules, the cost model and `ortgate fix` all read its
`MoeBlock`s (fix through `moe_anatomy`, the rewrite's detail of a block). Every name a form has elsewhere (its words
in findings, the cost model's form, the rewrite's pattern) is declared with the form here, so a new form is one
edit of this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import (
    VIEW_OPS,
    cached,
    data_input,
    dequantized_input,
    dequantized_output,
    find_down,
    find_up,
    is_op,
    is_view,
    matmul_weight,
    memo_table,
    producer_through,
    quantized_weight,
    skip_back,
    view_chain,
    views_of,
    weight_dims,
)
from ortgate.knowledge.moe import MOE_OPS, moe_inputs

MAX_EXPERTS = 4096
SELECTION_OPS = frozenset({"TopK", "ArgMax"})
# Linear ops of any kind: a projection by a constant weight, or by a gathered (per-expert) one.
_LINEAR_OPS = frozenset({"MatMul", "Gemm", "MatMulNBits", "FusedMatMul", "Einsum", "MatMulInteger"})
# Ops that move or select rows of x without computing on it: x read through them is still x.
_X_VIEW_OPS = VIEW_OPS | frozenset({"Tile", "GatherND", "Slice", "Concat", "Split"})
# Ops the weighted expert outputs are summed with (besides view ops: common.VIEW_OPS).
_ACCUMULATE_OPS = frozenset({"Add", "Sum", "ScatterND", "ScatterElements", "ReduceSum", "Concat"})
_GATHER_OPS = frozenset({"Gather", "GatherND", "GatherElements"})
_SHAPE_SOURCES = frozenset({"Shape", "Size", "Constant", "ConstantOfShape", "Range", "EyeLike"})


class _Form(str, Enum):
    """A form's value is its name in JSON and text (as a StrEnum, which Python 3.10 lacks)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class ExpertForm(_Form):
    """How an MoE block computes its experts (see the module docstring)."""

    DENSE = "dense"
    GATHER = "gather"
    BATCHED = "batched"
    FUSED = "fused"

    @property
    def words(self) -> str:
        """What the form computes, in a finding's words."""
        return _EXPERT_FORM_NAMES[self][0]

    @property
    def cost_form(self) -> str:
        """The cost model's name for the form (a fused QMoE is "fused-quantized")."""
        return _EXPERT_FORM_NAMES[self][1]

    @property
    def rewrite_pattern(self) -> str:
        """The rewrite's name for the unfused form it replaces ("" for a fused block)."""
        return _EXPERT_FORM_NAMES[self][2]


# form -> (words, cost model form, rewrite pattern)
_EXPERT_FORM_NAMES = {
    ExpertForm.DENSE: ("every expert on every token", "dense-loop", "dense_loop"),
    ExpertForm.GATHER: ("tokens gathered per expert", "gather-loop", "gather_loop"),
    ExpertForm.BATCHED: ("stacked expert weights gathered per token, batched MatMul", "gather-per-token",
                         "batched_matmul"),
    ExpertForm.FUSED: ("fused", "fused", ""),
}


class RoutingForm(_Form):
    """How an MoE block turns router logits into k weighted experts."""

    SOFTMAX_TOPK = "softmax_topk"
    TOPK_SOFTMAX = "topk_softmax"
    TOPK_SIGMOID = "topk_sigmoid"
    SIGMOID_TOPK = "sigmoid_topk"
    SIGMOID_GROUP_TOPK = "sigmoid_group_topk"
    GROUP_TOPK = "group_topk"
    SPARSEMIXER = "sparsemixer"
    ARGMAX = "argmax"
    TOPK = "topk"
    FUSED = "fused"

    @property
    def words(self) -> str:
        return _ROUTING_WORDS[self]


_ROUTING_WORDS = {
    RoutingForm.SOFTMAX_TOPK: "softmax -> top-k",
    RoutingForm.TOPK_SOFTMAX: "top-k -> softmax",
    RoutingForm.TOPK_SIGMOID: "top-k -> sigmoid",
    RoutingForm.SIGMOID_TOPK: "sigmoid -> top-k",
    RoutingForm.SIGMOID_GROUP_TOPK: "sigmoid scores, group-limited top-k",
    RoutingForm.GROUP_TOPK: "group-limited top-k",
    RoutingForm.SPARSEMIXER: "sparsemixer (max / masked softmax, no TopK)",
    RoutingForm.ARGMAX: "arg-max (top-1)",
    RoutingForm.TOPK: "top-k over the logits",
    RoutingForm.FUSED: "fused",
}


@dataclass
class ExpertFfn:
    """One expert FFN (or, for the batched form, all routed experts at once)."""

    kind: str  # routed | shared
    projections: list[Node]  # what reads x: gate_up, or gate and up, or fc1
    down: Node | None
    index: int | None = None  # the expert's column in the router logits, when a constant says so
    stacked: int | None = None  # batched form: the number of experts in the gathered weight stack
    gate: Node | None = None  # shared expert: the projection whose sigmoid scales it

    @property
    def linears(self) -> list[Node]:
        return [*self.projections, *([self.down] if self.down is not None else [])]

    def weights(self, graph: Graph) -> dict[str, tuple[str, tuple[int, ...] | None]]:
        """Role -> (weight value, dims as the MatMul sees them) for every linear of the expert."""
        out: dict[str, tuple[str, tuple[int, ...] | None]] = {}
        roles = ["gate_up"] if len(self.projections) == 1 else ["gate", "up"] + [f"fc{i}" for i in range(3, 9)]
        for role, node in zip(roles, self.projections):
            out[role] = (_weight_operand(graph, node), _dims(graph, node))
        if self.down is not None:
            out["down"] = (_weight_operand(graph, self.down), _dims(graph, self.down))
        return out


@dataclass
class MoeBlock:
    """One MoE layer as found in the graph: the one reading of it that rules, the cost model and fix share."""

    router: Node | None  # the projection to expert logits (None for a fused node fed by something else)
    experts: int | None  # E: the router's width (or the fused node's stack)
    layer: int | None
    expert_form: ExpertForm
    routing_form: RoutingForm
    k: int | None = None  # experts per token: the TopK's constant k, the fused node's k, or the picks of a max router
    fused: Node | None = None  # the MoE / QMoE node when fused
    topk: Node | None = None  # the TopK that picks the experts (the last one, for group-limited selection)
    routing_nodes: list[Node] = field(default_factory=list)  # every node of the routing region, TopK included
    expert_linears: list[Node] = field(default_factory=list)  # routed + shared expert linears and shared gates
    selection: list[Node] = field(default_factory=list)  # TopK / ArgMax nodes of the routing region
    normalized: bool | None = None  # top-k weights divided by their sum
    scaled: float | None = None  # a constant factor on the routing weights (DeepSeek routed_scaling_factor)
    routed: list[ExpertFfn] = field(default_factory=list)
    shared: list[ExpertFfn] = field(default_factory=list)
    shared_gates: list[Node] = field(default_factory=list)
    # zero-computation experts (LongCat-Flash): the routing column of each identity expert (None when no constant
    # says which), whose contribution is x times its routing weight, no projection
    zero: list[int | None] = field(default_factory=list)
    zero_nodes: list[Node] = field(default_factory=list)  # the Mul of x by each identity expert's weight
    # "output": the routing weights scale each expert's output (what com.microsoft.MoE computes); "input": they scale
    # the tokens each expert reads (Llama-4: x repeated per expert times its score, then the experts)
    weighting: str = "output"
    combine: Node | None = None  # the node where the routed sum ends (before shared experts join)
    output: str = ""  # the block's output value (routed sum plus shared experts)
    hidden: str = ""  # x: the value the router reads, before reshapes

    @property
    def anchor(self) -> Node:
        return self.fused or self.router or self.topk  # type: ignore[return-value]

    @property
    def routed_experts_found(self) -> int:
        """How many routed experts the graph computes (a batched stack counts its depth)."""
        return sum(e.stacked if e.stacked else 1 for e in self.routed)

    @property
    def experts_found(self) -> int:
        """Every expert the graph computes for the router's columns: routed FFNs and zero-computation experts."""
        return self.routed_experts_found + len(self.zero)

    @property
    def routed_linears(self) -> list[Node]:
        return [n for e in self.routed for n in e.linears]

    @property
    def shared_linears(self) -> list[Node]:
        return [n for e in self.shared for n in e.linears]


@dataclass
class MoeMiss:
    """A router-like structure (a TopK / ArgMax over a projection's logits) that no MoE form reads: the node it is
    anchored on (the router projection, else the selection) and why it was not read, in words. A count of MoE layers
    is a fact only when there is none: rules say "could not decide" with the reason, `ortgate fix` reports it."""

    node: Node
    reason: str
    selection: Node | None = None  # the TopK / ArgMax
    layer: int | None = None

    @property
    def anchor(self) -> Node:
        return self.node

    def describe(self) -> str:
        """One line: the structure and the reason (the words of a finding)."""
        picked = f" ({self.selection.op_type} {self.selection.display_name})" if self.selection is not None else ""
        where = f" in layer {self.layer}" if self.layer is not None else ""
        return f"{self.node.display_name}{picked}{where}: {self.reason}"


@dataclass
class MoeReading:
    """A graph's MoE reading: the blocks read and the router-like structures not read (each with its reason)."""

    blocks: list[MoeBlock]
    misses: list[MoeMiss]


def fused_moe_nodes(graph: Graph) -> list[Node]:
    return sorted((n for op in MOE_OPS for n in graph.by_op(MS_DOMAIN, op)), key=lambda n: n.index)


def moe_reading(graph: Graph) -> MoeReading:
    """The one reading of a graph's MoE layers: blocks and misses, computed once per graph."""
    return cached(graph, "moe_reading", _read_moe)


def moe_blocks(graph: Graph) -> list[MoeBlock]:
    return moe_reading(graph).blocks


def moe_misses(graph: Graph) -> list[MoeMiss]:
    """Router-like structures no MoE form read, each with its node and reason (empty: every router was read)."""
    return moe_reading(graph).misses


def read_moe(graph: Graph) -> list[MoeBlock | MoeMiss]:
    """Every router-like structure of the graph in graph order: read as a block, or explained by a miss."""
    found: list[MoeBlock | MoeMiss] = [*moe_blocks(graph), *moe_misses(graph)]
    return sorted(found, key=lambda b: b.anchor.index)


def _read_moe(graph: Graph) -> MoeReading:
    blocks: list[MoeBlock] = []
    misses: list[MoeMiss] = []
    claimed: set[int] = set()
    for node in fused_moe_nodes(graph):
        positions = moe_inputs(node.op_type)
        fc1 = graph.value(node.input(positions.fc1_experts_weights))
        experts = fc1.shape[0] if fc1 and fc1.shape and isinstance(fc1.shape[0], int) else None
        router = _producer_linear(graph, node.input(positions.router_probs))
        blocks.append(MoeBlock(router, experts, node.layer, ExpertForm.FUSED, RoutingForm.FUSED, node.int_attr("k"),
                               fused=node))
        if router is not None:
            claimed.add(router.index)
    if any(graph.by_op_type(*SELECTION_OPS)):
        fused_routing = _fused_routing(graph, blocks)
        claimed |= fused_routing  # its router, when a selection stands between it and the fused node
        aux = _AuxValues(graph)
        for router, experts in _router_candidates(graph):
            if router.index in claimed:
                continue
            read = _unfused_block(graph, router, experts, aux)
            if isinstance(read, MoeBlock):
                blocks.append(read)
                claimed.update(n.index for n in read.expert_linears)
            elif read is not None:
                misses.append(read)
        misses = [m for m in misses if m.node.index not in claimed]
        misses.extend(_unread_selections(graph, blocks, misses, fused_routing))
    blocks.sort(key=lambda b: b.anchor.index)
    misses.sort(key=lambda m: m.anchor.index)
    return MoeReading(blocks, misses)


def _fused_routing(graph: Graph, blocks: list[MoeBlock]) -> set[int]:
    """The nodes a fused MoE / QMoE node's router_probs is computed by, up to and including the router projection
    (LFM2-MoE selects its experts in the graph, then hands the scores to com.microsoft.MoE)."""
    out: set[int] = set()
    for block in blocks:
        if block.fused is None:
            continue
        value = block.fused.input(moe_inputs(block.fused.op_type).router_probs)
        frontier, seen = [value], {value}
        while frontier:
            node = graph.producer(frontier.pop())
            if node is None or node.index in out:
                continue
            out.add(node.index)
            if node.op_type in _LINEAR_OPS:
                continue  # the router: its input is the hidden state
            for i in node.inputs:
                if i and i not in seen and not graph.is_constant(i):
                    seen.add(i)
                    frontier.append(i)
    return out


# How far up a selection's scores a router projection is looked for (nodes visited): the scoring between them is a
# few elementwise ops (softmax, sigmoid, a bias, a group mask); past this the selection ranks something else.
_SELECTION_REACH = 64


def _unread_selections(graph: Graph, blocks: list[MoeBlock], misses: list[MoeMiss], fused: set[int]) -> list[MoeMiss]:
    """Selections over a projection's logits that neither a block nor a miss holds: each is a miss, anchored on its
    projection, with what kept it from being read."""
    held = set(fused)
    for block in blocks:
        held.update(n.index for n in block.routing_nodes)
        held.update(n.index for n in block.selection)
    held.update(m.selection.index for m in misses if m.selection is not None)
    anchored = {m.node.index for m in misses}
    out: list[MoeMiss] = []
    for node in sorted(graph.by_op_type(*SELECTION_OPS), key=_node_index):
        if node.index in held or node.domain != DEFAULT_DOMAIN or node.graph is not None:
            continue
        projection = _scored_projection(graph, node.input(0))
        if projection is None or projection.index in anchored:
            continue
        dims = matmul_weight(graph, projection) or quantized_weight(graph, projection)
        if dims is None or len(dims) != 2:
            reason = (f"{node.op_type} ranks the output of {projection.op_type} {projection.display_name}, whose "
                      f"weight is not a [hidden, experts] constant (dims {list(dims) if dims else 'unknown'})")
        elif dims[-1] > MAX_EXPERTS:
            continue  # a ranking over a vocabulary (sampling), not a router
        else:
            reason = (f"{node.op_type} ranks {dims[-1]} logits of {projection.display_name}, but no expert output "
                      "weighted by its selection was found")
        anchored.add(projection.index)
        out.append(MoeMiss(projection, reason, node, node.layer if node.layer is not None else projection.layer))
    return out


def _scored_projection(graph: Graph, value: str) -> Node | None:
    """The linear projection by a constant weight whose output `value` scores (through any ops but other linears),
    nearest first; None when the ranking reads no such projection within `_SELECTION_REACH` nodes."""
    seen = {value}
    frontier = [value]
    visited = 0
    while frontier and visited < _SELECTION_REACH:
        nxt: list[str] = []
        for v in frontier:
            node = graph.producer(v)
            if node is None:
                continue
            visited += 1
            if node.op_type in _LINEAR_OPS:
                if matmul_weight(graph, node) is not None or quantized_weight(graph, node) is not None:
                    return node
                continue  # a product of two activations (attention scores): no router above
            if node.op_type in ("MoE", "QMoE") or node.graph is not None:
                continue
            for i in node.inputs:
                if i and i not in seen and not graph.is_constant(i):
                    seen.add(i)
                    nxt.append(i)
        frontier = nxt
    return None


def _producer_linear(graph: Graph, value: str) -> Node | None:
    node = producer_through(graph, value)
    if node is not None and matmul_weight(graph, node) is not None:
        return node
    return None


def _router_candidates(graph: Graph) -> list[tuple[Node, int]]:
    """Projections of x to a few logits: MatMul, Gemm, MatMulNBits, or a MatMulInteger of a quantized weight (its
    logits are the dequantizing Mul after it: `dequantized_output`)."""
    out = []
    weight_memo = _weight_dims_memo(graph)
    for node in sorted(graph.by_op_type("MatMul", "Gemm", "MatMulNBits", "MatMulInteger"), key=_node_index):
        if node.op_type == "MatMul" and node.domain == DEFAULT_DOMAIN:  # matmul_weight's first case, its memo read
            inputs = node.inputs
            weight = inputs[1] if len(inputs) > 1 else ""
            dims = weight_memo.get(weight, _UNSET)
            if dims is _UNSET:
                dims = weight_dims(graph, weight)
        else:
            dims = matmul_weight(graph, node) or quantized_weight(graph, node)
        if dims and len(dims) == 2 and 2 <= dims[-1] <= MAX_EXPERTS:
            out.append((node, dims[-1]))
    return out


class _AuxValues:
    """Whether a value is a constant or computed from constants and tensor shapes only (never from data)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.memo: dict[str, bool] = {}

    def __call__(self, value: str) -> bool:
        if not value:
            return True
        memo = self.memo
        if value in memo:
            return memo[value]
        is_constant, initializers, producer = self.graph.is_constant, self.graph.initializers, self.graph.producer
        stack = [value]
        while stack:
            v = stack[-1]
            if v in memo:
                stack.pop()
                continue
            if is_constant(v) or v in initializers:
                memo[v] = True
                stack.pop()
                continue
            node = producer(v)
            if node is None:
                memo[v] = False
                stack.pop()
                continue
            op_type = node.op_type
            if op_type in _SHAPE_SOURCES and node.domain == DEFAULT_DOMAIN and op_type != "ConstantOfShape":
                memo[v] = True
                stack.pop()
                continue
            if op_type in _LINEAR_OPS or op_type in SELECTION_OPS:
                memo[v] = False
                stack.pop()
                continue
            pending = [i for i in node.inputs if i and i not in memo]
            if pending:
                if len(stack) > 10_000:  # a pathological chain: not a shape computation
                    memo[v] = False
                    stack.pop()
                    continue
                stack.extend(pending)
                continue
            memo[v] = all(memo[i] for i in node.inputs if i)
            stack.pop()
        return memo[value]


@dataclass
class _Region:
    values: set[str]
    nodes: dict[int, Node]
    boundary: dict[int, Node]


def _region_start(graph: Graph, router: Node) -> list[str]:
    return [dequantized_output(graph, router)] if router.op_type == "MatMulInteger" else [o for o in router.outputs if o]


def _outside_for_what_it_is(graph: Graph, c: Node) -> bool:
    """A node no routing region takes in, whatever its inputs: a shape, a projection by a weight, a fused MoE, a node
    of a subgraph."""
    op_type = c.op_type
    return op_type in ("Shape", "Size") or (op_type in _LINEAR_OPS and (
        matmul_weight(graph, c) is not None or quantized_weight(graph, c) is not None)) or op_type in ("MoE", "QMoE") \
        or c.graph is not None


def _may_select(graph: Graph, router: Node) -> bool:
    """Whether a selection (TopK / ArgMax) is reachable from the router's output through nodes a routing region may
    take in: a routing region holds only such nodes, so without one the candidate has no selection (most candidates
    are other projections, whose output flows on to the end of the graph without one). Every value a search that
    found none has visited reaches none either (the search took in all it reaches): those are remembered."""
    barren = memo_table(graph, "moe_no_selection_below")
    start = [v for v in _region_start(graph, router) if v not in barren]
    seen = set(start)
    frontier = list(start)
    consumers = graph.consumers
    while frontier:
        value = frontier.pop()
        for c in consumers(value):
            if c.op_type in SELECTION_OPS and c.domain == DEFAULT_DOMAIN and c.graph is None:
                return True
            if _outside_for_what_it_is(graph, c):
                continue
            for o in c.outputs:
                if o and o not in seen and o not in barren:
                    seen.add(o)
                    frontier.append(o)
    for value in seen:
        barren[value] = True
    return False


def _routing_region(graph: Graph, router: Node, aux: _AuxValues) -> _Region:
    start = _region_start(graph, router)
    values = set(start)
    nodes: dict[int, Node] = {}
    boundary: dict[int, Node] = {}

    def admit(c: Node, frontier: list[str]) -> None:
        nodes[c.index] = c
        for o in c.outputs:
            if o and o not in values:
                values.add(o)
                frontier.append(o)

    # Why a boundary node is outside: the first input neither routing nor aux when it was looked at ("" when it is
    # outside for what it is). Values only join the region, so it stays outside until that input joins.
    outside: dict[int, str] = {}
    known = aux.memo.get  # what aux already settled
    producer, is_constant, initializers = graph.producer, graph.is_constant, graph.initializers

    def inside(c: Node) -> bool:
        op_type = c.op_type
        if op_type in ("Shape", "Size"):
            outside[c.index] = ""
            return False  # its output is a shape (aux), not routing
        if (op_type in _LINEAR_OPS and (matmul_weight(graph, c) is not None or quantized_weight(graph, c) is not None)
                ) or op_type in ("MoE", "QMoE") or c.graph is not None:
            outside[c.index] = ""
            return False
        data = c.inputs[:1] if op_type == "TopK" else c.inputs  # k is a count, whatever computes it
        for i in data:
            if not i or i in values:
                continue
            settled = known(i)
            if settled is None:
                p = producer(i)
                if p is not None and p.op_type in _LINEAR_OPS and not is_constant(i) and i not in initializers:
                    settled = False  # what aux finds at once (an expert's output, as a rule)
                else:
                    settled = aux(i)
            if not settled:
                outside[c.index] = i
                return False
        return True

    frontier = list(start)
    consumers = graph.consumers
    while frontier:
        while frontier:
            value = frontier.pop()
            for c in consumers(value):
                index = c.index
                if index in nodes or index in boundary:
                    continue
                if inside(c):
                    admit(c, frontier)
                else:
                    # It also reads something not derived from the routing: the routing meets the experts here.
                    boundary[c.index] = c
        # A node met before its other routing input was known (Concat of two routing branches) joins the region.
        for index, c in list(boundary.items()):
            if outside[index] in values and inside(c):
                del boundary[index]
                admit(c, frontier)
    return _Region(values, nodes, boundary)


def _unfused_block(graph: Graph, router: Node, experts: int, aux: _AuxValues) -> MoeBlock | MoeMiss | None:
    """The block `router` routes, or a miss saying why none was read; None when no selection ranks its logits (a
    projection that is no router)."""
    if not _may_select(graph, router):
        return None  # what the routing region would find: no selection
    region = _routing_region(graph, router, aux)
    start = set(_region_start(graph, router))
    selection = sorted((n for n in region.nodes.values() if n.op_type in SELECTION_OPS and n.domain == DEFAULT_DOMAIN
                        and _ranks_scores(graph, n, region, start)), key=lambda n: n.index)
    if not selection:
        return None
    hidden = _hidden_root(graph, dequantized_input(graph, router))
    x_values = _x_views(graph, hidden, region.values)
    routed = _routed_experts(graph, router, region, x_values, aux)
    weighting = "output"
    if not routed:
        routed = _input_weighted_experts(graph, region, x_values)
        weighting = "input"
    if not routed:
        layer = router.layer if router.layer is not None else selection[0].layer
        return MoeMiss(router, _why_no_experts(graph, region, x_values, experts), selection[-1], layer)
    form = ExpertForm.DENSE if weighting == "input" else _expert_form(graph, routed, region)  # every expert, every token
    block = MoeBlock(router, experts, None, form, RoutingForm.TOPK, selection=selection, hidden=hidden,
                     weighting=weighting)
    block.routing_nodes = sorted(region.nodes.values(), key=lambda n: n.index)
    block.routed = routed
    block.topk = _main_topk(graph, selection, experts)
    _read_routing_form(graph, block, region)
    routed_linears = {n.index for e in routed for n in e.linears}
    block.zero_nodes = _zero_experts(graph, region, x_values)
    block.zero = [_expert_index(graph, _routing_operand(n, region), None, region.values) for n in block.zero_nodes]
    block.combine, routed_sum = _routed_sum(graph, routed, region, from_outputs=weighting == "input")
    block.shared, block.shared_gates = _shared_experts(graph, router, x_values, routed_linears, routed_sum, region)
    block.output = _block_output(graph, routed_sum, block.shared)
    block.expert_linears = sorted({n.index: n for n in (*block.routed_linears, *block.shared_linears,
                                                          *block.shared_gates)}.values(), key=lambda n: n.index)
    block.layer = router.layer if router.layer is not None else graph.layer_of_nodes([router, *block.routed_linears])
    return block


def _ranks_scores(graph: Graph, selection: Node, region: _Region, start: set[str]) -> bool:
    """Whether a TopK / ArgMax ranks scores computed from the router's logits, not only the expert indices another
    TopK picked (a sort of the tokens by expert, which torch exports as TopK: transformers' exporter's grouped_mm)."""
    frontier, seen = [selection.input(0)], {selection.input(0)}
    while frontier:
        value = frontier.pop()
        if value in start:
            return True
        node = graph.producer(value)
        if node is None or node.index not in region.nodes or node.op_type in SELECTION_OPS:
            continue  # outside the routing, or another selection's output: not the scores themselves
        for i in node.inputs:
            if i and i not in seen and i in region.values:
                seen.add(i)
                frontier.append(i)
    return False


def _routing_operand(node: Node, region: _Region) -> str:
    return next((i for i in node.inputs if i in region.values), "")


def _feeds_linear(graph: Graph, value: str) -> bool:
    """Whether `value` (through views and elementwise ops) is read by a linear op: an input of some projection."""
    return find_down(graph, value, lambda n, _: n.op_type in _LINEAR_OPS,
                     lambda n, v: n.outputs[:1] if is_view(graph, n, v, _X_VIEW_OPS) or n.op_type in ("Mul", "Div")
                     else []) is not None


def _zero_experts(graph: Graph, region: _Region, x_values: set[str]) -> list[Node]:
    """Zero-computation (identity) experts: the routing weight times x itself, joining the sum with no projection
    (LongCat-Flash). A product of x and the routing that some projection reads is input-side weighting, not one."""
    out = []
    for node in sorted(region.boundary.values(), key=_node_index):
        if node.op_type != "Mul" or node.domain != DEFAULT_DOMAIN or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        if not ((a in region.values and b in x_values) or (b in region.values and a in x_values)):
            continue
        if not _feeds_linear(graph, node.outputs[0]):
            out.append(node)
    return out


def _input_weighted_experts(graph: Graph, region: _Region, x_values: set[str]) -> list[ExpertFfn]:
    """Experts whose input the routing scales (Llama-4): a product of x (repeated per expert) and the routing weights
    read by a projection by a constant [E, H, N] expert stack (all experts as one batched MatMul), through its
    activation to the down projection by an [E, N, H] stack. The experts are those stacks' depth."""
    out: list[ExpertFfn] = []
    for node in sorted(region.boundary.values(), key=_node_index):
        if node.op_type != "Mul" or node.domain != DEFAULT_DOMAIN or len(node.inputs) != 2:
            continue
        if not any(i in x_values for i in node.inputs) or not any(i in region.values for i in node.inputs):
            continue
        scaled = views_of(graph, node.outputs[0], _X_VIEW_OPS)
        first = next((c for v in sorted(scaled) for c in graph.consumers(v) if c.op_type in _LINEAR_OPS), None)
        dims = matmul_weight(graph, first) if first is not None else None
        if first is None or dims is None or len(dims) != 3:
            continue
        down = _down_below(graph, first, x_values | scaled)
        down_dims = matmul_weight(graph, down) if down is not None else None
        if down is None or down_dims is None or len(down_dims) != 3 or down_dims[0] != dims[0]:
            continue
        out.append(ExpertFfn("routed", [first], down, stacked=dims[0]))
    return out


def _why_no_experts(graph: Graph, region: _Region, x_values: set[str], experts: int) -> str:
    """Why a routing with a selection weights no expert the graph computes, in words."""
    for node in sorted(region.boundary.values(), key=_node_index):
        if node.op_type in ("Mul", "Div") and any(i in x_values for i in node.inputs) and \
                _feeds_linear(graph, node.outputs[0]):
            return (f"the routing over {experts} experts scales the experts' input ({node.op_type} "
                    f"{node.display_name} of the hidden state by the routing weights, input-side weighting as in "
                    "Llama-4), not their outputs: a form ortgate does not read")
    meets = sorted({n.op_type for n in region.boundary.values()})
    attention = _feeds_attention_scores(graph, region)
    if attention is not None:
        return (f"the routing over {experts} experts selects projections whose outputs reach the attention scores "
                f"({attention.op_type} {attention.display_name}): a mixture of attention heads (JetMoE's MoA), not "
                "an FFN MoE layer")
    return (f"the routing over {experts} experts weights no expert output computed from the router's input "
            f"(it meets the graph at {', '.join(meets) or 'no node'}): an expert form ortgate does not read")


# How far past a routing's boundary its selected projections are followed to attention scores (nodes visited).
_ATTENTION_REACH = 256
# Where that walk ends: a norm (the next sub-layer's attention is always behind one) or another selection.
_WALK_ENDS = SELECTION_OPS | frozenset({"ReduceMean", "LayerNormalization", "SimplifiedLayerNormalization",
                                        "SkipSimplifiedLayerNormalization", "SkipLayerNormalization",
                                        "RMSNormalization"})


def _feeds_attention_scores(graph: Graph, region: _Region) -> Node | None:
    """The Softmax of attention scores (over a MatMul of two activations) that what the routing selects reaches
    before any norm, within `_ATTENTION_REACH` nodes: its experts are attention projections. None when none."""
    frontier = [o for n in region.boundary.values() for o in n.outputs if o]
    seen = set(frontier)
    visited = 0
    while frontier and visited < _ATTENTION_REACH:
        nxt: list[str] = []
        for value in frontier:
            for c in graph.consumers(value):
                visited += 1
                if c.op_type == "Softmax" and _scores_of_two_activations(graph, c.input(0)):
                    return c
                if c.op_type in _WALK_ENDS:
                    continue
                for o in c.outputs:
                    if o and o not in seen:
                        seen.add(o)
                        nxt.append(o)
        frontier = nxt
    return None


def _scores_of_two_activations(graph: Graph, value: str) -> bool:
    """Whether `value` is (through scaling, masking and views) a MatMul of two computed operands: q @ k^T."""
    node = find_up(graph, value, lambda n: n.op_type == "MatMul",
                   lambda n: [i for i in n.inputs if i and not graph.is_constant(i)][:1]
                   if n.op_type in ("Div", "Mul", "Add", "Where", "Cast", "Reshape", "Transpose") else [])
    return node is not None and all(i and not graph.is_constant(i) and weight_dims(graph, i) is None
                                    for i in node.inputs[:2])


def _hidden_root(graph: Graph, value: str) -> str:
    return skip_back(graph, value)


def _x_views(graph: Graph, hidden: str, routing: set[str]) -> set[str]:
    """x and every value that is x moved, reshaped, repeated or with rows selected (through data input 0)."""
    seen = {hidden}
    frontier = [hidden]
    while frontier:
        value = frontier.pop()
        for c in graph.consumers(value):
            if c.domain != DEFAULT_DOMAIN or c.op_type not in _X_VIEW_OPS or not c.inputs:
                continue
            if c.op_type != "Concat" and c.inputs[0] != value:
                continue  # x is the index or the shape here, not the data
            for o in c.outputs:
                if o and o not in seen and o not in routing:
                    seen.add(o)
                    frontier.append(o)
    return seen


def _is_linear(graph: Graph, node: Node) -> bool:
    return node.op_type in _LINEAR_OPS


def _routed_experts(graph: Graph, router: Node, region: _Region, x_values: set[str], aux: _AuxValues) -> list[ExpertFfn]:
    """Expert FFNs whose output is weighted by a routing value: each one's down projection, traced back to x."""
    routed: dict[int, ExpertFfn] = {}
    values = region.values
    producer = graph.producer  # once per block
    for node in sorted(region.boundary.values(), key=_node_index):
        if node.op_type not in ("Mul", "Div") or node.domain != DEFAULT_DOMAIN or len(node.inputs) != 2:
            continue
        a, b = node.inputs
        a_routing = a in values
        if a_routing == (b in values):
            continue
        weight, expert_out = (a, b) if a_routing else (b, a)
        down = producer(expert_out)
        if down is None or down.op_type not in _LINEAR_OPS or down.domain not in (DEFAULT_DOMAIN, MS_DOMAIN):
            down = _down_above(graph, expert_out)  # through views and a bias Add (its first step is the one above)
        downs = [down] if down is not None else _concatenated_downs(graph, expert_out)
        found = []
        for down in downs:
            if down.index in routed or down is router:
                continue
            expert = _routed_expert(graph, down, weight, values, x_values)
            if expert is not None:
                routed[down.index] = expert
                found.append(expert)
        if len(downs) > 1 and len(found) == len(downs):
            _pair_sorted_projections(found)
    return sorted(routed.values(), key=lambda e: e.down.index if e.down else 0)


def _pair_sorted_projections(experts: list[ExpertFfn]) -> None:
    """Experts of tokens sorted by expert whose activations are computed over all rows at once and sliced per
    expert for the down projection: each down traces back to every expert's projections. Each expert keeps its own,
    in order (the i-th projection of each kind is the i-th expert's)."""
    shared = experts[0].projections
    n = len(experts)
    if any(e.projections != shared for e in experts) or len(shared) % n:
        return
    per = len(shared) // n
    for i, e in enumerate(experts):
        e.projections = [shared[j * n + i] for j in range(per)]


def _concatenated_downs(graph: Graph, value: str) -> list[Node]:
    """The per-expert down projections whose outputs a Concat joins into `value` (the rows of tokens sorted by expert:
    transformers' exporter's translation of grouped_mm), each through views and a bias Add; [] when it is not that."""
    concat = graph.producer(skip_back(graph, value))
    if not is_op(concat, "Concat") or len(concat.inputs) < 2:
        return []
    downs = [_down_above(graph, i) for i in concat.inputs if i]
    return [d for d in downs if d is not None] if all(d is not None for d in downs) else []


def _routed_expert(graph: Graph, down: Node, weight: str, values: set[str], x_values: set[str]) -> ExpertFfn | None:
    """The routed expert whose down projection `down` is (its output weighted by `weight`), traced back to x."""
    producer, is_constant = graph.producer, graph.is_constant
    weight_memo, gather_memo = _weight_dims_memo(graph), memo_table(graph, "moe_gather_above")
    data = []
    for i in down.inputs[:2]:  # _data_inputs, its memos read directly
        if not i or is_constant(i):
            continue
        dims = weight_memo.get(i, _UNSET)
        if dims is _UNSET:
            dims = weight_dims(graph, i)
        if dims is not None:
            continue
        gathered = gather_memo.get(i, _UNSET)
        if gathered is _UNSET:
            gathered = _gather_above(graph, i)
        if gathered is None or _stack_dims(graph, gathered) is None:
            data.append(i)
    projections = _projections_of(producer, is_constant, data, x_values, values)
    if not projections:
        return None
    stacked = _stack_depth(graph, down, values)
    return ExpertFfn("routed", projections, down, index=_expert_index(graph, weight, down, values),
                     stacked=stacked)


def _down_above(graph: Graph, value: str) -> Node | None:
    """The linear whose output `value` is, through view ops, a bias Add and the Cast -> Mul(scale) that dequantizes a
    MatMulInteger's output (quantize_dynamic's form)."""
    node = graph.producer(value)
    if node is not None and node.op_type in _LINEAR_OPS and node.domain in (DEFAULT_DOMAIN, MS_DOMAIN):
        return node  # the walk's first step
    return find_up(graph, value, lambda n: n.domain in (DEFAULT_DOMAIN, MS_DOMAIN) and _is_linear(graph, n),
                   lambda n: _view_or_bias_input(graph, n) or _dequantized_from(graph, n))


def _dequantized_from(graph: Graph, node: Node) -> list[str]:
    """The MatMulInteger output a Mul by its scale dequantizes (through the Cast to float), as a `follow` list."""
    if node.op_type != "Mul" or node.domain != DEFAULT_DOMAIN:
        return []
    for i in node.inputs:
        cast = graph.producer(i)
        source = graph.producer(cast.inputs[0]) if cast is not None and cast.op_type == "Cast" and cast.inputs else None
        if source is not None and source.op_type == "MatMulInteger" and dequantized_output(graph, source) == \
                node.outputs[0]:
            return [cast.inputs[0]] if cast is not None else []
    return []


def _view_or_bias_input(graph: Graph, node: Node) -> list[str]:
    """The value a view op, or the Add of a constant bias, passes on."""
    if is_view(graph, node):
        return list(node.inputs[:1])
    if _bias_add(graph, node):
        return [next(i for i in node.inputs if not _bias_operand(graph, i))]
    return []


def _bias_add(graph: Graph, node: Node) -> bool:
    return node.domain == DEFAULT_DOMAIN and node.op_type == "Add" and len(node.inputs) == 2 and any(
        _bias_operand(graph, i) for i in node.inputs) and not all(_bias_operand(graph, i) for i in node.inputs)


def _bias_operand(graph: Graph, value: str) -> bool:
    """A constant bias, or an expert's bias row gathered from an [E, N] stack by the routing (batched experts)."""
    if weight_dims(graph, value) is not None or graph.is_constant(value):
        return True
    node = graph.producer(value)
    if node is None or node.domain != DEFAULT_DOMAIN or node.op_type not in ("Gather", "GatherND") or len(node.inputs) < 2:
        return False
    dims = weight_dims(graph, node.inputs[0])
    return dims is not None and len(dims) == 2 and not graph.is_constant(node.inputs[1])


def _projections_of(producer: Callable[[str], Node | None], is_constant: Callable[[str], bool], start: list[str],
                    x_values: set[str], routing: set[str]) -> list[Node]:
    """The linears reading x that feed a down projection (from its data inputs `start`) through the expert's
    activation, not through another linear; the graph's tables are bound once per block."""
    out: dict[int, Node] = {}
    seen: set[str] = set()
    frontier = list(start)
    while frontier:
        value = frontier.pop()
        if value in seen or value in x_values or value in routing:
            continue
        seen.add(value)
        node = producer(value)
        if node is None:
            continue
        if node.op_type in _LINEAR_OPS:  # _is_linear
            for i in node.inputs:
                if i in x_values:
                    out[node.index] = node
                    break
            else:
                if node.op_type == "MatMulInteger" and _quantized_from(producer, node) in x_values:
                    out[node.index] = node  # x quantized by DynamicQuantizeLinear (quantize_dynamic's form)
            continue
        for i in node.inputs:
            if i and not is_constant(i):  # every initializer is a constant
                frontier.append(i)
    if len(out) < 2:
        return list(out.values())
    return sorted(out.values(), key=_node_index)


def _quantized_from(producer: Callable[[str], Node | None], node: Node) -> str:
    """The float value a MatMulInteger's input 0 is DynamicQuantizeLinear of ("" when it is not)."""
    quant = producer(node.inputs[0]) if node.inputs else None
    return quant.inputs[0] if quant is not None and quant.op_type == "DynamicQuantizeLinear" and quant.inputs else ""


_node_index = attrgetter("index")  # a sort key, read in C


def _data_inputs(graph: Graph, linear: Node) -> list[str]:
    """The activation operand(s) of a linear: not its weight, not a gathered weight stack."""
    return [i for i in linear.inputs[:2] if _is_data_input(graph, i)]


def _is_data_input(graph: Graph, value: str) -> bool:
    """Whether a linear's operand `value` is an activation: not a weight, not a gathered weight stack."""
    if not value or graph.is_constant(value):
        return False
    dims = _weight_dims_memo(graph).get(value, _UNSET)
    if dims is _UNSET:
        dims = weight_dims(graph, value)
    if dims is not None:
        return False
    gathered = memo_table(graph, "moe_gather_above").get(value, _UNSET)
    if gathered is _UNSET:
        gathered = _gather_above(graph, value)
    return gathered is None or _stack_dims(graph, gathered) is None


_UNSET = object()


def _weight_dims_memo(graph: Graph) -> dict:
    """`weight_dims`'s memo (read directly where a loop asks it of every expert; a miss still calls weight_dims)."""
    memo = graph.__dict__.get("_weight_dims_memo")
    if memo is None:
        memo = graph.__dict__["_weight_dims_memo"] = {}
    return memo


def _gather_above(graph: Graph, value: str) -> Node | None:
    """The Gather / GatherND / GatherElements `value` is a view of (the nearest one), or None."""
    memo = memo_table(graph, "moe_gather_above")
    if value not in memo:
        memo[value] = _find_gather_above(graph, value)
    return memo[value]


def _find_gather_above(graph: Graph, value: str) -> Node | None:
    node = graph.producer(value)
    if node is None or (node.op_type not in _GATHER_OPS and node.op_type not in VIEW_OPS):
        return None  # neither a gather nor a view: the walk's first step ends it (a weight, an activation)
    return find_up(graph, value, lambda n: n.domain == DEFAULT_DOMAIN and n.op_type in _GATHER_OPS and len(n.inputs) > 1,
                   lambda n: data_input(n) if is_view(graph, n) else [])


def _gathered_stack(graph: Graph, value: str) -> tuple[int, ...] | None:
    """Dims of a stacked [E, ...] constant that `value` gathers experts from (Gather / GatherND, through views)."""
    node = _gather_above(graph, value)
    if node is None:
        return None
    return _stack_dims(graph, node)


def _stack_dims(graph: Graph, gather: Node) -> tuple[int, ...] | None:
    dims = weight_dims(graph, gather.inputs[0])
    return dims if dims is not None and len(dims) >= 3 else None


def _stack_depth(graph: Graph, down: Node, routing: set[str]) -> int | None:
    """Batched form: the expert stack a down projection gathers its weight from by routing-derived indices."""
    gather_memo = memo_table(graph, "moe_gather_above")
    is_constant = graph.is_constant
    for i in down.inputs[:2]:
        if not i or is_constant(i):
            continue  # a constant is no gather's output (a weight of the dense loop)
        node = gather_memo.get(i, _UNSET)
        if node is _UNSET:
            node = _gather_above(graph, i)
        if node is not None and node.op_type in ("Gather", "GatherND") and node.inputs[1] in routing:
            dims = weight_dims(graph, node.inputs[0])
            if dims is not None and len(dims) >= 3:
                return dims[0]
    return None


def _expert_index(graph: Graph, weight: str, down: Node | None, routing: set[str]) -> int | None:
    """The expert a dense-loop contribution belongs to: a constant Gather index of its stacked weight, or the
    constant column its routing weight is sliced / gathered from (looked for inside the routing region)."""
    producer = graph.producer
    for i in down.inputs[:2] if down is not None else ():
        node = producer(i) if i else None
        if node is not None and node.op_type == "Gather" and len(node.inputs) > 1:
            index = graph.scalar(node.inputs[1])
            if isinstance(index, int):
                return index
    first = producer(weight)
    index = _column(graph, first) if first is not None else None
    if index is not None:
        return index  # the walk's first step
    found = find_up(graph, weight, lambda n: _column(graph, n) is not None,
                    lambda n: [i for i in n.inputs[:1] if i in routing])
    return _column(graph, found) if found is not None else None


def _column(graph: Graph, node: Node) -> int | None:
    """The constant expert column a Slice [e:e+1] or a Gather e of the routing takes, or None."""
    op_type = node.op_type
    if op_type == "Slice" and len(node.inputs) >= 3:
        start, end = graph.constant_value(node.inputs[1]), graph.constant_value(node.inputs[2])
        if start and end and len(start) == 1 and len(end) == 1 and end[0] == start[0] + 1:
            return int(start[0])
    if op_type == "Gather" and len(node.inputs) > 1:
        index = graph.scalar(node.inputs[1])
        if isinstance(index, int):
            return index
    return None


def _main_topk(graph: Graph, selection: list[Node], experts: int) -> Node | None:
    topks = [n for n in selection if n.op_type == "TopK"]
    if not topks:
        return None
    over_experts = [n for n in topks if (s := graph.shape(n.input(0))) and isinstance(s[-1], int) and s[-1] == experts]
    return (over_experts or topks)[-1]


def _ancestors_in(graph: Graph, value: str, nodes: dict[int, Node], stop: set[int]) -> list[Node]:
    out: dict[int, Node] = {}
    frontier = [value]
    seen: set[str] = set()
    while frontier:
        v = frontier.pop()
        if v in seen:
            continue
        seen.add(v)
        node = graph.producer(v)
        if node is None or node.index not in nodes or node.index in stop:
            continue
        out[node.index] = node
        frontier.extend(i for i in node.inputs if i)
    return list(out.values())


def _read_routing_form(graph: Graph, block: MoeBlock, region: _Region) -> None:
    nodes = region.nodes
    topks = [n for n in block.selection if n.op_type == "TopK"]
    ops = {n.op_type for n in nodes.values()}
    if block.topk is not None:
        block.k = _topk_k(graph, block.topk)
        before = {n.op_type for n in _ancestors_in(graph, block.topk.input(0), nodes, set())}
        after_values = {block.topk.outputs[0]}
        after = [n for n in nodes.values() if n.index > block.topk.index]
        softmax_after = any(n.op_type == "Softmax" and any(i in after_values or _derived(graph, i, block.topk.outputs[0])
                                                           for i in n.inputs) for n in after)
        if len(topks) > 1:
            block.routing_form = RoutingForm.SIGMOID_GROUP_TOPK if "Sigmoid" in before else RoutingForm.GROUP_TOPK
        elif "Softmax" in before:
            block.routing_form = RoutingForm.SOFTMAX_TOPK
        elif "Sigmoid" in before:
            block.routing_form = RoutingForm.SIGMOID_TOPK
        elif softmax_after:
            block.routing_form = RoutingForm.TOPK_SOFTMAX
        elif any(n.op_type == "Sigmoid" for n in after):
            block.routing_form = RoutingForm.TOPK_SIGMOID  # Llama-4: the top-k logits scattered, then their sigmoid
        else:
            block.routing_form = RoutingForm.TOPK
    else:
        argmax = [n for n in block.selection if n.op_type == "ArgMax"]
        block.k = len(argmax) or None
        block.routing_form = RoutingForm.SPARSEMIXER if len(argmax) > 1 and "Softmax" in ops else RoutingForm.ARGMAX
    block.normalized = any(n.op_type == "Div" and n.domain == DEFAULT_DOMAIN and sum_of_weights(
        graph, n.input(1), lambda r: r.index in nodes, lambda v: (p := graph.producer(v)) is not None and p.index in nodes)
        is not None for n in nodes.values())
    scale = None
    for n in nodes.values():
        if n.op_type == "Mul" and len(n.inputs) == 2:
            for i in n.inputs:
                v = graph.scalar(i)
                if isinstance(v, (int, float)) and v not in (0, 1) and not (region.values & {i}):
                    scale = float(v)
    block.scaled = scale if scale is not None and block.routing_form in (
        RoutingForm.SIGMOID_GROUP_TOPK, RoutingForm.GROUP_TOPK, RoutingForm.SIGMOID_TOPK) else None


def _topk_k(graph: Graph, topk: Node) -> int | None:
    """k of a TopK: its constant k input (opset >= 10) or its k attribute (opset 1)."""
    value = graph.constant_value(topk.input(1)) if topk.input(1) else None
    if value is not None:
        return int(value[0]) if len(value) == 1 else None
    k = topk.int_attr("k")
    return int(k) if k else None


def _produced_by(graph: Graph, value: str, op_types: Iterable[str]) -> bool:
    producer = graph.producer(value)
    return producer is not None and producer.op_type in op_types


# Reductions a renormalisation divides the top-k weights by: their sum, or their L1 norm (equal for weights >= 0).
RENORM_REDUCTIONS = frozenset({"ReduceSum", "ReduceL1"})
# Ops between that reduction and the Div that keep it the sum: an epsilon added, a clamp from below (Clip, Max).
_RENORM_GUARDS = frozenset({"Add", "Clip", "Max"})


def sum_of_weights(graph: Graph, divisor: str, reduction: Callable[[Node], bool],
                   inner: Callable[[str], bool] = lambda v: True) -> Node | None:
    """The ReduceSum / ReduceL1 a divisor is, recognised by what it computes (Qwen3 and Mixtral divide by the sum,
    DBRX by the L1 norm, ERNIE by the sum clamped to a minimum): through views, the Add of an epsilon, a Clip or a
    Max of a constant, and Adds of a few weights (the sum written out). `reduction` says which reduction counts (it
    reads the weights divided); `inner` which values the walk may follow."""
    def follow(n: Node) -> list[str]:
        if n.domain != DEFAULT_DOMAIN:
            return []
        if is_view(graph, n):
            return [i for i in n.inputs[:1] if inner(i)]
        if n.op_type == "Clip":
            bounds = [i for i in n.inputs[1:] if i]
            return [n.inputs[0]] if inner(n.inputs[0]) and all(graph.is_constant(i) for i in bounds) else []
        if n.op_type in _RENORM_GUARDS:
            return [i for i in n.inputs if i and not graph.is_constant(i) and inner(i)]
        return []

    return find_up(graph, divisor, lambda n: n.domain == DEFAULT_DOMAIN and n.op_type in RENORM_REDUCTIONS
                   and reduction(n), follow)


def _derived(graph: Graph, value: str, source: str) -> bool:
    return source in view_chain(graph, value)


def _routed_sum(graph: Graph, routed: list[ExpertFfn], region: _Region, *, from_outputs: bool = False,
                ) -> tuple[Node | None, set[str]]:
    """The accumulation of the weighted expert outputs: its values, and the node where it ends. With input-side
    weighting (`from_outputs`) the experts' outputs themselves are summed."""
    starts: list[str] = []
    routing = region.values
    for e in routed:
        assert e.down is not None
        if from_outputs:
            starts.extend(o for o in e.down.outputs[:1] if o)
            continue
        readers = _consumers_through(graph, e.down.outputs[0])
        for c in [r for r in readers if r.op_type == "Concat"]:  # the rows of tokens sorted by expert, joined
            readers.extend(_consumers_through(graph, c.outputs[0]))
        for c in readers:
            if c.op_type in ("Mul", "Div"):
                for i in c.inputs:
                    if i in routing:  # weighted by the routing
                        starts.extend(o for o in c.outputs if o)
                        break
    values = set(starts)
    # The first expert's contribution is taken first (popped last): a chain of Adds over the experts then joins in
    # one pass, each Add's other operand already in the sum (what joins does not depend on the order).
    frontier = starts[::-1]
    last: Node | None = None
    consumers = graph.consumers
    while frontier:
        value = frontier.pop()
        for c in consumers(value):
            op_type = c.op_type
            if (c.domain != DEFAULT_DOMAIN or op_type not in _ACCUMULATE_OPS) and not is_view(graph, c, value) and not (
                    op_type == "GatherND" and c.inputs[0] == value and c.input(1) in routing):
                continue  # (a GatherND by routing indices puts rows of tokens sorted by expert back in token order)
            if op_type in ("Add", "Sum", "Concat"):
                joined = True  # every other input is in the sum, or a weighted expert output
                for i in c.inputs:
                    if i and i != value and i not in values and not _weighted(graph, i, region):
                        joined = False
                        break
                if not joined:
                    continue
            elif op_type in ("ScatterND", "ScatterElements") and c.inputs and c.inputs[0] == value and any(
                    i and i != value and i not in values and i not in routing for i in c.inputs):
                continue
            for o in c.outputs:
                if o and o not in values:
                    values.add(o)
                    frontier.append(o)
                    if last is None or c.index > last.index:
                        last = c
    return last, values


def _weighted(graph: Graph, value: str, region: _Region) -> bool:
    """A routing-weighted expert output, or an all-zeros start of the sum."""
    node = graph.producer(value)
    if node is None:
        return graph.is_constant(value)
    if node.op_type in ("Mul", "Div") and any(i in region.values for i in node.inputs):
        return True
    if node.op_type in ("Expand", "ConstantOfShape") or graph.is_constant(value):
        return all(graph.is_constant(i) or _produced_by(graph, i, _SHAPE_SOURCES)
                   or _produced_by(graph, i, ("Concat", "Reshape", "Unsqueeze"))
                   for i in node.inputs if i)
    return False


def _consumers_through(graph: Graph, value: str) -> list[Node]:
    """Consumers of `value` past view ops and the Add of a constant bias."""
    consumers = graph.consumers
    first = consumers(value)
    for c in first:
        if c.op_type in VIEW_OPS or c.op_type == "Add":
            break
    else:
        return list(first)  # the usual case (an expert's down projection read by its weighting Mul): no view, no Add
    out = []
    frontier = [value]
    seen = {value}
    while frontier:
        v = frontier.pop()
        for c in consumers(v):
            op_type = c.op_type
            if op_type not in VIEW_OPS and op_type != "Add":
                out.append(c)  # neither a view nor a bias Add, whatever its inputs
            elif is_view(graph, c, v) or _bias_add(graph, c):
                for o in c.outputs[:1]:
                    if o and o not in seen:
                        seen.add(o)
                        frontier.append(o)
            else:
                out.append(c)
    return out


def _shared_experts(graph: Graph, router: Node, x_values: set[str], routed_linears: set[int], routed_sum: set[str],
                    region: _Region) -> tuple[list[ExpertFfn], list[Node]]:
    """FFNs of the same x whose output joins the routed sum unweighted (or scaled by a sigmoid gate)."""
    readers: dict[int, Node] = {}
    for v in x_values:
        for c in graph.consumers(v):
            if _is_linear(graph, c) and c is not router and c.index not in routed_linears:
                readers[c.index] = c
    downs: dict[int, tuple[Node, list[Node]]] = {}
    gates: dict[int, Node] = {}
    for p in readers.values():
        down = _down_below(graph, p, x_values)
        if down is not None:
            downs.setdefault(down.index, (down, []))[1].append(p)
        else:
            gates[p.index] = p
    shared: list[ExpertFfn] = []
    used_gates: list[Node] = []
    for _, (down, projections) in sorted(downs.items()):
        joined, gate = _joins_sum(graph, down, routed_sum, gates)
        if not joined:
            continue
        shared.append(ExpertFfn("shared", sorted(projections, key=lambda n: n.index), down, gate=gate))
        if gate is not None:
            used_gates.append(gate)
    return shared, used_gates


def _down_below(graph: Graph, projection: Node, x_values: set[str]) -> Node | None:
    """The next linear with a constant weight after `projection`, through its activation (one FFN)."""
    frontier = [o for o in projection.outputs if o]
    seen = set(frontier)
    found: Node | None = None
    while frontier:
        value = frontier.pop()
        for c in graph.consumers(value):
            if _is_linear(graph, c):
                if matmul_weight(graph, c) is not None and value in _data_inputs(graph, c) and (
                        found is None or c.index < found.index):
                    found = c
                continue
            if c.op_type not in ("Mul", "Sigmoid", "Split", "Slice", "Gather", "Relu", "Gelu", "FastGelu", "Tanh", "Erf",
                                 "Div", "Add", "Clip", "Min", "Max", "Pow", "Softplus", "Cast", "Reshape", "Identity",
                                 "Squeeze", "Unsqueeze", "Sub", "QuickGelu", "BiasGelu", "Neg", "Exp", "Sqrt",
                                 "HardSigmoid", "HardSwish", "Swish", "Silu", "Elu", "LeakyRelu", "Mish"):
                continue
            if c.op_type in ("Mul", "Add", "Div", "Sub") and any(i in x_values for i in c.inputs):
                continue  # the FFN's output re-joins x: a residual, not the FFN
            if c.op_type in ("Add", "Sub") and all(i and not graph.is_constant(i) and weight_dims(graph, i) is None
                                                   for i in c.inputs):
                continue  # a sum of two computed values is where FFN outputs are combined, past any down projection
            for o in c.outputs:
                if o and o not in seen:
                    seen.add(o)
                    frontier.append(o)
    return found


def _joins_sum(graph: Graph, down: Node, routed_sum: set[str], gates: dict[int, Node]) -> tuple[bool, Node | None]:
    """Whether a shared FFN's output is added to the routed sum (directly or scaled by a gate projection)."""
    gate: Node | None = None
    frontier = [o for o in down.outputs if o]
    seen = set(frontier)
    while frontier:
        next_frontier = []
        for value in frontier:
            for c in graph.consumers(value):
                if c.domain != DEFAULT_DOMAIN:
                    continue
                if c.op_type in ("Add", "Sum") and any(i in routed_sum for i in c.inputs if i != value):
                    return True, gate
                if c.op_type == "Mul":
                    other = next((i for i in c.inputs if i != value), "")
                    g = _gate_above(graph, other, gates)
                    if g is None:
                        continue
                    gate = g
                elif not is_view(graph, c, value) and not _bias_add(graph, c):
                    continue
                for o in c.outputs[:1]:
                    if o and o not in seen:
                        seen.add(o)
                        next_frontier.append(o)
        frontier = next_frontier
    return False, None


def _gate_above(graph: Graph, value: str, gates: dict[int, Node]) -> Node | None:
    """The shared-expert gate projection `value` is the sigmoid of (through view ops)."""
    return find_up(graph, value, lambda n: n.index in gates,
                   lambda n: n.inputs[:1] if is_view(graph, n) or is_view(graph, n, None, ("Sigmoid",)) else [])


def _block_output(graph: Graph, routed_sum: set[str], shared: list[ExpertFfn]) -> str:
    last = ""
    last_index = -1
    producer = graph.producer
    for v in routed_sum:
        node = producer(v)
        if node is not None and node.index > last_index:
            last, last_index = v, node.index
    return last


def _expert_form(graph: Graph, routed: list[ExpertFfn], region: _Region) -> ExpertForm:
    if any(e.stacked for e in routed):
        return ExpertForm.BATCHED
    looked: set[str] = set()  # the experts of a dense loop all read the same x: it is looked at once
    is_constant = graph.is_constant
    for e in routed:
        for p in e.projections:
            for i in p.inputs[:2]:
                if i in looked or not i or is_constant(i) or not _is_data_input(graph, i):  # a data input is looked at
                    continue
                looked.add(i)
                if _selected_rows(graph, i, region.values):
                    return ExpertForm.GATHER
    return ExpertForm.DENSE


def _selected_rows(graph: Graph, value: str, routing: set[str]) -> bool:
    """x rows picked by routing-derived indices (token dispatch)."""
    return find_up(graph, value,
                   lambda n: n.op_type in _GATHER_OPS and len(n.inputs) > 1 and n.inputs[1] in routing,
                   lambda n: n.inputs[:1] if is_view(graph, n, None, _X_VIEW_OPS) else []) is not None


def _weight_operand(graph: Graph, node: Node) -> str:
    for i in node.inputs[1:2] + node.inputs[:1]:
        if i and (weight_dims(graph, i) is not None or _gathered_stack(graph, i) is not None):
            return i
    return node.input(1)


def _dims(graph: Graph, node: Node) -> tuple[int, ...] | None:
    dims = matmul_weight(graph, node)
    if dims is not None:
        return dims
    for i in node.inputs[:2]:
        stack = _gathered_stack(graph, i) if i else None
        if stack is not None:
            return stack
        d = weight_dims(graph, i) if i else None
        if d is not None:
            return d
    return None
