"""com.microsoft.MoE nodes whose output ORT's planner may place in their input's buffer.

ORT's CPU MoE kernel allows its output to reuse its input's buffer (MayInplace(0, 0)). The planner takes that offer
when the input is an intermediate tensor the MoE node is the last to read, and the output is not a graph output. On
releases whose kernel zeroes the output before reading the input (knowledge/ort_moe.json cpu_inplace_defect, which
also says for which normalize_routing_weights), the node then computes wrong values. This module finds the nodes in
that position; the knowledge says which releases and attribute values it matters for.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortgate.graph.index import MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import cached


@dataclass(frozen=True)
class InplaceCandidate:
    node: Node  # the MoE node
    input: str  # its input 0, an intermediate tensor no later node reads
    producer: Node  # the node computing it
    normalize_routing_weights: int  # as written (absent: ORT's default 0)


def inplace_candidates(graph: Graph) -> list[InplaceCandidate]:
    """Every com.microsoft.MoE node whose input may be handed to its output by ORT's planner."""
    return cached(graph, "moe_inplace_candidates", _find)


def _find(graph: Graph) -> list[InplaceCandidate]:
    graph_outputs = {o.name for o in graph.outputs}
    found = []
    for node in sorted(graph.by_op(MS_DOMAIN, "MoE"), key=lambda n: n.index):
        if node.graph is not None or not node.inputs or not node.outputs or not node.outputs[0]:
            continue  # inside a subgraph: the planner's view of outer values differs; not judged
        value, out = node.inputs[0], node.outputs[0]
        producer = graph.producer(value)
        if producer is None or value in graph.initializers or out in graph_outputs:
            continue
        others = [c for c in graph.consumers(value) if c is not node]
        if others and _any_after(graph, node, {id(c) for c in others}):
            continue  # the input is read again after the node: its buffer outlives the node
        normalize = node.int_attr("normalize_routing_weights", 0)
        found.append(InplaceCandidate(node, value, producer, normalize if normalize is not None else 0))
    return found


def _any_after(graph: Graph, node: Node, targets: set[int]) -> bool:
    """Whether any of `targets` (node ids) depends on `node`'s outputs, i.e. must run after it."""
    seen: set[int] = set()
    stack = [v for v in node.outputs if v]
    while stack:
        for consumer in graph.consumers(stack.pop()):
            if id(consumer) in targets:
                return True
            if id(consumer) not in seen:
                seen.add(id(consumer))
                stack.extend(v for v in consumer.outputs if v)
    return False
