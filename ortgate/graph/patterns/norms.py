"""RMSNorm as ORT sees it: fused nodes (SimplifiedLayerNormalization, com.microsoft SkipSimplifiedLayerNormalization,
ONNX RMSNormalization) and the decomposed chain exporters write:

    x2 = Pow(x, 2) | Mul(x, x)
    ms = ReduceMean(x2, axes=[-1])
    r  = Sqrt(Add(ms, eps)) ;  y = Div(x, r)  |  y = Mul(x, Reciprocal(r))  |  y = Mul(x, Div(1, r))
                                                                                  (or Pow(ms + eps, -0.5))
    y  = Mul(gamma, y)                                                            (optional Casts around it)

Each decomposed norm gets a `form` key of ort_fusions.json's SimplifiedLayerNormFusion table, which says whether
ORT's own fusion repairs it. Per-head norms (Qwen3's q_norm / k_norm) are told apart from hidden-state norms
by their width.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import (
    CAST_OPS,
    QDQ_OPS,
    RESHAPE_OPS,
    cached,
    consumers_through,
    is_op,
    skip_back,
    weight_dims,
)

FUSED_RMSNORM_OPS = (
    (DEFAULT_DOMAIN, "SimplifiedLayerNormalization"),
    (MS_DOMAIN, "SkipSimplifiedLayerNormalization"),
    (DEFAULT_DOMAIN, "RMSNormalization"),  # ONNX opset 23
)
# Fused norms whose epsilon attribute matters (gated RMSNorm of linear-attention layers included).
EPSILON_NORM_OPS = FUSED_RMSNORM_OPS + (
    (MS_DOMAIN, "SkipLayerNormalization"),
    (DEFAULT_DOMAIN, "LayerNormalization"),
    (MS_DOMAIN, "GatedRMSNorm"),
)


@dataclass
class DecomposedRmsNorm:
    """One RMSNorm computed with standard ops."""

    reduce_mean: Node
    normalize: Node  # the Div or the Mul by the reciprocal: where the normalised value appears
    input: str  # x as the chain reads it (after a leading Cast)
    source: str  # x before any leading Cast
    output: str  # the normalised value after gamma (and a trailing Cast)
    form: str  # a key of ort_fusions.json's SimplifiedLayerNormFusion rmsnorm_forms
    epsilon: float | None
    gamma: str | None
    width: int | None  # normalised width (gamma's length)
    head_norm: bool  # a per-head norm (q_norm / k_norm), narrower than the hidden state
    layer: int | None
    nodes: list[Node] = field(default_factory=list)
    # hidden: the residual stream's norm | head: per-head (q_norm / k_norm over head_dim, after the split into
    # heads) | projection: over a projection's whole output (MLA's q_a / kv_a latent norms, OLMoE's q/k norms)
    role: str = "hidden"
    # what the normalised value feeds (head and projection norms): "attention" (a q/k norm), "projection" (another
    # linear projection: MLA's low-rank latent, a state-space mixer's dt), "other" (neither: a state-space mixer's
    # B/C, a gated output norm)
    feeds: str = "attention"
    # a LayerNorm without bias (Cohere, Cohere2): x - ReduceMean(x) first, then the RMS chain over the centred value;
    # its fusion is LayerNormalization (no bias), not SimplifiedLayerNormalization
    centred: bool = False

    @property
    def last(self) -> Node:
        return self.nodes[-1]


def fused_rmsnorm_nodes(graph: Graph) -> list[Node]:
    return sorted((n for d, o in FUSED_RMSNORM_OPS for n in graph.by_op(d, o)), key=lambda n: n.index)


def hidden_size(graph: Graph) -> int | None:
    """The model's hidden width: the token embedding table's second dim."""

    def compute(g: Graph) -> int | None:
        inputs = {i.name for i in g.inputs}
        for node in g.by_op_type("Gather"):
            init = g.initializers.get(node.input(0))
            if init is not None and len(init.dims) == 2 and node.input(1) in inputs:
                return init.dims[1]
        return None

    return cached(graph, "hidden_size", compute)


def decomposed_rmsnorms(graph: Graph) -> list[DecomposedRmsNorm]:
    return cached(graph, "decomposed_rmsnorms", _find_decomposed)


def norm_by_output(graph: Graph) -> dict[str, DecomposedRmsNorm]:
    """Decomposed norms keyed by their output value (to step over a norm when walking upstream)."""
    return cached(graph, "decomposed_rmsnorm_outputs", lambda g: {m.output: m for m in decomposed_rmsnorms(g)})


def _single(graph: Graph, value: str, *op_types: str) -> Node | None:
    consumers = [c for c in _qdq_view(graph)[1](value) if is_op(c, *op_types)]
    return consumers[0] if len(consumers) == 1 else None


def _other_input(node: Node, value: str) -> str:
    a, b = node.input(0), node.input(1)
    return b if a == value else a


def _same_source(graph: Graph, a: str, b: str) -> bool:
    return a == b or skip_back(graph, a, CAST_OPS) == skip_back(graph, b, CAST_OPS)


def _unq(graph: Graph, value: str) -> str:
    """`value` before the QuantizeLinear -> DequantizeLinear a QDQ graph wraps it in (itself in any other graph)."""
    return skip_back(graph, value, QDQ_OPS)


def _other_input_q(graph: Graph, node: Node, value: str) -> str:
    """The operand of a binary `node` that is not `value` (`value` as the chain computed it, before any Q/DQ)."""
    a, b = node.input(0), node.input(1)
    return b if _unq(graph, a) == value else a


def _qdq_view(graph: Graph):
    """(producer, consumers) that see past a QDQ graph's QuantizeLinear -> DequantizeLinear: the chain's nodes."""
    if not graph.count(DEFAULT_DOMAIN, "DequantizeLinear"):
        return graph.producer, graph.consumers  # the usual graph: no Q/DQ to look past
    return (lambda v: graph.producer(_unq(graph, v))), (lambda v: consumers_through(graph, v, QDQ_OPS))


def _constant_scalar(graph: Graph, value: str) -> float | None:
    v = graph.scalar(value)
    if v is None:
        node = graph.producer(value)
        if is_op(node, "Cast") and node.inputs:
            v = graph.scalar(node.inputs[0])
    return float(v) if isinstance(v, (int, float)) else None


def _is_gamma(graph: Graph, value: str) -> bool:
    """A constant scale vector: an initializer or Constant, possibly through Cast (or 1 + w, zero-centred)."""
    if weight_dims(graph, value) is not None or graph.is_constant(value):
        return True
    node = graph.producer(value)
    return is_op(node, "Add", "Cast") and all(graph.is_constant(i) or weight_dims(graph, i) is not None
                                             for i in node.inputs if i)


def _gamma_width(graph: Graph, value: str) -> int | None:
    dims = weight_dims(graph, value)
    if dims is None:
        node = graph.producer(value)
        if is_op(node, "Add", "Cast"):
            for i in node.inputs:
                dims = weight_dims(graph, i) if i else None
                if dims:
                    break
    if dims and all(d == 1 for d in dims[:-1]):
        return dims[-1]
    return None


def _changes_type(graph: Graph, cast: Node) -> bool:
    """Whether a Cast changes its input's element type (unknown types count as a change)."""
    from ortgate.graph.index import dtype_name

    source = graph.dtype(cast.input(0))
    target = dtype_name(cast.attr("to"))
    return source is None or target is None or source != target


