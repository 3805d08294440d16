"""Walks over the graph index shared by the patterns.

One rule for following data: a value seen through ops that only change its shape, layout or element type is still
that value (`VIEW_OPS`, `is_view`). Every walk is bounded by the graph (each value visited once), never by a
depth, so a long chain of reshapes and casts (a legacy traced export's routing weight: Mul <- Reshape <- Reshape
<- Gather <- Flatten <- Unsqueeze <- Cast <- Div <- TopK) is followed to its end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeGuard, TypeVar

from ortgate.graph.index import DEFAULT_DOMAIN, Graph, Node

T = TypeVar("T")

# The one set of pass-through ops every pattern composes its walks from (none keeps a copy of its own):
# QuantizeLinear / DequantizeLinear (a QDQ graph's Q -> DQ around every quantized op: its value, up to rounding),
# the ops that change only the element type (CAST_OPS: Cast, Identity and the Q/DQ pair), and the ops that change
# only the shape (RESHAPE_OPS). Each reads the value as its data input (input 0).
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
CAST_OPS = frozenset({"Cast", "Identity"}) | QDQ_OPS
RESHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
# Ops that change a tensor's shape, layout or element type but not the values it holds, reading it as their data
# input (input 0). Gather picks entries of its data by index (a routing weight gathered for the tokens of one
# expert is still that routing weight; a lookup in a constant table is not a view); a Transpose counts only when it
# moves dims of size 1 (see `is_view`).
VIEW_OPS = RESHAPE_OPS | CAST_OPS | frozenset({"Expand", "Gather", "Transpose"})


def cached(graph: Graph, key: str, compute: Callable[[Graph], T]) -> T:
    """Compute a pattern once per graph."""
    cache = graph.__dict__.setdefault("_pattern_cache", {})
    if key not in cache:
        cache[key] = compute(graph)
    return cache[key]


def memo_table(graph: Graph, key: str) -> dict:
    """A per-graph table for memoising a pure function of the (read-only) graph and its arguments: the walks of
    every expert of every layer ask the same questions of the same values (a weight's dims, a constant's ints)."""
    try:
        return graph.__dict__["_pattern_memo"][key]  # asked once per expert by several walks: the lookup alone
    except KeyError:
        pass
    tables = graph.__dict__.get("_pattern_memo")
    if tables is None:
        tables = graph.__dict__["_pattern_memo"] = {}
    table = tables.get(key)
    if table is None:
        table = tables[key] = {}
    return table


def is_op(node: Node | None, *op_types: str, domain: str = DEFAULT_DOMAIN) -> TypeGuard[Node]:
    return node is not None and node.domain == domain and node.op_type in op_types


def _moves_only_unit_dims(graph: Graph, node: Node) -> bool:
    """A Transpose whose dims of size other than 1 keep their order: it reshapes, it does not permute data.
    An undeclared size is taken as not 1, an undeclared input shape as a real permutation."""
    shape = graph.shape(node.input(0))
    if shape is None:
        return False
    perm = node.attr("perm") or list(reversed(range(len(shape))))
    if sorted(perm) != list(range(len(shape))):
        return False
    kept = [p for p in perm if shape[p] != 1]
    return kept == sorted(kept)


def is_view(graph: Graph, node: Node | None, value: str | None = None,
            through: Iterable[str] | None = None) -> bool:
    """Whether `node` passes `value` (its data input; whatever it is when None) through as a view: an op of the
    default domain reading it as input 0, of VIEW_OPS (a Transpose only if it moves dims of size 1) or of the ops a
    caller names in `through` (taken as they are)."""
    if node is None or node.domain != DEFAULT_DOMAIN or not node.inputs or not node.inputs[0]:
        return False
    if node.op_type not in (VIEW_OPS if through is None else through):
        return False
    if value is not None and node.inputs[0] != value:
        return False  # the value is an index, a shape or a repeat count here, not the data
    if through is None and node.op_type == "Gather" and graph.is_constant(node.inputs[0]):
        return False  # a lookup in a constant table (an embedding, a cos/sin cache): a new value, not a view
    return through is not None or node.op_type != "Transpose" or _moves_only_unit_dims(graph, node)


def view_chain(graph: Graph, value: str, through: Iterable[str] | None = None) -> list[str]:
    """`value` and every value it is a view of, nearest first, up to the first value not produced by a view op."""
    ops = None if through is None else frozenset(through)
    chain = [value]
    seen = {value}
    while True:
        node = graph.producer(value)
        if node is None or not is_view(graph, node, None, ops):
            return chain
        value = node.inputs[0]
        if value in seen:  # only a malformed (cyclic) graph gets here
            return chain
        seen.add(value)
        chain.append(value)


def skip_back(graph: Graph, value: str, through: Iterable[str] | None = None) -> str:
    """Follow `value` upstream through view ops; returns the first value not produced by one."""
    node = graph.producer(value)
    if node is None or not is_view(graph, node, None, None if through is None else frozenset(through)):
        return value  # the usual case: no view in between, nothing to collect
    return view_chain(graph, value, through)[-1]


def producer_through(graph: Graph, value: str, through: Iterable[str] | None = None) -> Node | None:
    """The producer of `skip_back(graph, value, through)`."""
    node = graph.producer(value)
    if node is None or not is_view(graph, node, None, None if through is None else frozenset(through)):
        return node  # no view in between: the producer already looked up is the one
    return graph.producer(view_chain(graph, value, through)[-1])


def views_of(graph: Graph, value: str, through: Iterable[str] | None = None) -> set[str]:
    """`value` and every value downstream that is a view of it."""
    ops = None if through is None else frozenset(through)
    seen = {value}
    frontier = [value]
    while frontier:
        v = frontier.pop()
        for c in graph.consumers(v):
            if is_view(graph, c, v, ops):
                for o in c.outputs[:1]:
                    if o and o not in seen:
                        seen.add(o)
                        frontier.append(o)
    return seen


def consumers_through(graph: Graph, value: str, through: Iterable[str] | None = None) -> list[Node]:
    """Consumers of `value`, looking past view ops (which are not returned themselves)."""
    ops = None if through is None else frozenset(through)
    out: dict[int, Node] = {}
    for v in views_of(graph, value, ops):
        for c in graph.consumers(v):
            if not is_view(graph, c, v, ops):
                out[c.index] = c
    return sorted(out.values(), key=lambda n: n.index)


def find_up(graph: Graph, value: str, match: Callable[[Node], bool],
            follow: Callable[[Node], Iterable[str]]) -> Node | None:
    """The nearest node upstream of `value` (breadth first) that `match`es, walking from each node not matched on
    to the inputs `follow` names (none: that branch ends). Each value is visited once."""
    seen = {value}
    frontier = [value]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            node = graph.producer(v)
            if node is None:
                continue
            if match(node):
                return node
            for i in follow(node):
                if i and i not in seen:
                    seen.add(i)
                    nxt.append(i)
        frontier = nxt
    return None


def find_down(graph: Graph, value: str, match: Callable[[Node, str], bool],
              follow: Callable[[Node, str], Iterable[str]]) -> Node | None:
    """The nearest consumer downstream of `value` (breadth first) that `match`es (the node, the value it reads),
    walking on through the outputs `follow` names for each consumer not matched. Each value is visited once."""
    seen = {value}
    frontier = [value]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for c in graph.consumers(v):
                if match(c, v):
                    return c
                for o in follow(c, v):
                    if o and o not in seen:
                        seen.add(o)
                        nxt.append(o)
        frontier = nxt
    return None


def data_input(node: Node) -> list[str]:
    """A view op's data input, as a `follow` list."""
    return list(node.inputs[:1])


