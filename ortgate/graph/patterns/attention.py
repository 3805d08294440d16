"""Attention as ORT sees it: fused nodes (GroupQueryAttention, MultiHeadAttention, Attention, ...) and
decomposed cores (MatMul(Q, K^T) -> scale -> mask -> Softmax -> MatMul(P, V)).

Linear-attention mixers of hybrid models (Qwen3.5/3.6-MoE's LinearAttention / CausalConvWithState /
GatedRMSNorm, or GatedDeltaNet) are token mixers too, but not softmax attention: they are recognised so that
their layers are not counted as missing GroupQueryAttention.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Node
from ortgate.graph.patterns.common import CAST_OPS, cached, find_down, find_up, is_view, is_weight

# (domain, op_type) of fused softmax-attention nodes.
FUSED_ATTENTION_OPS = (
    (MS_DOMAIN, "GroupQueryAttention"),
    (MS_DOMAIN, "MultiHeadAttention"),
    (MS_DOMAIN, "Attention"),
    (MS_DOMAIN, "PagedAttention"),
    (MS_DOMAIN, "SparseAttention"),
    (MS_DOMAIN, "PackedMultiHeadAttention"),
    (DEFAULT_DOMAIN, "Attention"),  # ONNX opset 23
)
# Linear-attention / state-space token mixers of hybrid models.
LINEAR_ATTENTION_OPS = (
    (MS_DOMAIN, "LinearAttention"),
    (MS_DOMAIN, "CausalConvWithState"),
    (MS_DOMAIN, "GatedDeltaNet"),
    (MS_DOMAIN, "LinearAttentionGate"),
)
_SCORE_OPS = CAST_OPS | frozenset({"Add", "Div", "Mul", "Where", "Sub", "Tanh", "Reshape", "Slice", "Concat"})
_PROB_OPS = CAST_OPS | frozenset({"Dropout", "Where", "Slice", "Reshape"})
_REPEAT_KV_OPS = frozenset({"Expand", "Tile"})
_KV_VIEW_OPS = CAST_OPS | frozenset({"Reshape", "Transpose", "Unsqueeze", "Concat"})


@dataclass
class AttentionCore:
    """A decomposed softmax attention: QK MatMul, Softmax, PV MatMul."""

    softmax: Node
    qk: Node
    pv: Node
    layer: int | None
    repeat_kv: bool = False  # K/V are expanded to the query head count first (GQA done by hand)
    nodes: list[Node] = field(default_factory=list)
    qk_head_size: int | None = None  # the dim Q and K are contracted over, where the graph declares it
    v_head_size: int | None = None  # the last dim of V, where declared

    @property
    def v_head_differs(self) -> bool:
        """Q/K heads wider or narrower than V heads (multi-head latent attention, MLA): known only when both
        sizes are declared."""
        return self.qk_head_size is not None and self.v_head_size is not None and self.qk_head_size != self.v_head_size


def fused_attention_nodes(graph: Graph) -> list[Node]:
    return sorted((n for d, o in FUSED_ATTENTION_OPS for n in graph.by_op(d, o)), key=lambda n: n.index)


def gqa_nodes(graph: Graph) -> list[Node]:
    return graph.by_op(MS_DOMAIN, "GroupQueryAttention")


def linear_attention_nodes(graph: Graph) -> list[Node]:
    return sorted((n for d, o in LINEAR_ATTENTION_OPS for n in graph.by_op(d, o)), key=lambda n: n.index)


def linear_attention_layers(graph: Graph) -> set[int]:
    return {n.layer for n in linear_attention_nodes(graph) if n.layer is not None}


def attention_cores(graph: Graph) -> list[AttentionCore]:
    return cached(graph, "attention_cores", _find_cores)


def _find_cores(graph: Graph) -> list[AttentionCore]:
    cores = []
    for softmax in graph.by_op_type("Softmax"):
        qk = _matmul_above(graph, softmax.input(0))
        pv = _matmul_below(graph, softmax)
        if qk is None or pv is None:
            continue
        # A router's softmax sits on a weight MatMul; attention multiplies two activations.
        (q, k), (_, v) = _operands(qk), _operands(pv)
        if any(is_weight(graph, i) for i in (q, k)) or any(is_weight(graph, i) for i in _operands(pv)):
            continue
        core = AttentionCore(softmax, qk, pv, softmax.layer)
        core.repeat_kv = kv_expanded(graph, k) or kv_expanded(graph, v)
        core.nodes = [qk, softmax, pv]
        core.qk_head_size = _last_dim(graph, q)
        core.v_head_size = _last_dim(graph, v)
        cores.append(core)
    return cores


def _last_dim(graph: Graph, value: str) -> int | None:
    shape = graph.shape(value)
    return shape[-1] if shape and isinstance(shape[-1], int) and shape[-1] > 0 else None


def _is_matmul(node: Node) -> bool:
    """MatMul, the com.microsoft FusedMatMul ORT's EXTENDED level makes of MatMul + transpose/scale, or the
    QLinearMatMul ORT's dump of a QDQ graph makes of DequantizeLinear -> MatMul -> QuantizeLinear."""
    return (node.domain == DEFAULT_DOMAIN and node.op_type in ("MatMul", "QLinearMatMul")) or (
        node.domain == MS_DOMAIN and node.op_type == "FusedMatMul")