def _find_decomposed(graph: Graph) -> list[DecomposedRmsNorm]:
    found: list[DecomposedRmsNorm] = []
    hidden = hidden_size(graph)
    for rm in graph.by_op_type("ReduceMean"):
        match = _match_at(graph, rm, hidden)
        if match is not None:
            found.append(match)
    return found


def _match_at(graph: Graph, rm: Node, hidden: int | None) -> DecomposedRmsNorm | None:
    producer, consumers = _qdq_view(graph)
    square = producer(rm.input(0))
    if is_op(square, "Pow") and square.inputs:
        exponent = _constant_scalar(graph, square.input(1))
        if exponent is not None and exponent != 2.0:
            return None
        x, square_kind = _unq(graph, square.input(0)), "pow"
    elif is_op(square, "Mul") and square.input(0) and _unq(graph, square.input(0)) == _unq(graph, square.input(1)):
        x, square_kind = _unq(graph, square.input(0)), "mul"
    else:
        return None
    if not rm.outputs:
        return None
    add = _single(graph, rm.outputs[0], "Add")
    if add is None:
        return None
    epsilon = _constant_scalar(graph, _unq(graph, _other_input_q(graph, add, rm.outputs[0])))  # None: computed
    nodes = [square, rm, add]
    root = consumers(add.outputs[0])
    sqrt = next((c for c in root if is_op(c, "Sqrt")), None)
    inverse_pow = next((c for c in root if is_op(c, "Pow") and _constant_scalar(graph, c.input(1)) == -0.5), None)
    normalize: Node | None = None
    kind = ""
    if sqrt is not None:
        nodes.append(sqrt)
        for c in consumers(sqrt.outputs[0]):
            by_sqrt = is_op(c, "Div") and _unq(graph, c.input(1)) == sqrt.outputs[0]
            if by_sqrt and _same_source(graph, c.input(0), x):
                normalize, kind = c, "div"
                break
            one_over = by_sqrt and _constant_scalar(graph, _unq(graph, c.input(0))) == 1.0
            if is_op(c, "Reciprocal") or one_over:
                mul = next((m for m in consumers(c.outputs[0]) if is_op(m, "Mul")
                            and _same_source(graph, _other_input_q(graph, m, c.outputs[0]), x)), None)
                if mul is not None:
                    nodes.append(c)
                    normalize, kind = mul, "div_one" if one_over else "reciprocal"
                    break
    elif inverse_pow is not None:
        mul = next((m for m in consumers(inverse_pow.outputs[0]) if is_op(m, "Mul")
                    and _same_source(graph, _other_input_q(graph, m, inverse_pow.outputs[0]), x)), None)
        if mul is not None:
            nodes.append(inverse_pow)
            normalize, kind = mul, "rsqrt_pow"
    if normalize is None:
        return None
    nodes.append(normalize)
    output = normalize.outputs[0]
    trailing_cast = False
    nxt = consumers(output)
    if len(nxt) == 1 and is_op(nxt[0], "Cast"):
        cast = nxt[0]
        after = consumers(cast.outputs[0])
        if len(after) == 1 and is_op(after[0], "Mul") and _is_gamma(graph, _other_input_q(graph, after[0],
                                                                                        cast.outputs[0])):
            nodes.append(cast)
            # a Cast to the type it already has (float32 -> float32, legacy exports) is removed by ORT's
            # CastElimination before any fusion: it does not change the form
            output, trailing_cast = cast.outputs[0], _changes_type(graph, cast)
    gamma = None
    nxt = consumers(output)
    if len(nxt) == 1 and is_op(nxt[0], "Mul") and _is_gamma(graph, _other_input_q(graph, nxt[0], output)):
        gamma = _other_input_q(graph, nxt[0], output)
        nodes.append(nxt[0])
        output = nxt[0].outputs[0]
    centring = _centring(graph, x)
    if centring is not None:  # LayerNorm without bias: its chain starts at the mean it subtracts
        nodes = [*centring, *nodes]
        x = centring[-1].inputs[0]
    producer = graph.producer(x)
    leading_cast = is_op(producer, "Cast") and _changes_type(graph, producer)
    source = producer.inputs[0] if is_op(producer, "Cast") and producer.inputs else x
    if square_kind == "mul":
        form = "square_mul"
    elif kind == "rsqrt_pow":
        form = "pow_rsqrt_pow"
    elif kind == "div":
        form = "pow_div_cast" if trailing_cast else "pow_div"
    elif kind == "div_one":
        form = "pow_div_one_cast" if trailing_cast else "pow_div_one"
    else:
        form = "pow_reciprocal_cast" if (trailing_cast or leading_cast) else "pow_reciprocal"
    width = _gamma_width(graph, gamma) if gamma else None
    head_norm = width is not None and hidden is not None and width < hidden
    layer = graph.layer_of_nodes(nodes)
    role = _role(graph, source, head_norm)
    return DecomposedRmsNorm(rm, normalize, x, source, output, form, epsilon, gamma, width, head_norm, layer, nodes,
                             role=role, feeds=_feeds(graph, output, layer) if role != "hidden" else "attention",
                             centred=centring is not None)


