"""Rotary position embedding: fused nodes and the decomposed rotate_half pattern.

Fused: com.microsoft RotaryEmbedding / MRotaryEmbedding / GemmaRotaryEmbedding, ONNX (opset 23) RotaryEmbedding,
and GroupQueryAttention with do_rotary=1 (it rotates q and k itself from cos/sin caches). Always matched by
(domain, op_type): the two RotaryEmbedding ops take their inputs in different orders.

Decomposed (what torch exports of transformers' apply_rotary_pos_emb look like):

    x1, x2 = Slice(x, :half), Slice(x, half:)        (or one Split; ORT's dumps turn the Slices into a Split)
    rotated = Concat(Neg(x2), x1, axis=-1)
    out = Add(Mul(x, cos), Mul(rotated, sin))         (cos/sin from Sin/Cos nodes or from cached tables)

The anchor is each Neg; the walk checks the Concat, both Muls and the Add around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import cached, is_op

FUSED_ROTARY_OPS = (
    (MS_DOMAIN, "RotaryEmbedding"),
    (MS_DOMAIN, "MRotaryEmbedding"),
    (MS_DOMAIN, "GemmaRotaryEmbedding"),
    (DEFAULT_DOMAIN, "RotaryEmbedding"),  # ONNX opset 23: (X, cos, sin, position_ids)
)
_HALF_OPS = ("Slice", "Split", "Gather")
_BETWEEN_OPS = ("Unsqueeze", "Reshape", "Concat", "Cast", "Identity")
_TABLE_OPS = frozenset({"Unsqueeze", "Cast", "Gather", "GatherND", "Slice", "Expand", "Reshape", "Transpose", "Squeeze",
                        "Concat", "Identity", "Mul", "Tile"})


@dataclass
class DecomposedRotary:
    """One rotate_half rotary applied to one tensor (q or k)."""

    neg: Node
    add: Node
    input: str  # x
    output: str
    layer: int | None
    trig: list[Node] = field(default_factory=list)  # the Sin/Cos nodes feeding cos/sin (empty: cached tables)
    nodes: list[Node] = field(default_factory=list)


def decomposed_rotaries(graph: Graph) -> list[DecomposedRotary]:
    return cached(graph, "decomposed_rotaries", _find)


def rotary_by_output(graph: Graph) -> dict[str, DecomposedRotary]:
    return cached(graph, "decomposed_rotary_outputs", lambda g: {r.output: r for r in decomposed_rotaries(g)})


def _find(graph: Graph) -> list[DecomposedRotary]:
    out = []
    for neg in graph.by_op_type("Neg"):
        match = _match_at(graph, neg)
        if match is not None:
            out.append(match)
    return out


def _half_source(graph: Graph, value: str) -> tuple[str, Node] | None:
    node = graph.producer(value)
    if is_op(node, *_HALF_OPS) and node.inputs:
        return node.inputs[0], node
    return None


def _match_at(graph: Graph, neg: Node) -> DecomposedRotary | None:
    half = _half_source(graph, neg.input(0))
    if half is None or not neg.outputs:
        return None
    x, slicer = half
    nodes = [slicer, neg]
    # Neg -> (Unsqueeze/Reshape/Concat)* -> Mul(., sin): the Concat must also take the other half of x.
    value, concat_ok, mul_sin = neg.outputs[0], False, None
    for _ in range(4):
        consumers = graph.consumers(value)
        if len(consumers) != 1:
            return None
        node = consumers[0]
        if is_op(node, "Mul"):
            mul_sin = node
            break
        if not is_op(node, *_BETWEEN_OPS):
            return None
        if is_op(node, "Concat"):
            others = [i for i in node.inputs if i and i != value]
            concat_ok = any((src := _half_source(graph, o)) is not None and src[0] == x for o in others)
        nodes.append(node)
        value = node.outputs[0]
    if mul_sin is None or not concat_ok:
        return None
    nodes.append(mul_sin)
    add = next((c for c in graph.consumers(mul_sin.outputs[0]) if is_op(c, "Add")), None)
    if add is None:
        return None
    other = add.input(1) if add.input(0) == mul_sin.outputs[0] else add.input(0)
    mul_cos = graph.producer(other)
    if not is_op(mul_cos, "Mul") or x not in mul_cos.inputs:
        return None
    nodes += [mul_cos, add]
    trig = []
    for mul, operand_of in ((mul_sin, value), (mul_cos, x)):
        table = mul.input(1) if mul.input(0) == operand_of else mul.input(0)
        trig.extend(_trig_above(graph, table))
    return DecomposedRotary(neg, add, x, add.outputs[0], graph.layer_of_nodes(nodes), trig, nodes)


def _trig_above(graph: Graph, value: str) -> list[Node]:
    """Sin/Cos nodes a cos/sin operand is computed from (a few hops up), or [] for cached tables."""
    frontier = [value]
    for _ in range(6):
        nxt = []
        for v in frontier:
            node = graph.producer(v)
            if node is None:
                continue
            if is_op(node, "Sin", "Cos"):
                return [node]
            if node.domain == DEFAULT_DOMAIN and node.op_type in _TABLE_OPS:
                nxt.extend(i for i in node.inputs[:1] if i)
        frontier = nxt
    return []
