"""Linear projections around attention and the gated MLP: are Q/K/V one packed GEMM, are gate and up one GEMM,
and how is SiLU(gate) * up computed.

Q/K/V: from each softmax attention (fused GroupQueryAttention / MultiHeadAttention / Attention, or a decomposed
core) the query, key and value inputs are walked upstream through what sits between a projection and the
attention (reshapes, transposes, casts, Splits of a packed projection, elementwise ops such as a clamp between a
projection and its Split, q_norm/k_norm, rotary, the KV-cache Concat, repeat_kv, a QDQ pair) to the linear
projection they come from: a MatMul / Gemm / MatMulNBits / FusedMatMul with a constant weight (one seen through
DequantizeLinear included: a QDQ-wrapped MatMul), or a MatMulInteger of a constant int8 weight (quantize_dynamic's
form, reached through the Cast and the Mul by the scale that dequantize its output).

Gated MLP: anchored at SiLU, i.e. Mul(g, Sigmoid(g)) or com.microsoft QuickGelu(g, alpha=1) (ORT's fused form),
followed by Mul(silu, up). Gate and up are walked upstream to their projections: one projection split in two
is a merged gate_up projection.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.attention import attention_cores, fused_attention_nodes
from ortgate.graph.patterns.common import (
    VIEW_OPS,
    cached,
    dequantized_input,
    is_op,
    matmul_weight,
    quantized_weight,
    skip_back,
)
from ortgate.graph.patterns.norms import norm_by_output
from ortgate.graph.patterns.rotary import FUSED_ROTARY_OPS, rotary_by_output

# Ops passed through (all computed inputs) between a projection and the attention it feeds; elementwise ops
# between a projection and its Split (DBRX clamps its packed Wqkv: MatMul -> Clip -> Split) included.
_PASS_ALL = frozenset({"Concat", "Mul", "Div", "Add", "Sub", "Neg", "Where", "Max", "Min"})
_PASS_FIRST = VIEW_OPS | frozenset({"Tile", "Split", "Slice", "Clip", "Relu", "Tanh", "Abs", "Softsign"})
_NORM_OPS = frozenset({"SimplifiedLayerNormalization", "RMSNormalization", "LayerNormalization"})


def projection_dims(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """[in, out] of a linear projection: a MatMul/Gemm/MatMulNBits with a constant weight, or with one expert's
    slice of a stacked [experts, ...] weight (`Gather(W, e)`, how torch exports a loop over 3-D expert weights)."""
    dims = matmul_weight(graph, node)
    if dims is not None or not is_op(node, "MatMul", "Gemm"):
        return dims
    transposed = bool(node.attr("transB", 0)) if node.op_type == "Gemm" else False
    weight = graph.producer(node.input(1))
    if is_op(weight, "Transpose"):
        transposed = not transposed
        weight = graph.producer(weight.input(0))
    if not is_op(weight, "Gather") or not graph.is_constant(weight.input(1)):
        return None
    init = graph.initializers.get(weight.input(0))
    if init is None or len(init.dims) != 3 or int(weight.attr("axis", 0)) != 0:
        return None
    rows, cols = init.dims[1], init.dims[2]
    return (cols, rows) if transposed else (rows, cols)


def linear_dims(graph: Graph, node: Node) -> tuple[int, ...] | None:
    """[in, out] of any linear projection: what `projection_dims` takes, or a MatMulInteger of a constant quantized
    weight (quantize_dynamic's MatMul, whose int32 output a Cast and a Mul by the scales dequantize)."""
    return projection_dims(graph, node) or quantized_weight(graph, node)


@dataclass
class Upstream:
    """What a value is computed from: the projections reached and whether a Split/Slice divided one."""

    linears: list[Node]
    split: bool


def trace_to_projections(graph: Graph, value: str) -> Upstream:
    """Walk upstream from `value` to the linear projections it is computed from (stopping at each). The walk is
    bounded by the graph: each value once, and never into another decoder layer than the one `value` is in."""
    inputs = graph.input_names
    norms = norm_by_output(graph)
    rotaries = rotary_by_output(graph)
    start = graph.producer(value)
    if _projection_output(graph, value, start, norms, rotaries, inputs):
        assert start is not None
        return Upstream([start], False)
    found: dict[int, Node] = {}
    split = False
    layer = start.layer if start is not None else None
    frontier, seen = [value], {value}
    producer_of, is_constant = graph.producer, graph.is_constant
    while frontier:
        v = frontier.pop()
        if not v or v in inputs or is_constant(v):
            continue
        node = producer_of(v)
        if layer is not None and node is not None and node.layer is not None and node.layer != layer:
            continue
        if v in norms:
            nxt = [norms[v].input]
        elif v in rotaries:
            nxt = [rotaries[v].input]
        else:
            if node is None:
                continue
            if linear_dims(graph, node) is not None:
                found[node.index] = node
                continue
            key = (node.domain, node.op_type)
            if key in FUSED_ROTARY_OPS or (node.domain == DEFAULT_DOMAIN and node.op_type in _NORM_OPS):
                nxt = list(node.inputs[:1])
            elif node.domain == DEFAULT_DOMAIN and node.op_type in _PASS_FIRST:
                split = split or node.op_type in ("Split", "Slice", "Gather")
                nxt = list(node.inputs[:1])
            elif node.domain == DEFAULT_DOMAIN and node.op_type in _PASS_ALL:
                nxt = [i for i in node.inputs if i and not is_constant(i) and i not in inputs]
                if node.op_type == "Where":
                    nxt = nxt[1:]
            else:
                continue
        for n in nxt:
            if n and n not in seen:
                seen.add(n)
                frontier.append(n)
    return Upstream(sorted(found.values(), key=lambda n: n.index), split)


def _projection_output(graph: Graph, value: str, start: Node | None, norms: dict, rotaries: dict,
                       inputs: frozenset[str]) -> bool:
    """Whether `value` is a linear projection's output (`start`, its producer), where `trace_to_projections`' walk
    ends at its first step: the usual case, decided without the walk."""
    return start is not None and value not in norms and value not in rotaries and value not in inputs and \
        linear_dims(graph, start) is not None and not graph.is_constant(value)


def _source(graph: Graph, node: Node) -> str:
    """The hidden state a projection reads (for a MatMulInteger, what DynamicQuantizeLinear quantized)."""
    return skip_back(graph, dequantized_input(graph, node), ("Cast", "Identity", "Reshape", "DequantizeLinear",
                                                            "QuantizeLinear"))


@dataclass
class QkvProjections:
    """The projections one softmax attention reads its query, key and value from."""

    attention: Node  # the fused attention node, or the decomposed core's Softmax
    layer: int | None
    q: Node | None
    k: Node | None
    v: Node | None
    packed: bool  # one projection feeds all three (split after it, or GQA's packed input)
    shared_input: bool  # the separate projections read the same hidden state
    fused: bool  # a fused attention op (else a decomposed core)
    related: list[Node] = field(default_factory=list)
    traced: bool = True  # each of q, k, v led to exactly one projection

    @property
    def separate(self) -> list[Node]:
        out: dict[int, Node] = {}
        for n in (self.q, self.k, self.v):
            if n is not None:
                out[n.index] = n
        return sorted(out.values(), key=lambda n: n.index)


def qkv_projections(graph: Graph) -> list[QkvProjections]:
    return cached(graph, "qkv_projections", _find_qkv)


def _one(graph: Graph, value: str) -> Node | None:
    if not value:
        return None
    found = trace_to_projections(graph, value).linears
    return found[0] if len(found) == 1 else None


def _find_qkv(graph: Graph) -> list[QkvProjections]:
    out: list[QkvProjections] = []
    for node in fused_attention_nodes(graph):
        q_in, k_in, v_in = node.input(0), node.input(1), node.input(2)
        if not k_in and not v_in:  # packed QKV input (GroupQueryAttention, Attention)
            q = _one(graph, q_in)
            out.append(QkvProjections(node, node.layer, q, q, q, True, False, True, traced=q is not None))
            continue
        out.append(_judge(graph, node, node.layer, q_in, k_in, v_in, fused=True))
    for core in attention_cores(graph):
        out.append(_judge(graph, core.softmax, core.layer, core.qk.input(0), core.qk.input(1), core.pv.input(1),
                          fused=False))
    return out


def _judge(graph: Graph, attention: Node, layer: int | None, q_in: str, k_in: str, v_in: str, *, fused: bool
           ) -> QkvProjections:
    q, k, v = _one(graph, q_in), _one(graph, k_in), _one(graph, v_in)
    distinct = {n.index: n for n in (q, k, v) if n is not None}
    packed = len(distinct) == 1 and None not in (q, k, v)
    shared = len(distinct) > 1 and None not in (q, k, v) and len({_source(graph, n) for n in distinct.values()}) == 1
    return QkvProjections(attention, layer, q, k, v, packed, shared, fused, list(distinct.values()),
                          traced=None not in (q, k, v))


@dataclass(frozen=True)
class AttentionHeads:
    """A decomposed attention's head counts as its graph shows them, never as a config declares them."""

    q_heads: int
    kv_heads: int
    head_size: int
    how: str  # what in the graph says so: "q and k projections 64 and 32 wide at head size 16"


def decomposed_heads(graph: Graph, softmax: Node) -> AttentionHeads | None:
    """The q and kv heads of the decomposed attention core at `softmax`: the widths of its q and k projections over
    the head size, the head size (and heads) from the first 4-D Reshape after each projection ([.., .., heads,
    head_size]). None when the graph does not show both (a packed projection without a Split of constant sizes, no
    such Reshape), or when what it shows does not add up."""
    found = next((p for p in qkv_projections(graph) if p.attention is softmax and not p.fused), None)
    if found is None or found.q is None or found.k is None:
        return None
    if found.packed:
        split = _split_after(graph, found.q)
        if split is None:
            return None
        (q_out, q_width), (k_out, k_width) = split
    else:
        q_dims, k_dims = linear_dims(graph, found.q), linear_dims(graph, found.k)
        if not q_dims or not k_dims:
            return None
        q_out, q_width, k_out, k_width = found.q.outputs[0], q_dims[-1], found.k.outputs[0], k_dims[-1]
    q_heads, q_size = _head_reshape(graph, q_out)
    kv_heads, k_size = _head_reshape(graph, k_out)
    core = next((c for c in attention_cores(graph) if c.softmax is softmax), None)
    size = q_size or k_size or (core.qk_head_size if core is not None else None) or _cache_head_size(graph, k_out)
    if not size or (q_size and k_size and q_size != k_size) or q_width % size or k_width % size:
        return None
    q, kv = q_width // size, k_width // size
    if (q_heads and q_heads != q) or (kv_heads and kv_heads != kv) or not q or not kv:
        return None
    packed = "a packed projection split into q and k parts" if found.packed else "q and k projections"
    how = f"{packed} {q_width} and {k_width} wide at head size {size}"
    return AttentionHeads(q, kv, size, how)


_HEAD_PATH = frozenset({"Reshape", "Transpose", "Cast", "Identity", "Mul", "Div", "Add", "Sub", "Neg", "Concat",
                        "Slice", "Split", "Pow", "ReduceMean", "Sqrt", "Reciprocal", "Unsqueeze", "Squeeze"})


def _head_reshape(graph: Graph, value: str, depth: int = 12) -> tuple[int | None, int | None]:
    """(heads, head size) of the first Reshape to a constant 4-D shape [.., .., heads, head_size] below `value`
    (a projection's output) along one path of views, elementwise ops and a fused rotary; a -1 or 0 there is None."""
    for _ in range(depth):
        readers = [c for c in graph.consumers(value) if (c.domain == DEFAULT_DOMAIN and c.op_type in _HEAD_PATH)
                   or (c.domain, c.op_type) in FUSED_ROTARY_OPS]
        if not readers:
            return None, None
        node = readers[0]
        if node.op_type == "Reshape" and len(node.inputs) > 1:
            shape = graph.constant_value(node.input(1)) or graph.shape(node.outputs[0]) if node.outputs else None
            if shape is not None and len(shape) == 4:
                heads, size = shape[2], shape[3]
                return (heads if isinstance(heads, int) and heads > 0 else None), (
                    size if isinstance(size, int) and size > 0 else None)
        if not node.outputs:
            return None, None
        value = node.outputs[0]
    return None, None


def _cache_head_size(graph: Graph, key: str) -> int | None:
    """The head size a KV cache declares: the last dim of the past-key graph input the key is concatenated to."""
    for node in graph.consumers(key)[:4]:
        for reader in [node, *graph.consumers(node.outputs[0] if node.outputs else "")][:6]:
            if is_op(reader, "Concat"):
                for name in reader.inputs:
                    shape = graph.shape(name) if name in graph.input_names else None
                    if shape and len(shape) == 4 and isinstance(shape[3], int) and shape[3] > 0:
                        return shape[3]
    return None


def _split_after(graph: Graph, projection: Node) -> tuple[tuple[str, int], tuple[str, int]] | None:
    """((q part, its width), (k part, its width)) of the Split of constant sizes a packed projection's output is
    cut into [q | k | v]; None without one."""
    value = projection.outputs[0] if projection.outputs else ""
    readers = graph.consumers(value)
    while len(readers) == 1 and readers[0].domain == DEFAULT_DOMAIN and readers[0].op_type in (
            "Clip", "Cast", "Identity") and readers[0].outputs:  # DBRX clamps its packed Wqkv before the Split
        readers = graph.consumers(readers[0].outputs[0])
    for node in readers:
        if is_op(node, "Split") and len(node.outputs) == 3 and len(node.inputs) > 1:
            sizes = graph.constant_value(node.input(1))
            if sizes is not None and len(sizes) == 3 and all(int(x) > 0 for x in sizes):
                return (node.outputs[0], int(sizes[0])), (node.outputs[1], int(sizes[1]))
    return None


@dataclass
class GatedMlp:
    """SiLU(gate) * up as found in the graph."""

    product: Node  # Mul(silu, up)
    activation: list[Node]  # [Sigmoid, Mul] or [QuickGelu]
    fused_activation: bool  # the SiLU is one node (QuickGelu alpha=1)
    gate: Node | None  # projection of the gate
    up: Node | None  # projection of up
    layer: int | None

    @property
    def merged(self) -> bool:
        return self.gate is not None and self.gate is self.up

    @property
    def separate(self) -> bool:
        return self.gate is not None and self.up is not None and self.gate is not self.up


def gated_mlps(graph: Graph) -> list[GatedMlp]:
    return cached(graph, "gated_mlps", _find_gated)


def _silu_gates(graph: Graph) -> list[tuple[str, Node, list[Node], bool]]:
    """(gate value, SiLU output node, activation nodes, fused) for every SiLU in the graph."""
    out = []
    for sig in graph.by_op_type("Sigmoid"):
        g = sig.input(0)
        for mul in graph.consumers(sig.outputs[0]) if sig.outputs else []:
            if is_op(mul, "Mul") and g in mul.inputs and sig.outputs[0] in mul.inputs:
                out.append((g, mul, [sig, mul], False))
    for quick in graph.by_op(MS_DOMAIN, "QuickGelu"):
        alpha = quick.attr("alpha", 1.702)
        if alpha is not None and abs(float(alpha) - 1.0) < 1e-6 and quick.outputs:
            out.append((quick.input(0), quick, [quick], True))
    return out


def _find_gated(graph: Graph) -> list[GatedMlp]:
    out = []
    norms, rotaries, inputs, producer = norm_by_output(graph), rotary_by_output(graph), graph.input_names, graph.producer

    linear: dict[int, bool] = {}  # node index -> whether it is a linear projection (gate and up share nodes)

    def is_linear(node: Node) -> bool:
        found = linear.get(node.index)
        if found is None:
            found = linear[node.index] = linear_dims(graph, node) is not None
        return found

    def one(value: str) -> Node | None:
        """`_one`, with the tables its walk reads looked up once (a MoE graph has a gated MLP per expert)."""
        start = producer(value) if value else None
        if start is not None and value not in norms and value not in rotaries and value not in inputs \
                and not graph.is_constant(value):
            if is_linear(start):  # `_projection_output`: the walk ends at its first step
                return start
            # One step through a single-input pass (the Split of a merged gate_up projection) to a projection:
            # what the walk finds there, decided without it.
            if start.op_type in _PASS_FIRST and start.domain == DEFAULT_DOMAIN and start.inputs:
                source = start.inputs[0]
                if source and source != value and source not in inputs and source not in norms \
                        and source not in rotaries and not graph.is_constant(source):
                    node = producer(source)
                    if node is not None and (start.layer is None or node.layer is None or node.layer == start.layer) \
                            and is_linear(node):
                        return node
        return _one(graph, value)

    for gate_value, silu, act_nodes, fused in _silu_gates(graph):
        for product in graph.consumers(silu.outputs[0]):
            if not is_op(product, "Mul"):
                continue
            up_value = product.input(1) if product.input(0) == silu.outputs[0] else product.input(0)
            if not up_value or up_value == gate_value or graph.is_constant(up_value):
                continue
            gate = one(gate_value)
            up = one(up_value)
            layer = product.layer
            if any(n.layer != layer for n in act_nodes):
                layer = graph.layer_of_nodes([product, *act_nodes])
            out.append(GatedMlp(product, act_nodes, fused, gate, up, layer))
    out.sort(key=lambda m: m.product.index)
    return out