def _centring(graph: Graph, value: str) -> list[Node] | None:
    """[ReduceMean, Sub] when `value` is Sub(a, ReduceMean(a)) (through Casts and Q/DQ): the input of an RMS chain
    that is a LayerNorm's (Cohere's LayerNorm has no bias: x - mean(x), then x * rsqrt(mean(x^2) + eps) * w)."""
    sub = graph.producer(skip_back(graph, value, CAST_OPS))
    if not is_op(sub, "Sub") or len(sub.inputs) != 2:
        return None
    mean = graph.producer(skip_back(graph, sub.input(1), CAST_OPS))
    if not is_op(mean, "ReduceMean") or not mean.inputs or not _same_source(graph, mean.input(0), sub.input(0)):
        return None
    return [mean, sub]


_LINEAR = ("MatMul", "Gemm", "MatMulNBits", "FusedMatMul")


def _role(graph: Graph, source: str, narrower: bool) -> str:
    """What a norm normalises, from where its input comes (see DecomposedRmsNorm.role)."""
    node = graph.producer(skip_back(graph, source, ("Cast", "Identity")))
    if node is not None and node.op_type in ("Split", "Slice") and node.inputs:
        node = graph.producer(skip_back(graph, node.inputs[0], ("Cast", "Identity")))
    if node is not None and node.op_type == "Add" and any(weight_dims(graph, i) is not None for i in node.inputs):
        node = next((graph.producer(i) for i in node.inputs if weight_dims(graph, i) is None), None)  # bias
    if node is not None and node.op_type in _LINEAR:
        return "projection"
    if narrower:
        return "head"
    return "hidden"


