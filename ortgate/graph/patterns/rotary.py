"""Rotary position embedding: fused nodes and the decomposed rotate_half pattern.

Fused: com.microsoft RotaryEmbedding / MRotaryEmbedding / GemmaRotaryEmbedding, ONNX (opset 23) RotaryEmbedding,
and GroupQueryAttention with do_rotary=1 (it rotates q and k itself from cos/sin caches). Always matched by
(domain, op_type): the two RotaryEmbedding ops take their inputs in different orders.

Decomposed (what torch exports of transformers' apply_rotary_pos_emb look like):

    x1, x2 = Slice(x, :half), Slice(x, half:)        (or one Split; ORT's dumps turn the Slices into a Split)
    rotated = Concat(Neg(x2), x1, axis=-1)
    out = Add(Mul(x, cos), Mul(rotated, sin))         (cos/sin from Sin/Cos nodes or from cached tables)

The anchor is each Neg; the walk checks the Concat, both Muls and the Add around it.

The same rotation written without Neg (GPT-OSS; DeepSeek-V3's interleaved rotary) computes both halves apart:

    a, b = halves of x              (Slice / Split: [:half], [half:])   or   (Slice step 2: [0::2], [1::2])
                                    or (Gather 0 / 1 of x viewed as pairs [..., d/2, 2]: Llama-4)
    out = Concat(a * cos - b * sin, b * cos + a * sin)

anchored on the Sub. Either way the `pairing` says which components rotate together: "half" (x[i] with
x[i + d/2], rotate_half, RotaryEmbedding interleaved=0) or "interleaved" (x[2i] with x[2i+1], interleaved=1 /
GroupQueryAttention rotary_interleaved=1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import (
    CAST_OPS,
    QDQ_OPS,
    VIEW_OPS,
    cached,
    consumers_through,
    find_up,
    is_op,
    skip_back,
)

FUSED_ROTARY_OPS = (
    (MS_DOMAIN, "RotaryEmbedding"),
    (MS_DOMAIN, "MRotaryEmbedding"),
    (MS_DOMAIN, "GemmaRotaryEmbedding"),
    (DEFAULT_DOMAIN, "RotaryEmbedding"),  # ONNX opset 23: (X, cos, sin, position_ids)
)
_HALF_OPS = ("Slice", "Split", "Gather")
_BETWEEN_OPS = ("Unsqueeze", "Reshape", "Concat", *sorted(CAST_OPS))
_TABLE_OPS = VIEW_OPS | frozenset({"GatherND", "Slice", "Concat", "Mul", "Tile"})


@dataclass
class DecomposedRotary:
    """One decomposed rotary applied to one tensor (q or k)."""

    neg: Node  # the anchor: the Neg of rotate_half, or the Sub of the two-halves form
    add: Node
    input: str  # x
    output: str
    layer: int | None
    trig: list[Node] = field(default_factory=list)  # the Sin/Cos nodes feeding cos/sin (empty: cached tables)
    nodes: list[Node] = field(default_factory=list)
    pairing: str = "half"  # half | interleaved
    form: str = "neg"  # neg (rotate_half with Neg) | sub (both halves rotated apart, joined by Concat)


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
    for sub in graph.by_op_type("Sub"):
        match = _match_sub(graph, sub)
        if match is not None:
            out.append(match)
    out.sort(key=lambda r: r.neg.index)
    return out


def _unq(graph: Graph, value: str) -> str:
    """`value` before any QuantizeLinear -> DequantizeLinear a QDQ graph wraps it in."""
    return skip_back(graph, value, QDQ_OPS)


def _producer(graph: Graph, value: str) -> Node | None:
    return graph.producer(_unq(graph, value))


def _consumers(graph: Graph, value: str) -> list[Node]:
    """The consumers of `value`, past the QuantizeLinear -> DequantizeLinear of a QDQ graph."""
    return consumers_through(graph, value, QDQ_OPS)


def _half_source(graph: Graph, value: str) -> tuple[str, Node] | None:
    node = _producer(graph, value)
    if is_op(node, "Unsqueeze", "Reshape") and node.inputs:  # stack(-x2, x1) of the interleaved form
        node = _producer(graph, node.inputs[0])
    elif is_op(node, "Squeeze") and node.inputs and is_op(graph.producer(node.inputs[0]), "Split"):
        node = graph.producer(node.inputs[0])  # ORT's dump of a Gather 0 / 1 over pairs: Split, then Squeeze
    if is_op(node, *_HALF_OPS) and node.inputs:
        return _unq(graph, node.inputs[0]), node
    return None


def _step(graph: Graph, slicer: Node) -> int | None:
    if not is_op(slicer, "Slice"):
        return 1
    if len(slicer.inputs) < 5 or not slicer.input(4):
        return 1
    steps = graph.constant_value(slicer.input(4))
    return int(steps[0]) if steps and len(steps) == 1 else None


def _pairing(graph: Graph, slicers: list[Node]) -> str:
    return "interleaved" if any(_step(graph, s) == 2 or _pair_select(graph, s) for s in slicers) else "half"


def _pair_select(graph: Graph, node: Node) -> bool:
    """A Gather of element 0 or 1 on the last axis of x viewed as pairs ([..., d/2, 2]: Llama-4's complex rotary in
    real numbers, view_as_complex): the components x[2i] and x[2i+1], the interleaved pairing. ORT's dump writes
    the two Gathers as one Split in two whose outputs are squeezed on the split axis (so the axis held 2)."""
    if is_op(node, "Split") and len(node.outputs) == 2:
        axis = node.int_attr("axis") or 0
        for out in node.outputs:
            readers = graph.consumers(out)
            if not readers or not all(is_op(r, "Squeeze") and len(r.inputs) > 1 and (
                    (axes := graph.constant_value(r.inputs[1])) is not None and list(axes) == [axis]) for r in readers):
                return False
        shape = graph.shape(node.inputs[0]) if node.inputs else None
        return axis == -1 or shape is None or axis == len(shape) - 1
    if not is_op(node, "Gather") or len(node.inputs) < 2:
        return False
    index = graph.scalar(node.inputs[1])
    shape = graph.shape(node.inputs[0])
    if index not in (0, 1) or not shape or shape[-1] != 2:
        return False
    axis = node.int_attr("axis") or 0
    return axis in (-1, len(shape) - 1)


def _mul_parts(graph: Graph, value: str) -> tuple[str, str] | None:
    """(operand, table) of Mul(operand, table), the operand being a half of some x."""
    node = _producer(graph, value)
    if not is_op(node, "Mul") or len(node.inputs) != 2:
        return None
    a, b = node.inputs
    if _half_source(graph, a) is not None:
        return a, b
    if _half_source(graph, b) is not None:
        return b, a
    return None


def _match_sub(graph: Graph, sub: Node) -> DecomposedRotary | None:
    """Concat(a*cos - b*sin, b*cos + a*sin) with a, b two halves of one x."""
    if len(sub.inputs) != 2 or not sub.outputs:
        return None
    left, right = _mul_parts(graph, sub.input(0)), _mul_parts(graph, sub.input(1))
    if left is None or right is None:
        return None
    (a, cos), (b, sin) = left, right
    src_a, src_b = _half_source(graph, a), _half_source(graph, b)
    if src_a is None or src_b is None or src_a[0] != src_b[0] or src_a[1] is src_b[1] and a == b:
        return None
    x = src_a[0]
    # The partner: Add(b * cos, a * sin), joined with the Sub by a Concat (directly, or stacked and reshaped).
    for concat in _joins(graph, sub.outputs[0]):
        for other in concat.inputs:
            add = graph.producer(_through(graph, other))
            if not is_op(add, "Add") or add is sub or len(add.inputs) != 2:
                continue
            parts = [_mul_parts(graph, i) for i in add.inputs]
            if any(p is None for p in parts):
                continue
            operands = {p[0] for p in parts if p}
            tables = {p[1] for p in parts if p}
            if operands != {a, b} or tables != {cos, sin}:
                continue
            muls = [graph.producer(i) for i in (*sub.inputs, *add.inputs)]
            slicers = [src_a[1], src_b[1]]
            nodes = sorted({n.index: n for n in [*slicers, *muls, sub, add, concat] if n is not None}.values(),
                           key=lambda n: n.index)
            output = concat.outputs[0]
            after = graph.consumers(output)
            if len(after) == 1 and is_op(after[0], "Reshape"):  # the interleaved form's flatten of the pairs
                nodes.append(after[0])
                output = after[0].outputs[0]
            trig = _trig_above(graph, cos) + _trig_above(graph, sin)
            return DecomposedRotary(sub, add, x, output, graph.layer_of_nodes(nodes), trig, nodes,
                                    pairing=_pairing(graph, slicers), form="sub")
    return None


def _through(graph: Graph, value: str) -> str:
    node = graph.producer(value)
    if is_op(node, "Unsqueeze", "Reshape") and node.inputs:
        return node.inputs[0]
    return value


def _joins(graph: Graph, value: str) -> list[Node]:
    out = []
    for c in graph.consumers(value):
        if is_op(c, "Concat"):
            out.append(c)
        elif is_op(c, "Unsqueeze", "Reshape"):
            out.extend(n for n in graph.consumers(c.outputs[0]) if is_op(n, "Concat"))
    return out


def _match_at(graph: Graph, neg: Node) -> DecomposedRotary | None:
    half = _half_source(graph, neg.input(0))
    if half is None or not neg.outputs:
        return None
    x, slicer = half
    nodes = [slicer, neg]
    # Neg -> (Unsqueeze/Reshape/Concat)* -> Mul(., sin): the Concat must also take the other half of x.
    value, concat_ok, mul_sin = neg.outputs[0], False, None
    seen: set[str] = set()
    while value not in seen:
        seen.add(value)
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
    add = next((c for c in _consumers(graph, mul_sin.outputs[0]) if is_op(c, "Add")), None)
    if add is None:
        return None
    other = add.input(1) if _unq(graph, add.input(0)) == mul_sin.outputs[0] else add.input(0)
    mul_cos = _producer(graph, other)
    if not is_op(mul_cos, "Mul") or x not in {_unq(graph, i) for i in mul_cos.inputs}:
        return None
    nodes += [mul_cos, add]
    trig = []
    for mul, operand_of in ((mul_sin, value), (mul_cos, x)):
        table = mul.input(1) if _unq(graph, mul.input(0)) == _unq(graph, operand_of) else mul.input(0)
        trig.extend(_trig_above(graph, table))
    slicers = [n for n in nodes if is_op(n, *_HALF_OPS)]
    return DecomposedRotary(neg, add, x, add.outputs[0], graph.layer_of_nodes(nodes), trig, nodes,
                            pairing=_pairing(graph, slicers), form="neg")


@dataclass
class RotaryMiss:
    """Sin / Cos tables applied to an activation (a Mul of x by cos or sin) that no rotary form read: the Mul and why."""

    node: Node
    trig: Node
    reason: str
    layer: int | None


def rotary_misses(graph: Graph) -> list[RotaryMiss]:
    """Every Mul of an activation by a table computed from Sin / Cos in the graph that no decomposed rotary holds
    (a rotary applied with such tables is fused when the tables feed a fused op instead): each a miss with its
    reason, so that a rotary no form reads is said, never passed over."""
    return cached(graph, "rotary_misses", _find_misses)


def _find_misses(graph: Graph) -> list[RotaryMiss]:
    trig = [n for n in graph.by_op_type("Sin", "Cos") if n.domain == DEFAULT_DOMAIN and n.graph is None]
    if not trig:
        return []
    held = {n.index for r in decomposed_rotaries(graph) for n in r.nodes}
    out: dict[int, RotaryMiss] = {}
    for t in sorted(trig, key=lambda n: n.index):
        for mul in _applications(graph, t):
            if mul.index not in held and mul.index not in out:
                out[mul.index] = RotaryMiss(mul, t, f"{mul.op_type} {mul.display_name} multiplies an activation by a "
                                            f"table of {t.op_type} {t.display_name}, but no rotary form (rotate_half "
                                            "with Neg, or both halves rotated apart and joined) was read around it",
                                            mul.layer)
    return sorted(out.values(), key=lambda m: m.node.index)


def _applications(graph: Graph, trig: Node) -> list[Node]:
    """The Muls that apply a Sin / Cos table to an activation: reached from the trig node through the ops that
    index, reshape, cast or scale a table (a Mul by a constant scales it), not through another activation."""
    found: list[Node] = []
    frontier = [o for o in trig.outputs if o]
    seen = set(frontier)
    while frontier:
        value = frontier.pop()
        for c in graph.consumers(value):
            if c.domain != DEFAULT_DOMAIN or c.graph is not None:
                continue
            others = [i for i in c.inputs if i and i != value]
            if c.op_type == "Mul" and any(not graph.is_constant(i) and not _is_table(graph, i) for i in others):
                found.append(c)  # x * cos: the table meets an activation
                continue
            if c.op_type not in _TABLE_OPS:
                continue
            for o in c.outputs:
                if o and o not in seen:
                    seen.add(o)
                    frontier.append(o)
    return found


def _is_table(graph: Graph, value: str) -> bool:
    """Whether `value` is itself computed from Sin / Cos or constants only (a table times a table, cos * scale)."""
    return find_up(graph, value, lambda n: is_op(n, "Sin", "Cos"),
                   lambda n: n.inputs[:1] if n.domain == DEFAULT_DOMAIN and n.op_type in _TABLE_OPS else []) is not None


def _trig_above(graph: Graph, value: str) -> list[Node]:
    """Sin/Cos nodes a cos/sin operand is computed from (through the ops that index, reshape or scale a table),
    or [] for cached tables."""
    node = find_up(graph, value, lambda n: is_op(n, "Sin", "Cos"),
                   lambda n: n.inputs[:1] if n.domain == DEFAULT_DOMAIN and n.op_type in _TABLE_OPS else [])
    return [node] if node is not None else []