def _operands(node: Node) -> tuple[str, str]:
    """The two multiplied operands of a matmul (QLinearMatMul's are inputs 0 and 3, each with its scale and zero
    point after it)."""
    if node.op_type == "QLinearMatMul":
        return node.input(0), node.input(3)
    return node.input(0), node.input(1)


def _matmul_above(graph: Graph, value: str) -> Node | None:
    seen: set[str] = set()
    while value not in seen:
        seen.add(value)
        node = graph.producer(value)
        if node is None:
            return None
        if _is_matmul(node):
            return node
        if node.domain != DEFAULT_DOMAIN:
            return None
        if node.op_type not in _SCORE_OPS or not node.inputs:
            return None
        # Follow the operand that is not a constant (scale, mask bias) — the scores.
        candidates = [i for i in node.inputs if i and not graph.is_constant(i)]
        if node.op_type == "Where" and len(node.inputs) == 3:
            candidates = [i for i in node.inputs[1:] if i and not graph.is_constant(i)]
        if not candidates:
            return None
        value = _deepest(graph, candidates)
    return None


def _deepest(graph: Graph, values: list[str]) -> str:
    # Between scores and a mask, the scores come from a MatMul; prefer the operand whose producer is one.
    for v in values:
        p = graph.producer(v)
        if p is not None and p.op_type in ("MatMul", "FusedMatMul", "Div", "Mul", "Add", "Cast", "Tanh", "Reshape"):
            return v
    return values[0]


def _matmul_below(graph: Graph, softmax: Node) -> Node | None:
    if not softmax.outputs:
        return None
    return find_down(graph, softmax.outputs[0], lambda c, v: _is_matmul(c) and c.input(0) == v,
                     lambda c, v: c.outputs[:1] if c.domain == DEFAULT_DOMAIN and c.op_type in _PROB_OPS else [])


def kv_expanded(graph: Graph, value: str) -> bool:
    """Whether K or V reaches the attention MatMul through Expand/Tile (repeat_kv): through reshapes, transposes
    and the KV-cache Concat (its first input, the past)."""
    return find_up(graph, value, lambda n: n.op_type in _REPEAT_KV_OPS and bool(n.inputs),
                   lambda n: n.inputs[:1] if is_view(graph, n, None, _KV_VIEW_OPS) else []) is not None


def token_mixer_layers(graph: Graph) -> dict[str, set[int]]:
    """Layers per kind of token mixer found: "fused", "decomposed", "linear"."""

    def compute(g: Graph) -> dict[str, set[int]]:
        return {
            "fused": {n.layer for n in fused_attention_nodes(g) if n.layer is not None},
            "decomposed": {c.layer for c in attention_cores(g) if c.layer is not None},
            "linear": linear_attention_layers(g),
        }

    return cached(graph, "token_mixer_layers", compute)