_ATTENTION_OPS = frozenset({"Softmax", "GroupQueryAttention", "MultiHeadAttention", "Attention",
                            "PackedMultiHeadAttention", "PagedAttention"})
_SHAPE_ONLY = RESHAPE_OPS | CAST_OPS | frozenset({"Transpose"})
_FEEDS_DEPTH = 256  # nodes walked downstream: from a q/k norm through reshape, rotary and repeat_kv to the scores


def _feeds(graph: Graph, output: str, layer: int | None) -> str:
    """What a norm's output feeds downstream in its layer: an attention ("attention"; through rotary, reshapes and
    repeat_kv), a linear projection with a constant weight reached through shape-only ops ("projection"), or
    neither ("other": a projection reached only after other arithmetic does not count)."""
    frontier, seen, steps, projection = [(output, True)], {output}, 0, False
    while frontier and steps < _FEEDS_DEPTH:
        value, direct = frontier.pop(0)
        for node in graph.consumers(value):
            steps += 1
            if layer is not None and node.layer is not None and node.layer != layer:
                continue
            if node.op_type in _ATTENTION_OPS:
                return "attention"
            if node.op_type in _LINEAR and any(weight_dims(graph, i) is not None for i in node.inputs[:2]):
                projection = projection or direct
                continue
            still = direct and node.op_type in _SHAPE_ONLY
            for out in node.outputs:
                if out and out not in seen:
                    seen.add(out)
                    frontier.append((out, still))
    return "projection" if projection else "other"


def fused_norm_width(graph: Graph, node: Node) -> int | None:
    """Scale width of a fused norm (input 1 of SimplifiedLayerNormalization / RMSNormalization, 2 of the Skip ops)."""
    index = 2 if node.op_type in ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization") else 1
    dims = weight_dims(graph, node.input(index))
    return dims[-1] if dims else None


def is_head_norm(graph: Graph, node: Node) -> bool:
    """A fused per-head norm (q_norm / k_norm): its scale is narrower than the hidden state."""
    width = fused_norm_width(graph, node)
    hidden = hidden_size(graph)
    return width is not None and hidden is not None and width < hidden


@dataclass
class ResidualNorm:
    """A residual Add feeding an RMSNorm that is not fused with it."""

    add: Node
    norm: Node  # the fused norm node, or the decomposed norm's last node
    decomposed: DecomposedRmsNorm | None
    layer: int | None


def residual_norms(graph: Graph) -> list[ResidualNorm]:
    return cached(graph, "residual_norms", _find_residual_norms)


def _residual_add(graph: Graph, value: str) -> Node | None:
    node = graph.producer(skip_back(graph, value, ("Cast", "Identity")))
    if not is_op(node, "Add") or len([i for i in node.inputs if i]) != 2:
        return None
    if any(graph.is_constant(i) or weight_dims(graph, i) is not None for i in node.inputs):
        return None  # a bias
    return node


def _find_residual_norms(graph: Graph) -> list[ResidualNorm]:
    out: list[ResidualNorm] = []
    for node in fused_rmsnorm_nodes(graph):
        if node.op_type == "SkipSimplifiedLayerNormalization" or is_head_norm(graph, node):
            continue
        add = _residual_add(graph, node.input(0))
        if add is not None:
            out.append(ResidualNorm(add, node, None, node.layer))
    for match in decomposed_rmsnorms(graph):
        if match.head_norm or match.centred:
            continue  # a LayerNorm's residual Add is SkipLayerNormalization's, not SkipSimplifiedLayerNormalization's
        add = _residual_add(graph, match.source)
        if add is not None:
            out.append(ResidualNorm(add, match.last, match, match.layer))
    out.sort(key=lambda r: r.norm.index)
    return out
