"""Small walks over the graph index shared by the patterns."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeGuard, TypeVar

from ortgate.graph.index import DEFAULT_DOMAIN, Graph, Node

T = TypeVar("T")

# Ops that pass a tensor through without changing what it means for pattern matching.
TRANSPARENT_OPS = frozenset({"Cast", "Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten"})


def cached(graph: Graph, key: str, compute: Callable[[Graph], T]) -> T:
    """Compute a pattern once per graph."""
    cache = graph.__dict__.setdefault("_pattern_cache", {})
    if key not in cache:
        cache[key] = compute(graph)
    return cache[key]


def is_op(node: Node | None, *op_types: str, domain: str = DEFAULT_DOMAIN) -> TypeGuard[Node]:
    return node is not None and node.domain == domain and node.op_type in op_types


def skip_back(graph: Graph, value: str, through: Iterable[str] = TRANSPARENT_OPS, limit: int = 8) -> str:
    """Follow `value` upstream through pass-through ops; returns the first value not produced by one."""
    through = frozenset(through)
    for _ in range(limit):
        node = graph.producer(value)
        if node is None or node.domain != DEFAULT_DOMAIN or node.op_type not in through or not node.inputs:
            return value
        value = node.inputs[0]
    return value


def producer_through(graph: Graph, value: str, through: Iterable[str] = TRANSPARENT_OPS, limit: int = 8) -> Node | None:
    return graph.producer(skip_back(graph, value, through, limit))


def consumers_through(graph: Graph, value: str, through: Iterable[str] = TRANSPARENT_OPS, limit: int = 8) -> list[Node]:
    """Consumers of `value`, looking past pass-through ops (which are not returned themselves)."""
    through = frozenset(through)
    out: list[Node] = []
    frontier = [value]
    seen = {value}
    for _ in range(limit):
        next_frontier = []
        for v in frontier:
            for c in graph.consumers(v):
                if c.domain == DEFAULT_DOMAIN and c.op_type in through:
                    for o in c.outputs:
                        if o and o not in seen:
                            seen.add(o)
                            next_frontier.append(o)
                else:
                    out.append(c)
        if not next_frontier:
            break
        frontier = next_frontier
    return out


def weight_dims(graph: Graph, value: str) -> tuple[int, ...] | None:
    """Dims of a constant weight feeding `value`, looking through Cast/Transpose/DequantizeLinear.

    A Transpose on the way (torch exports Linear as MatMul(x, Transpose(W))) swaps the last two dims, so
    the result is the weight as the MatMul sees it.
    """
    transposed = False
    for _ in range(6):
        init = graph.initializers.get(value)
        if init is not None:
            dims = init.dims
            if transposed and len(dims) >= 2:
                dims = dims[:-2] + (dims[-1], dims[-2])
            return dims
        node = graph.producer(value)
        if node is None:
            return None
        if node.op_type == "Constant":
            tensor = node.attr("value")
            return getattr(tensor, "dims", None)
        if node.op_type == "Transpose" and node.domain == DEFAULT_DOMAIN:
            transposed = not transposed
        elif node.op_type not in ("Cast", "DequantizeLinear", "Identity"):
            return None
        value = node.inputs[0] if node.inputs else ""
    return None


def is_weight(graph: Graph, value: str) -> bool:
    return weight_dims(graph, value) is not None


def matmul_weight(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The [in, out] dims of a MatMul/Gemm/MatMulNBits whose second operand is a constant weight."""
    if node.domain == DEFAULT_DOMAIN and node.op_type == "MatMul":
        return weight_dims(graph, node.input(1))
    if node.domain == DEFAULT_DOMAIN and node.op_type == "Gemm":
        dims = weight_dims(graph, node.input(1))
        if dims is not None and len(dims) == 2 and node.attr("transB", 0):
            return (dims[1], dims[0])
        return dims
    if node.domain == "com.microsoft" and node.op_type in ("MatMulNBits", "FusedMatMul"):
        k, n = node.int_attr("K"), node.int_attr("N")
        if k and n:
            return (k, n)
        return weight_dims(graph, node.input(1))
    return None


LINEAR_OPS = (("ai.onnx", "MatMul"), ("ai.onnx", "Gemm"), ("com.microsoft", "MatMulNBits"))


def linear_nodes(graph: Graph) -> list[Node]:
    """MatMul / Gemm / MatMulNBits nodes with a constant weight: the model's linear projections."""

    def compute(g: Graph) -> list[Node]:
        out = [n for d, o in LINEAR_OPS for n in g.by_op(d, o) if matmul_weight(g, n) is not None]
        out.sort(key=lambda n: n.index)
        return out

    return list(cached(graph, "linear_nodes", compute))  # a copy: callers may sort or extend theirs
