"""Mixture-of-Experts blocks: fused (com.microsoft MoE / QMoE) and computed with standard ops.

An MoE block starts at its router: a linear projection of the hidden state to one logit per expert. In a
fused graph the router logits feed MoE/QMoE's `router_probs`; in an unfused one they feed TopK (and Softmax),
whose result drives per-expert MatMuls through Gather/Scatter/Where/NonZero or a dense weighted sum over
all experts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from ortgate.graph.index import MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import cached, consumers_through, linear_nodes, matmul_weight
from ortgate.knowledge.moe import MOE_OPS, moe_inputs

ROUTING_OPS = frozenset({"TopK", "Softmax", "Sigmoid", "ScatterElements", "ScatterND", "GatherElements", "Gather",
                         "GatherND", "Where", "NonZero", "OneHot", "ReduceSum", "Div", "Equal", "ArgMax"})
MAX_EXPERTS = 4096


@dataclass
class MoeBlock:
    """One MoE layer as found in the graph."""

    router: Node | None  # the projection to expert logits (None for a fused node fed by something else)
    experts: int | None
    layer: int | None
    fused: Node | None = None  # the MoE / QMoE node when fused
    topk: Node | None = None
    routing_nodes: list[Node] = field(default_factory=list)  # TopK/Softmax/Scatter/... of an unfused block
    expert_linears: list[Node] = field(default_factory=list)  # per-expert MatMul/Gemm of an unfused block

    @property
    def top_k(self) -> int | None:
        if self.fused is not None:
            return self.fused.int_attr("k")
        return None

    @property
    def anchor(self) -> Node:
        return self.fused or self.router or self.topk  # type: ignore[return-value]


def fused_moe_nodes(graph: Graph) -> list[Node]:
    return sorted((n for op in MOE_OPS for n in graph.by_op(MS_DOMAIN, op)), key=lambda n: n.index)


def moe_blocks(graph: Graph) -> list[MoeBlock]:
    return cached(graph, "moe_blocks", _find_moe_blocks)


def _find_moe_blocks(graph: Graph) -> list[MoeBlock]:
    blocks: list[MoeBlock] = []
    claimed: set[int] = set()
    for node in fused_moe_nodes(graph):
        positions = moe_inputs(node.op_type)
        fc1 = graph.value(node.input(positions.fc1_experts_weights))
        experts = fc1.shape[0] if fc1 and fc1.shape and isinstance(fc1.shape[0], int) else None
        router = _producer_linear(graph, node.input(positions.router_probs))
        blocks.append(MoeBlock(router, experts, node.layer, fused=node))
        if router is not None:
            claimed.add(router.index)
    for router, experts, topk in _routers(graph):
        if router.index in claimed:
            continue
        block = MoeBlock(router, experts, router.layer if router.layer is not None else topk.layer, topk=topk)
        _collect_unfused(graph, block)
        blocks.append(block)
    blocks.sort(key=lambda b: b.anchor.index)
    return blocks


def _producer_linear(graph: Graph, value: str) -> Node | None:
    from ortgate.graph.patterns.common import producer_through

    node = producer_through(graph, value)
    if node is not None and matmul_weight(graph, node) is not None:
        return node
    return None


def _routers(graph: Graph) -> list[tuple[Node, int, Node]]:
    """(router projection, expert count, TopK) for every TopK over a projection's logits."""
    out = []
    seen: set[int] = set()
    for topk in graph.by_op_type("TopK"):
        router = _router_above(graph, topk.input(0))
        if router is None or router.index in seen:
            continue
        dims = matmul_weight(graph, router)
        experts = dims[-1] if dims else None
        if not experts or not 2 <= experts <= MAX_EXPERTS:
            continue
        seen.add(router.index)
        out.append((router, experts, topk))
    return out


def _router_above(graph: Graph, value: str) -> Node | None:
    """The linear projection producing the logits TopK ranks (through Softmax/Sigmoid/Cast/Reshape)."""
    for _ in range(6):
        node = graph.producer(value)
        if node is None:
            return None
        if matmul_weight(graph, node) is not None:
            return node
        if node.op_type not in ("Softmax", "Sigmoid", "Cast", "Reshape", "Identity", "Add") or not node.inputs:
            return None
        # Add: the router bias (GPT-OSS) or a correction bias; follow the non-constant side.
        value = next((i for i in node.inputs if i and not graph.is_constant(i)), "")
    return None


def _collect_unfused(graph: Graph, block: MoeBlock) -> None:
    """Routing ops downstream of the router, and the expert projections of the same block."""
    assert block.router is not None
    routing: dict[int, Node] = {}
    frontier = [o for o in block.router.outputs if o]
    seen = set(frontier)
    for _ in range(12):  # routing chains are short: logits -> softmax -> topk -> scatter/gather -> mul
        next_frontier = []
        for value in frontier:
            for c in graph.consumers(value):
                if c.op_type in ROUTING_OPS and c.index not in routing:
                    routing[c.index] = c
                    next_frontier.extend(o for o in c.outputs if o and o not in seen)
                    seen.update(c.outputs)
        frontier = next_frontier
    block.routing_nodes = sorted(routing.values(), key=lambda n: n.index)
    hidden = block.router.input(0)
    block.expert_linears = _expert_linears(graph, block, hidden)


def _expert_linears(graph: Graph, block: MoeBlock, hidden: str) -> list[Node]:
    """Linear projections in the block: those of the router's layer that come after it, or, with no layer
    known, those fed (through routing/gather ops) by the router's input."""
    router = block.router
    assert router is not None
    if block.layer is not None:
        layer_linears = _linears_by_layer(graph).get(block.layer, [])
        start = graph.producer(hidden)
        start_index = start.index if start is not None else router.index
        return [n for n in layer_linears if n.index > start_index and n is not router]
    out = []
    for c in consumers_through(graph, hidden, through=("Cast", "Reshape", "Gather", "GatherND", "Mul", "Expand")):
        if c is not router and matmul_weight(graph, c) is not None:
            out.append(c)
    return sorted(out, key=lambda n: n.index)


def _linears_by_layer(graph: Graph) -> dict[int, list[Node]]:
    from ortgate.graph.patterns.projections import projection_dims

    def compute(g: Graph) -> dict[int, list[Node]]:
        out: dict[int, list[Node]] = defaultdict(list)
        found = {n.index: n for n in linear_nodes(g)}
        # torch exports a loop over stacked 3-D expert weights as Gemm(x, Gather(W, e)): a projection too
        for n in g.by_op_type("MatMul", "Gemm"):
            if n.index not in found and projection_dims(g, n) is not None:
                found[n.index] = n
        for n in sorted(found.values(), key=lambda n: n.index):
            if n.layer is not None:
                out[n.layer].append(n)
        return out

    return cached(graph, "linears_by_layer", compute)