def weight_dims(graph: Graph, value: str) -> tuple[int, ...] | None:
    """Dims of a constant weight feeding `value`, looking through Cast/Transpose/DequantizeLinear.

    A Transpose on the way (torch exports Linear as MatMul(x, Transpose(W))) swaps the last two dims, so
    the result is the weight as the MatMul sees it.
    """
    memo = graph.__dict__.get("_weight_dims_memo")  # memo_table's, looked up without a call: asked most of all
    if memo is None:
        memo = graph.__dict__["_weight_dims_memo"] = {}
    found = memo.get(value, _UNSET)
    if found is _UNSET:
        found = memo[value] = _weight_dims(graph, value)
    return found


_UNSET = object()


def _weight_dims(graph: Graph, value: str) -> tuple[int, ...] | None:
    transposed = False
    seen: set[str] = set()
    while value not in seen:
        seen.add(value)
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


def quantized_weight(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """The [in, out] dims of a MatMulInteger whose second operand is a constant (quantized) weight."""
    if node.domain == DEFAULT_DOMAIN and node.op_type == "MatMulInteger":
        dims = weight_dims(graph, node.input(1))
        return dims if dims is not None and len(dims) == 2 else None
    return None


def dequantized_output(graph: Graph, node: Node) -> str:
    """The real-valued projection a linear computes: its output, or for a MatMulInteger (quantize_dynamic's form)
    the Mul by the scale that dequantizes its int32 output, after the Cast to float."""
    out = node.outputs[0] if node.outputs else ""
    if node.op_type != "MatMulInteger":
        return out
    casts = [c for c in graph.consumers(out) if c.domain == DEFAULT_DOMAIN and c.op_type == "Cast"]
    if len(casts) != 1 or len(graph.consumers(out)) != 1:
        return out
    muls = [c for c in graph.consumers(casts[0].outputs[0]) if c.domain == DEFAULT_DOMAIN and c.op_type == "Mul"]
    if len(muls) != 1 or len(graph.consumers(casts[0].outputs[0])) != 1:
        return out
    return muls[0].outputs[0]


def dequantized_input(graph: Graph, node: Node) -> str:
    """The real-valued input a linear reads: input 0, or for a MatMulInteger the value DynamicQuantizeLinear
    quantized into it."""
    value = node.input(0)
    if node.op_type == "MatMulInteger":
        quant = graph.producer(value)
        if quant is not None and quant.op_type == "DynamicQuantizeLinear" and quant.domain == DEFAULT_DOMAIN:
            return quant.input(0)
    return value


LINEAR_OPS = (("ai.onnx", "MatMul"), ("ai.onnx", "Gemm"), ("com.microsoft", "MatMulNBits"))


def linear_nodes(graph: Graph) -> list[Node]:
    """MatMul / Gemm / MatMulNBits nodes with a constant weight: the model's linear projections."""

    def compute(g: Graph) -> list[Node]:
        out = [n for d, o in LINEAR_OPS for n in g.by_op(d, o) if matmul_weight(g, n) is not None]
        out.sort(key=lambda n: n.index)
        return out

    return list(cached(graph, "linear_nodes", compute))  # a copy: callers may sort or extend theirs
