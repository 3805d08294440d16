"""What one decode step costs, node by node, from the graph alone (never a weight byte).

Per node: bytes read (weights by dtype, packed int4 with its scales and zero points; the rows an embedding Gather
reads; KV cache and recurrent state), FLOPs (2 x MACs of the weights actually used, attention QK and SV), GPU
kernel launches (after the fusions ORT itself performs at the session's optimization level; ops ORT folds or
aliases launch nothing) and host synchronisations. Each node belongs to a component (attention, moe, mlp, norms,
embedding, lm_head, other) and a decoder layer.

MoE layers are read by form, using what the MoE patterns find: a fused MoE/QMoE reads the expected distinct
experts a step touches, E * (1 - (1 - k/E)^T) for T = batch x new tokens; a dense all-experts loop reads all E;
a gather-per-token decomposition reads min(T * k, E) experts, without dedup.

A decoder without a KV cache (token ids in, logits out, no past or present tensors) cannot decode one token: its
step runs over the whole context, so T is batch x context for its projections, FLOPs and experts.
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from ortgate.cost.shapes import DTYPE_BYTES, StepShape, dtype_bytes
from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph, Initializer, Node, op_key
from ortgate.graph.patterns.attention import (
    LINEAR_ATTENTION_OPS,
    attention_cores,
    fused_attention_nodes,
    kv_expanded,
)
from ortgate.graph.patterns.common import cached, linear_nodes
from ortgate.graph.patterns.decoder import cacheless_decoder
from ortgate.graph.patterns.moe import ExpertForm, MoeBlock, moe_blocks, moe_misses
from ortgate.graph.patterns.norms import FUSED_RMSNORM_OPS, decomposed_rmsnorms
from ortgate.graph.patterns.projections import gated_mlps, projection_dims, qkv_projections
from ortgate.graph.patterns.rotary import FUSED_ROTARY_OPS, decomposed_rotaries
from ortgate.knowledge import cuda_graph_capture_facts, input_position, moe_inputs
from ortgate.knowledge.devices import op_costs

COMPONENTS = ("attention", "moe", "mlp", "norms", "embedding", "lm_head", "other")

# Ops that hand a weight on unchanged in meaning (ORT folds them into constants at load).
_WEIGHT_PASS = frozenset({"Cast", "Transpose", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
_LINEAR_ATTENTION_EXTRA = ((MS_DOMAIN, "GatedRMSNorm"), (MS_DOMAIN, "GatedAdd"))
_FUSED_ATTENTION_NATIVE_KV = frozenset({"GroupQueryAttention", "PagedAttention", "SparseAttention"})
_CONTROL_FLOW = frozenset(cuda_graph_capture_facts().control_flow_ops)
_SIMPLE_NORMS = frozenset(op for _, op in FUSED_RMSNORM_OPS) | {"LayerNormalization", "SkipLayerNormalization"}


@dataclass(slots=True)
class Cost:
    """Additive cost of a set of nodes for one step."""

    bytes: float = 0.0
    flops: float = 0.0
    launches: int = 0
    syncs: int = 0
    bytes_by_dtype: dict[str, float] = field(default_factory=dict)

    def add(self, other: Cost, sign: int = 1) -> None:
        self.bytes += sign * other.bytes
        self.flops += sign * other.flops
        self.launches += sign * other.launches
        self.syncs += sign * other.syncs
        for k, v in other.bytes_by_dtype.items():
            self.bytes_by_dtype[k] = self.bytes_by_dtype.get(k, 0.0) + sign * v

    def add_bytes(self, n: float, dtype: str | None) -> None:
        self.bytes += n
        key = dtype or "unknown"
        self.bytes_by_dtype[key] = self.bytes_by_dtype.get(key, 0.0) + n

    def copy(self) -> Cost:
        return Cost(self.bytes, self.flops, self.launches, self.syncs, dict(self.bytes_by_dtype))


@dataclass(slots=True)
class NodeCost:
    """One node's share of the step (or a virtual node: the fused op a repair puts in place of a pattern)."""

    index: int  # node index in the graph; negative for virtual nodes
    name: str
    op: str  # op key, e.g. "MatMul", "com.microsoft.MoE"
    layer: int | None
    component: str
    cost: Cost
    compute_dtype: str | None = None
    efficiency_kind: str | None = None  # "moe" for the fused MoE kernel: its own memory efficiency
    label: str | None = None  # plain words for the largest costs ("the dense expert loop reads all 128 experts")


@dataclass
class Uncounted:
    """Something the model could not count, and why (said per component, never replaced by a guess)."""

    component: str
    what: str


@dataclass
class MoeLayerForm:
    """How one decoder layer's MoE block is computed (its form, experts, top-k) and the node it is anchored at."""

    layer: int | None
    form: str  # "fused" | "fused-quantized" | "dense-loop" | "gather-loop" | "gather-per-token"
    experts: int | None
    top_k: int | None
    experts_read: float | None  # experts whose weights one step reads
    anchor: Node
    nodes: list[Node] = field(default_factory=list)  # the block's nodes (unfused: the whole block but the router)
    expert_bytes: float = 0.0  # the routed experts' weight bytes (all E)
    expert_macs: float = 0.0  # MACs of one token through one expert
    shared_bytes: float = 0.0  # shared-expert weights inside the block (kept by a fused form)
    shared_macs: float = 0.0
    shared_linears: int = 0


@dataclass
class StepModel:
    """Per-node costs of one step of one graph, with what the patterns found (for repairs and plain words).

    Launches are kept per node in `launches` (every node of the main graph); bytes, FLOPs and host syncs only for
    the nodes that have any, in `costs` (their `cost.launches` stays 0: `node_cost` adds the two up)."""

    graph: Graph
    shape: StepShape
    launches: list[int]
    costs: dict[int, NodeCost]
    components: dict[int, str]
    uncounted: list[Uncounted]
    moe_forms: list[MoeLayerForm]
    attention_forms: dict[int | None, str]  # layer -> "fused" | "decomposed" | "linear" | ...
    kv: dict[int | None, dict]  # layer -> {"bytes", "kv_heads", "head_size", "window", "positions", "factor"}
    control_flow: int
    gpu_launches: bool  # launches counted per GPU kernel (else per CPU dispatch)
    ort_fusions_applied: list[str] = field(default_factory=list)
    # A decoder without a KV cache recomputes the whole sequence at every step: the positions a step processes
    # (batch x context), where a cached step processes batch x new tokens. None: the graph has a cache.
    recomputed_tokens: int | None = None

    @property
    def tokens(self) -> int:
        """Token positions one step runs the weights over."""
        return self.recomputed_tokens if self.recomputed_tokens is not None else self.shape.tokens

    def component(self, index: int) -> str:
        return self.components.get(index, "other")

    def costed(self, index: int) -> NodeCost:
        """The node's NodeCost, created on first use (nodes without bytes, FLOPs or syncs have none yet)."""
        nc = self.costs.get(index)
        if nc is None:
            node = self.graph.nodes[index]
            nc = self.costs[index] = NodeCost(index, node.name, node.op_type, node.layer,
                                              self.components.get(index, "other"), Cost(0.0, 0.0, 0, 0, {}))
        return nc

    def node_cost(self, index: int) -> Cost:
        """Everything one node costs a step: bytes, FLOPs, launches, syncs."""
        nc = self.costs.get(index)
        cost = nc.cost.copy() if nc is not None else Cost()
        cost.launches += self.launches[index] if 0 <= index < len(self.launches) else 0
        return cost

    @property
    def nodes(self) -> dict[int, Cost]:
        """Node index -> its cost, for every node that costs anything."""
        out = {i: self.node_cost(i) for i, n in enumerate(self.launches) if n}
        for i in self.costs:
            out.setdefault(i, self.node_cost(i))
        return out


def expected_experts(experts: int, top_k: int, tokens: int) -> float:
    """Distinct experts T tokens touch when each picks k of E uniformly: E * (1 - (1 - k/E)^T)."""
    if experts <= 0 or top_k <= 0 or tokens <= 0:
        return 0.0
    k = min(top_k, experts)
    return experts * (1.0 - (1.0 - k / experts) ** tokens)


# ---- host-known values: what ORT folds to constants or computes on the host -----------------------------------


def host_known(graph: Graph) -> set[str]:
    """Values known without running the step on the device: weights, constants, shapes and what is computed from
    them alone. ORT folds these at load (constant folding) or computes them on the host: no kernel in the step."""

    def compute(g: Graph) -> set[str]:
        known: set[str] = set(g.initializers)
        add = known.update
        for node in g.nodes:
            if node.graph is not None:
                continue
            op = node.op_type
            if op in _HOST_OPS and node.domain == DEFAULT_DOMAIN:
                add(o for o in node.outputs if o)
                continue
            if op in _CONTROL_FLOW:
                continue
            seen = False
            for i in node.inputs:
                if i:
                    if i not in known:
                        break
                    seen = True
            else:
                if seen:
                    add(o for o in node.outputs if o)
        return known

    return cached(graph, "cost.host_known", compute)


_HOST_OPS = frozenset({"Shape", "Size", "Constant"})


# ---- weights ------------------------------------------------------------------------------------------------------


class WeightRead(NamedTuple):
    bytes: float | None  # None: unknown dtype
    dtype: str | None
    name: str
    numel: float


def _initializer_reads(graph: Graph) -> dict[str, WeightRead]:
    """Initializer name -> its WeightRead, for the initializers read so far (kept on the graph)."""
    return graph.__dict__.setdefault("_cost_initializer_reads", {})


def _initializer_read(graph: Graph, name: str) -> WeightRead | None:
    cache = _initializer_reads(graph)
    read = cache.get(name)
    if read is None:
        init = graph.initializers.get(name)
        if init is None:
            return None
        read = cache[name] = _first_read(init, name, graph.dtype(name))
    return read


def _first_read(init: Initializer, name: str, dtype: str | None) -> WeightRead:
    """`init`'s WeightRead; `dtype`: the graph's dtype of `name` (Graph.dtype), else the initializer's own."""
    numel = float(math.prod(init.dims))
    dtype = dtype or init.dtype
    size = DTYPE_BYTES.get(dtype or "")
    # WeightRead(...) without the named tuple's Python-level __new__: one per initializer read
    return _tuple_new(WeightRead, (None if size is None else numel * size, dtype, name, numel))


_tuple_new = tuple.__new__


def weight_read(graph: Graph, value: str, known: set[str]) -> WeightRead | None:
    """The weight bytes a consumer of `value` reads: traced through casts, transposes, reshapes and constant-index
    Gathers (an expert's slice of a stacked weight) to an initializer or a Constant. None: not a weight."""
    direct = _initializer_read(graph, value)
    if direct is not None:
        return direct
    fraction = 1.0
    extra: list[WeightRead] = []
    for _ in range(8):
        read = _initializer_read(graph, value)
        if read is not None:
            if fraction != 1.0:
                read = WeightRead(None if read.bytes is None else read.bytes * fraction, read.dtype, read.name,
                                  read.numel * fraction)
            return _combine(read, extra)
        node = graph.producer(value)
        if node is None or node.domain != DEFAULT_DOMAIN:
            return None
        op = node.op_type
        if op == "Constant":
            tensor = node.attr("value")
            dims = getattr(tensor, "dims", None)
            if dims is None:
                return None
            numel = 1.0
            for d in dims:
                numel *= d
            dtype = getattr(tensor, "dtype", None)
            size = dtype_bytes(dtype)
            return _combine(WeightRead(None if size is None else numel * size * fraction, dtype, node.display_name,
                                       numel * fraction), extra)
        if op in _WEIGHT_PASS and node.inputs:
            value = node.inputs[0]
            continue
        if op == "DequantizeLinear" and node.inputs:
            for side in node.inputs[1:3]:
                if side:
                    side_read = weight_read(graph, side, known)
                    if side_read is not None:
                        extra.append(side_read)
            value = node.inputs[0]
            continue
        if op == "Gather" and node.input(1) in known and node.inputs:
            init = graph.initializers.get(node.inputs[0])
            indices = graph.constant_value(node.input(1))
            if init is None or not init.dims or int(node.attr("axis", 0) or 0) != 0:
                return None
            picked = len(indices) if indices is not None else 1
            fraction *= min(picked, init.dims[0]) / init.dims[0]
            value = node.inputs[0]
            continue
        return None
    return None


def _combine(main: WeightRead, extra: list[WeightRead]) -> WeightRead:
    if not extra:
        return main
    total = main.bytes
    for e in extra:
        total = None if total is None or e.bytes is None else total + e.bytes
    return WeightRead(total, main.dtype, main.name, main.numel)


# ---- the model ----------------------------------------------------------------------------------------------------

_LINEAR_WEIGHT_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul"})


def step_model(graph: Graph, shape: StepShape, *, gpu: bool, provider: str | None = None,
               optimization_level: str | None = None, optimized: bool = False) -> StepModel:
    """Per-node costs of one step of `graph` (see the module docstring)."""
    key = f"cost.step_model.{shape}.{gpu}.{provider}.{optimization_level}.{optimized}"
    # The graph holds its model weakly: the model refers to the graph, and a strong reference back would make the
    # whole index cyclic garbage, freed by the cyclic collector only (which lint pauses), not when its user is done.
    slot: list[weakref.ref[StepModel]] = cached(graph, key, lambda g: [])
    model = slot[0]() if slot else None
    if model is None:
        model = _build(graph, shape, gpu, provider, optimization_level, optimized)
        slot[:] = [weakref.ref(model)]
    return model


def _build(graph: Graph, shape: StepShape, gpu: bool, provider: str | None, level: str | None,
           optimized: bool) -> StepModel:
    known = host_known(graph)
    components = node_components(graph)
    table = op_costs()
    launches = [0] * len(graph.nodes)
    model = StepModel(graph, shape, launches, {}, components, [], [], {}, {}, 0, gpu)
    if cacheless_decoder(graph) is not None:
        model.recomputed_tokens = shape.batch * max(shape.context, shape.new_tokens)
        model.uncounted.append(Uncounted("attention", "no KV cache: each step recomputes all "
                                         f"{shape.context:,} positions; attention over them is not counted"))
    tokens = model.tokens
    # per (domain, op_type): (launches, host sync op, what the loop does with it, its per-position table inputs)
    kinds: dict[tuple[str, str], tuple[int, bool, int, tuple[int, ...] | None]] = {}
    unknown_dtype_weights: dict[str, list[str]] = defaultdict(list)
    costed = model.costed
    costs = model.costs
    reads = _initializer_reads(graph)
    initializers = graph.initializers
    is_host_known = known.__contains__
    no_weights = known.isdisjoint
    reads_get, costs_get, components_get = reads.get, costs.get, components.get
    for node in graph.nodes:
        if node.graph is not None:
            continue
        key = (node.domain, node.op_type)
        kind = kinds.get(key)
        if kind is None:
            kind = kinds[key] = _kind(key, gpu, table)
        count, sync_op, action, tables = kind
        inputs = node.inputs
        if action == _CONTROL:
            model.control_flow += 1
        else:
            outputs = node.outputs
            if outputs and outputs[0] in known:
                continue  # folded at load or computed on the host: no kernel, no bytes in the step
        index = node.index
        launches[index] = count
        if sync_op and not all(is_host_known(i) for i in inputs if i):
            costed(index).cost.syncs += 1
        if action == _SKIP:
            continue
        if action == _GATHER:
            _gather(graph, model, node, known)
            continue
        nc = None
        if action != _NBITS and no_weights(inputs):
            continue  # reads no weight
        # The weights it reads, added up here and written to its NodeCost once.
        nbytes = flops = 0.0
        by_dtype: dict[str, float] | None = None
        compute_dtype: str | None | object = _UNSET
        position = -1
        for i in inputs:
            position += 1
            if i not in known or not i:
                continue
            read = reads_get(i)
            if read is None:
                init = initializers.get(i)
                if init is not None:
                    read = reads[i] = _first_read(init, i, graph.dtype(i))
                else:
                    read = weight_read(graph, i, known)
                    if read is None:
                        continue
            if tables is not None and position in tables and read.bytes is not None:
                read = _rows_read(graph, i, read, tokens)
            size, read_dtype, _, numel = read
            if size is None:
                unknown_dtype_weights[components.get(index, "other")].append(read.name)
                continue
            nbytes += size
            key_dtype = read_dtype or "unknown"
            if by_dtype is None:
                by_dtype = {key_dtype: size}
            else:
                by_dtype[key_dtype] = by_dtype.get(key_dtype, 0.0) + size
            if position == 1 and action == _LINEAR:
                flops += 2.0 * tokens * numel
                compute_dtype = read_dtype
        if by_dtype is not None:
            nc = costs_get(index)
            if nc is None:  # the usual case: the node has no cost yet
                nc = costs[index] = NodeCost(index, node.name, node.op_type, node.layer,
                                             components_get(index, "other"), Cost(nbytes, flops, 0, 0, by_dtype),
                                             None if compute_dtype is _UNSET else compute_dtype)  # type: ignore[arg-type]
            else:  # a host synchronisation was counted on it: bytes and FLOPs are still 0
                cost = nc.cost
                cost.bytes += nbytes
                cost.flops += flops
                cost.bytes_by_dtype = by_dtype
                if compute_dtype is not _UNSET:
                    nc.compute_dtype = compute_dtype  # type: ignore[assignment]
        if action == _NBITS:
            k, n = node.int_attr("K"), node.int_attr("N")
            if k and n:
                nc = nc or costed(index)
                nc.cost.flops += 2.0 * tokens * k * n
                nc.compute_dtype = graph.dtype(node.input(2)) or graph.dtype(node.input(0))
    for component, names in sorted(unknown_dtype_weights.items()):
        shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
        model.uncounted.append(Uncounted(component, f"{len(names)} weight{'s' if len(names) != 1 else ''} of unknown "
                                                    f"dtype ({shown}): bytes not counted"))
    _apply_ort_fusions(graph, model, provider, level, optimized)
    _moe(graph, model, known)
    _attention(graph, model)
    _linear_attention_state(graph, model)
    return model


_PLAIN, _SKIP, _GATHER, _LINEAR, _NBITS, _CONTROL = range(6)
_UNSET = object()
# Inputs that are per-position tables (rotary cos/sin caches): a step reads the rows of its tokens' positions.
_POSITION_TABLES = {
    (MS_DOMAIN, "RotaryEmbedding"): (2, 3),
    (MS_DOMAIN, "MRotaryEmbedding"): (2, 3),
    (MS_DOMAIN, "GemmaRotaryEmbedding"): (2, 3),
    (DEFAULT_DOMAIN, "RotaryEmbedding"): (1, 2),
    (MS_DOMAIN, "GroupQueryAttention"): (7, 8),
}


def _rows_read(graph: Graph, value: str, read: WeightRead, tokens: int) -> WeightRead:
    """A position table's rows one step reads: one per token (at most the table)."""
    dims = graph.shape(value)
    rows = dims[0] if dims and isinstance(dims[0], int) and dims[0] > 0 else None
    if rows is None or read.bytes is None:
        return read
    share = min(tokens, rows) / rows
    return WeightRead(read.bytes * share, read.dtype, read.name, read.numel * share)


def _kind(key: tuple[str, str], gpu: bool, table) -> tuple[int, bool, int, tuple[int, ...] | None]:
    domain, op = key
    name = op_key(domain, op)
    launches = table.gpu_launches(name) if gpu else (0 if name == "Constant" else 1)
    sync = name in table.host_sync
    if domain == DEFAULT_DOMAIN and op in _CONTROL_FLOW:
        action = _CONTROL
    elif (domain == DEFAULT_DOMAIN and op in _WEIGHT_PASS) or (domain == MS_DOMAIN and op in ("MoE", "QMoE")):
        action = _SKIP  # views and casts carry no weight; MoE/QMoE are priced with their MoE layer
    elif domain == DEFAULT_DOMAIN and op == "Gather":
        action = _GATHER
    elif op in _LINEAR_WEIGHT_OPS and domain in (DEFAULT_DOMAIN, MS_DOMAIN):
        action = _LINEAR
    elif domain == MS_DOMAIN and op == "MatMulNBits":
        action = _NBITS
    else:
        action = _PLAIN
    return launches, sync, action, _POSITION_TABLES.get(key) if action == _PLAIN else None


def _gather(graph: Graph, model: StepModel, node: Node, known: set[str]) -> None:
    """A Gather from a weight reads the rows its indices pick (B x S rows for a token embedding)."""
    data, indices = node.input(0), node.input(1)
    if data not in known or indices in known:
        return
    read = weight_read(graph, data, known)
    init = graph.initializers.get(data)
    if read is None or init is None or not init.dims:
        return
    component = model.component(node.index)
    axis = int(node.attr("axis", 0) or 0)
    if axis < 0:
        axis += len(init.dims)
    if not 0 <= axis < len(init.dims) or init.dims[axis] <= 0:
        return
    if read.bytes is None:
        model.uncounted.append(Uncounted(component, f"{init.name}: unknown dtype, the rows {node.display_name} "
                                                    "reads are not counted"))
        return
    rows, unresolved = model.shape.numel(graph.shape(indices))
    if rows is None:
        model.uncounted.append(Uncounted(component, f"{node.display_name}: its indices' dims "
                                                    f"{', '.join(unresolved)} are unknown: the rows it reads are not "
                                                    "counted"))
        return
    rows = min(rows, init.dims[axis])
    model.costed(node.index).cost.add_bytes(read.bytes * rows / init.dims[axis], read.dtype)


# ---- components -----------------------------------------------------------------------------------------------


def node_components(graph: Graph) -> dict[int, str]:
    """Node index -> component (attention, moe, mlp, norms, embedding, lm_head); nodes not listed are "other"."""

    def compute(g: Graph) -> dict[int, str]:
        out: dict[int, str] = {}
        setdefault = out.setdefault

        def mark(nodes: Iterable[Node], component: str) -> None:
            for n in nodes:
                setdefault(n.index, component)

        for block in moe_blocks(g):
            mark([n for n in (block.fused, block.router, block.topk) if n is not None], "moe")
            mark(block.routing_nodes, "moe")
            mark(moe_block_nodes(g, block), "moe")
        mark(fused_attention_nodes(g), "attention")
        mark([n for d, o in LINEAR_ATTENTION_OPS + _LINEAR_ATTENTION_EXTRA for n in g.by_op(d, o)], "attention")
        for core in attention_cores(g):
            mark(attention_core_nodes(g, core), "attention")
        for qkv in qkv_projections(g):
            mark(qkv.related, "attention")
            mark(_output_projections(g, qkv.attention), "attention")
        for d, o in FUSED_ROTARY_OPS:
            mark(g.by_op(d, o), "attention")
        for rot in decomposed_rotaries(g):
            mark(rot.nodes + rot.trig, "attention")
        for norm in decomposed_rmsnorms(g):
            mark(norm.nodes, "norms")
        for op in _SIMPLE_NORMS:
            mark(g.by_op(DEFAULT_DOMAIN, op), "norms")
            mark(g.by_op(MS_DOMAIN, op), "norms")
        embedding = embedding_gather(g)
        if embedding is not None:
            out.setdefault(embedding.index, "embedding")
        head = lm_head(g)
        if head is not None:
            out.setdefault(head.index, "lm_head")
        for mlp in gated_mlps(g):
            mark([n for n in (mlp.gate, mlp.up, mlp.product, *mlp.activation) if n is not None], "mlp")
            for c in g.consumers(mlp.product.outputs[0]) if mlp.product.outputs else []:
                if c.op_type in _LINEAR_WEIGHT_OPS or c.op_type == "MatMulNBits":
                    out.setdefault(c.index, "mlp")
        for n in linear_nodes(g):
            if n.layer is not None:
                out.setdefault(n.index, "mlp")
        return out

    return cached(graph, "cost.components", compute)


def _output_projections(graph: Graph, attention: Node) -> list[Node]:
    """The projection reading an attention's output (o_proj), through reshapes and transposes."""
    from ortgate.graph.patterns.common import consumers_through

    value = attention.outputs[0] if attention.outputs else ""
    if attention.op_type == "Softmax":
        pv = next((c for c in graph.consumers(value) if c.op_type in ("MatMul", "FusedMatMul")), None)
        value = pv.outputs[0] if pv is not None and pv.outputs else ""
    if not value:
        return []
    through = ("Transpose", "Reshape", "Cast", "Identity", "Squeeze", "Unsqueeze", "Flatten")
    return [c for c in consumers_through(graph, value, through=through) if projection_dims(graph, c) is not None][:1]


def embedding_gather(graph: Graph) -> Node | None:
    """The token embedding: a Gather from a 2-D weight by token ids (a graph input)."""
    inputs = graph.input_names
    for node in graph.by_op_type("Gather"):
        init = graph.initializers.get(node.input(0))
        if init is not None and len(init.dims) == 2 and node.input(1) in inputs and node.graph is None:
            return node
    return None


def lm_head(graph: Graph) -> Node | None:
    """The projection to the vocabulary: the linear producing a graph output, else the widest one outside the
    layers."""
    outputs = {o.name for o in graph.outputs}
    candidates = [n for n in linear_nodes(graph) if n.layer is None]
    for n in candidates:
        if any(o in outputs for o in n.outputs):
            return n
    return max(candidates, key=lambda n: (projection_dims(graph, n) or (0, 0))[-1], default=None)


# ---- MoE ------------------------------------------------------------------------------------------------------


def moe_block_nodes(graph: Graph, block: MoeBlock) -> list[Node]:
    """An unfused MoE block's nodes: from the block's input to the end of its layer (a decoder layer ends with its
    MLP or MoE), or, with no layer known, everything computed from the block's input alone."""
    if block.fused is not None or block.router is None:
        return []
    from ortgate.graph.patterns.common import skip_back

    router = block.router

    def compute(g: Graph) -> list[Node]:
        start = g.producer(skip_back(g, router.input(0), ("Reshape", "Cast", "Identity")))
        first = start.index if start is not None else router.index - 1
        if block.layer is not None:
            return [n for n in g.layers.get(block.layer, []) if n.index > first and n.graph is None]
        return _closure(g, skip_back(g, router.input(0), ("Reshape", "Cast", "Identity")), None)

    return cached(graph, f"cost.moe_block.{router.index}", compute)


def _closure(graph: Graph, start: str, layer: int | None, limit: int = 200_000) -> list[Node]:
    known = host_known(graph)
    inside: set[str] = {start}
    members: dict[int, Node] = {}
    frontier = [start]
    while frontier and len(members) < limit:
        value = frontier.pop()
        for c in graph.consumers(value):
            if c.index in members or c.graph is not None or c.layer != layer:
                continue
            if all((not i) or i in inside or i in known for i in c.inputs):
                members[c.index] = c
                for o in c.outputs:
                    if o and o not in inside:
                        inside.add(o)
                        frontier.append(o)
    return sorted(members.values(), key=lambda n: n.index)


def _moe(graph: Graph, model: StepModel, known: set[str]) -> None:
    tokens = model.tokens
    for block in moe_blocks(graph):
        if block.fused is not None:
            model.moe_forms.append(_fused_moe(graph, model, block, known, tokens))
        elif block.router is not None:
            model.moe_forms.append(_unfused_moe(graph, model, block, tokens))
    for miss in moe_misses(graph):  # a router no form read: its ops are priced as they are, not as an MoE layer
        model.uncounted.append(Uncounted("moe", f"MoE layer not read at {miss.node.display_name}: {miss.reason}; its "
                                         "nodes are priced as standard ops, without the expert reads of an MoE layer"))


def _fused_moe(graph: Graph, model: StepModel, block: MoeBlock, known: set[str], tokens: int) -> MoeLayerForm:
    node = block.fused
    assert node is not None
    quantized = node.op_type == "QMoE"
    experts = block.experts
    k = block.k or 1
    form = MoeLayerForm(node.layer, "fused-quantized" if quantized else block.expert_form.cost_form, experts, k, None,
                        node, [node])
    if not experts:
        model.uncounted.append(Uncounted("moe", f"{node.display_name}: the expert count (fc1's first dim) is not "
                                                "known: its expert weights are not counted"))
        return form
    nc = model.costed(node.index)
    nc.efficiency_kind = "moe"
    nc.compute_dtype = graph.dtype(node.input(0))
    total = 0.0
    dtype = None
    missing = []
    for i in range(2, len(node.inputs)):
        name = node.input(i)
        if not name or name not in known:
            continue
        read = weight_read(graph, name, known)
        if read is None:
            continue
        if read.bytes is None:
            missing.append(read.name)
            continue
        total += read.bytes
        dtype = dtype or read.dtype
    if missing:
        model.uncounted.append(Uncounted("moe", f"{node.display_name}: {len(missing)} expert weight(s) of unknown "
                                                f"dtype ({', '.join(missing[:3])}): not counted"))
    form.expert_bytes = total
    form.expert_macs = _fused_expert_macs(graph, node, quantized)
    touched = expected_experts(experts, k, tokens)
    form.experts_read = touched
    nc.cost.add_bytes(total * touched / experts, dtype)
    nc.cost.flops += 2.0 * tokens * k * form.expert_macs
    nc.label = f"the fused {node.op_type} reads {_experts_text(touched)} of {experts} experts per step"
    return form


def _fused_expert_macs(graph: Graph, node: Node, quantized: bool) -> float:
    """MACs of one token through one expert: fc1 rows x hidden + fc2 hidden x inter (+ fc3), from the weights'
    dims (QMoE packs 8 / bits values per byte along the input dim)."""
    bits = node.int_attr("expert_weight_bits", 4) if quantized else None
    pack = (8 // bits) if bits in (1, 2, 4, 8) else 1
    positions = moe_inputs(node.op_type)
    macs = 0.0
    for i in (positions.fc1_experts_weights, positions.fc2_experts_weights, positions.fc3_experts_weights):
        dims = graph.shape(node.input(i)) if node.input(i) else None
        if dims and len(dims) == 3:
            _, rows, cols = dims
            if isinstance(rows, int) and isinstance(cols, int):
                macs += rows * cols * pack
    return macs


def _unfused_moe(graph: Graph, model: StepModel, block: MoeBlock, tokens: int) -> MoeLayerForm:
    router = block.router
    assert router is not None
    nodes = [n for n in moe_block_nodes(graph, block) if n is not router]
    # the experts with weights: zero-computation (identity) experts take router columns but read no weight
    experts = max((block.experts or 0) - len(block.zero), 0)
    k = block.k or 0
    costs = model.costs
    known = host_known(graph)
    linears: list[Node] = []
    for n in nodes:
        if n.op_type in _LINEAR_WEIGHT_OPS or n.op_type == "MatMulNBits":
            nc = costs.get(n.index)
            if nc is not None and nc.cost.flops:
                linears.append(n)
    form_name = block.expert_form.cost_form
    form = MoeLayerForm(block.layer, form_name, experts or None, k or None, None, router, nodes)
    lin_bytes = sum(costs[n.index].cost.bytes for n in linears)
    lin_macs = sum(costs[n.index].cost.flops for n in linears) / (2.0 * tokens) if tokens else 0.0
    per_expert = round(len(linears) / experts) if experts else 0
    routed = per_expert * experts
    stacks = _gathered_stacks(graph, nodes, known) if block.expert_form is ExpertForm.BATCHED else []
    if experts and block.routed and _split_by_block(graph, model, form, block, linears, stacks, tokens):
        pass  # the patterns told routed experts from shared ones
    elif experts and per_expert and routed <= len(linears):
        share = routed / len(linears)
        form.expert_bytes = lin_bytes * share
        form.expert_macs = lin_macs * share / experts
        form.shared_bytes = lin_bytes - form.expert_bytes
        form.shared_macs = lin_macs - lin_macs * share
        form.shared_linears = len(linears) - routed
    if not experts:
        model.uncounted.append(Uncounted("moe", f"MoE block at {router.display_name}: expert count unknown"))
        return form
    if block.expert_form is ExpertForm.DENSE:
        form.experts_read = float(experts)
        label = f"the dense expert loop reads all {experts} experts"
    elif block.expert_form is ExpertForm.GATHER:
        # every expert's MatMuls run, on the tokens routed to it: an expert no token chose reads nothing
        form.experts_read = float(min(tokens * k, experts)) if k else None
        label = f"the per-expert gather loop reads {_experts_text(form.experts_read)} of {experts} experts (no dedup)"
        if form.experts_read is not None:
            scale = form.experts_read / experts
            for n in linears:
                c = costs[n.index].cost
                for key in list(c.bytes_by_dtype):
                    c.bytes_by_dtype[key] *= scale
                c.bytes *= scale
                c.flops *= k / experts
    else:
        form.experts_read = float(min(tokens * k, experts)) if k else None
        label = f"the per-token expert gather reads {_experts_text(form.experts_read)} of {experts} experts (no dedup)"
        if form.experts_read is not None:
            _read_chosen_slices(graph, model, stacks, form.experts_read / experts, tokens * k)
    for n in nodes:
        nc = costs.get(n.index)
        if nc is not None and nc.cost.bytes:
            nc.label = label
    return form


def _gathered_stacks(graph: Graph, nodes: list[Node], known: set[str]) -> list[Node]:
    """The Gather / GatherND nodes of a batched block that pick expert slices out of an [E, ., .] weight stack."""
    out = []
    for n in nodes:
        if n.op_type in ("Gather", "GatherND") and n.input(1) not in known:
            init = graph.initializers.get(n.input(0))
            if init is not None and len(init.dims) == 3:
                out.append(n)
    return out


def _read_chosen_slices(graph: Graph, model: StepModel, stacks: list[Node], share: float, rows: int) -> None:
    """A gather of (token, expert) pairs reads the chosen experts' slices of each [E, ., .] stack, not the stack.
    Set, not scaled: a Gather was already priced by its indices' count (tokens x k rows, which may exceed E),
    a GatherND by its whole data input. The batched MatMul its slices feed has no constant weight to price it by,
    so the gather carries the FLOPs of its `rows` (token, expert) pairs through one slice each."""
    for n in stacks:
        init = graph.initializers[n.input(0)]
        size = dtype_bytes(init.dtype)
        if size is None:
            continue
        nc = model.costed(n.index)
        nc.cost.bytes = init.numel * size * share
        nc.cost.bytes_by_dtype = {init.dtype or "unknown": nc.cost.bytes}
        nc.cost.flops = 2.0 * rows * init.dims[1] * init.dims[2]
        nc.compute_dtype = init.dtype


def _split_by_block(graph: Graph, model: StepModel, form: MoeLayerForm, block: MoeBlock, linears: list[Node],
                    stacks: list[Node], tokens: int) -> bool:
    """Routed and shared expert bytes and MACs from the block's own expert list (shared experts and their gates
    are not routed, whatever their count); False when the block's routed linears are not among the costed ones."""
    costs = model.costs
    experts = form.experts or 0
    routed_ids = {n.index for n in block.routed_linears}
    routed = [n for n in linears if n.index in routed_ids]
    shared = [n for n in linears if n.index not in routed_ids]
    if not experts or not (routed or stacks):
        return False
    macs = sum(costs[n.index].cost.flops for n in routed) / (2.0 * tokens) if tokens else 0.0
    if stacks:
        # batched: every (token, choice) row runs through the expert slices the gathers pick from [E, out, in] stacks
        stack_bytes = stack_macs = 0.0
        for n in stacks:
            init = graph.initializers[n.input(0)]
            size = dtype_bytes(init.dtype)
            if size is None:
                return False
            stack_bytes += init.numel * size
            stack_macs += init.dims[1] * init.dims[2]
        form.expert_bytes = stack_bytes
        form.expert_macs = stack_macs
    else:
        form.expert_bytes = sum(costs[n.index].cost.bytes for n in routed)
        form.expert_macs = macs / experts
    form.shared_bytes = sum(costs[n.index].cost.bytes for n in shared)
    form.shared_macs = sum(costs[n.index].cost.flops for n in shared) / (2.0 * tokens) if tokens else 0.0
    form.shared_linears = len(shared)
    return True


def expert_bytes_read(form: MoeLayerForm) -> float | None:
    """Bytes of routed expert weights one step of the form reads (its `experts_read` of its E experts)."""
    if not form.experts or form.experts_read is None:
        return None
    return form.expert_bytes * form.experts_read / form.experts


def fused_expert_bytes_read(form: MoeLayerForm, tokens: int) -> float | None:
    """The same step's expert weight bytes once the layer is one fused MoE node: the distinct experts `tokens`
    tokens touch (`expected_experts`), as `_fused_moe` prices the node."""
    if not form.experts:
        return None
    return form.expert_bytes * expected_experts(form.experts, form.top_k or 1, tokens) / form.experts


def _experts_text(n: float | None) -> str:
    if n is None:
        return "an unknown number"
    return f"{n:.0f}" if abs(n - round(n)) < 0.05 else f"{n:.1f}"


# ---- attention ------------------------------------------------------------------------------------------------


def attention_core_nodes(graph: Graph, core) -> list[Node]:
    """A decomposed attention core: QK MatMul, scale, mask, Softmax, PV MatMul and what feeds K/V from the cache
    (Concat with the past, repeat_kv's Expand), within the layer; projections, rotary and q/k norms excluded."""

    def compute(g: Graph) -> list[Node]:
        from ortgate.graph.patterns.norms import norm_by_output
        from ortgate.graph.patterns.rotary import rotary_by_output

        norms, rotaries = norm_by_output(g), rotary_by_output(g)
        inputs = g.input_names
        members: dict[int, Node] = {n.index: n for n in core.nodes}
        frontier = [i for n in core.nodes for i in n.inputs if i]
        seen: set[str] = set(frontier)
        while frontier:
            value = frontier.pop()
            if value in norms or value in rotaries or value in inputs or g.is_constant(value):
                continue
            p = g.producer(value)
            if p is None or p.index in members or p.layer != core.layer or p.graph is not None:
                continue
            if p.op_type in _SIMPLE_NORMS or (p.domain, p.op_type) in FUSED_ROTARY_OPS:
                continue
            if projection_dims(g, p) is not None:
                continue
            members[p.index] = p
            for i in p.inputs:
                if i and i not in seen:
                    seen.add(i)
                    frontier.append(i)
        # after PV: the transposes and reshapes back to [batch, seq, hidden]
        value = core.pv.outputs[0] if core.pv.outputs else ""
        for _ in range(4):
            consumers = g.consumers(value)
            if len(consumers) != 1 or consumers[0].op_type not in ("Transpose", "Reshape"):
                break
            members[consumers[0].index] = consumers[0]
            value = consumers[0].outputs[0]
        return sorted(members.values(), key=lambda n: n.index)

    return cached(graph, f"cost.core.{core.softmax.index}", compute)


def _kv_inputs_by_layer(graph: Graph) -> dict[int | None, list[str]]:
    """Graph inputs holding a KV cache (rank 4 with a past/total dim), by the layer of their consumers."""
    from ortgate.cost.shapes import step_role

    def compute(g: Graph) -> dict[int | None, list[str]]:
        out: dict[int | None, list[str]] = defaultdict(list)
        for info in g.inputs:
            shape = info.shape
            if not shape or len(shape) != 4:
                continue
            if not any(isinstance(d, str) and step_role(d) == "context" for d in shape):
                continue
            layers = {c.layer for c in g.consumers(info.name)}
            if len(layers) == 1:
                out[layers.pop()].append(info.name)
        return dict(out)

    return cached(graph, "cost.kv_inputs", compute)


def _attention(graph: Graph, model: StepModel) -> None:
    kv_inputs = _kv_inputs_by_layer(graph)
    for node in fused_attention_nodes(graph):
        if node.graph is not None:
            continue
        native = node.op_type in _FUSED_ATTENTION_NATIVE_KV or (node.domain == DEFAULT_DOMAIN and node.op_type == "Attention")
        if node.op_type == "GroupQueryAttention" or (node.domain == DEFAULT_DOMAIN and node.op_type == "Attention"):
            positions = (input_position(node.domain, node.op_type, n) for n in ("past_key", "past_value"))
            past = [node.input(i) for i in positions if i is not None]
        else:
            past = []
        window = node.int_attr("local_window_size", -1) if node.op_type == "GroupQueryAttention" else -1
        heads = node.int_attr("num_heads") or node.int_attr("q_num_heads")
        model.attention_forms[node.layer] = "fused" if node.op_type == "GroupQueryAttention" else node.op_type
        past = [p for p in past if p]
        if not past and not native:
            past = kv_inputs.get(node.layer, [])
        info = _kv_bytes(graph, model, past, window, node.display_name, _fused_head_size(graph, node))
        if info is None:
            continue
        factor = 1.0
        if not native:  # K/V handed in full: a Concat copies the cache, repeat_kv expands it to the q heads
            repeat = max(1, (heads or info["kv_heads"]) // info["kv_heads"]) if info["kv_heads"] else 1
            expanded = any(kv_expanded(graph, node.input(i)) for i in (1, 2))
            factor = 2.0 + ((1 + 2 * repeat) if expanded else 1.0)
        _charge_kv(model, node.index, info, factor, heads or info["kv_heads"])
    for core in attention_cores(graph):
        if core.layer in model.kv or core.softmax.graph is not None:
            continue
        model.attention_forms[core.layer] = "decomposed"
        info = _kv_bytes(graph, model, kv_inputs.get(core.layer, []), -1, core.softmax.display_name)
        if info is None:
            continue
        q_heads = _query_heads(graph, core, info)
        repeat = max(1, q_heads // info["kv_heads"]) if info["kv_heads"] else 1
        concat = any(n.op_type == "Concat" for n in attention_core_nodes(graph, core))
        factor = (2.0 if concat else 0.0) + ((1 + 2 * repeat) if core.repeat_kv else 1.0)
        _charge_kv(model, core.softmax.index, info, factor, q_heads)
    for layer in {n.layer for d, o in LINEAR_ATTENTION_OPS for n in graph.by_op(d, o)}:
        model.attention_forms.setdefault(layer, "linear")


def _charge_kv(model: StepModel, index: int, info: dict, factor: float, q_heads: int) -> None:
    shape = model.shape
    info["factor"] = factor
    info["q_heads"] = q_heads
    nc = model.costed(index)
    model.kv[nc.layer] = info
    nc.cost.add_bytes(info["bytes"] * factor, info["dtype"])
    nc.cost.flops += 4.0 * shape.batch * shape.new_tokens * q_heads * info["positions"] * info["head_size"]
    nc.compute_dtype = info["dtype"]
    window = f", sliding window {info['window']}" if info.get("window") else ""
    copies = "" if factor == 1 else f" (moved {factor:g}x: copied to the present, expanded to every query head)"
    nc.label = f"the KV cache at {info['positions']:,} positions{window}{copies}"


def _query_heads(graph: Graph, core, info: dict) -> int:
    """Query heads of a decomposed core: its q projection's width / head size (else the kv heads)."""
    hs, kv = info["head_size"], info["kv_heads"]
    for qkv in qkv_projections(graph):
        if qkv.attention is core.softmax and qkv.q is not None and hs:
            dims = projection_dims(graph, qkv.q)
            if dims:
                width = dims[-1] - (2 * kv * hs if qkv.packed else 0)  # a packed projection is [q | k | v]
                if width > 0:
                    return max(1, width // hs)
    shape = graph.shape(core.qk.input(0)) if core.qk.inputs else None
    if shape and len(shape) == 4 and isinstance(shape[1], int):
        return shape[1]
    return info["kv_heads"] or 1


def _fused_head_size(graph: Graph, node: Node) -> int | None:
    """A fused attention node's head size, from its attributes and the widths of its q/k inputs: the KV cache of
    onnxruntime-genai's exports names it symbolically (`kv_cache_dim`). None when the widths are not known."""
    heads = node.int_attr("num_heads") or node.int_attr("q_num_heads")
    if not heads:
        return None
    kv_heads: int = node.int_attr("kv_num_heads") or heads

    def width(i: int) -> int | None:
        shape = graph.shape(node.input(i)) if node.input(i) else None
        return shape[-1] if shape and len(shape) == 3 and isinstance(shape[-1], int) and shape[-1] > 0 else None

    key = width(1) if node.op_type == "GroupQueryAttention" else None
    if key and kv_heads and key % kv_heads == 0:
        return key // kv_heads
    query = width(0)
    if query is None:
        return None
    packed = node.op_type == "GroupQueryAttention" and not node.input(1)  # [q | k | v] in one input
    parts = heads + 2 * kv_heads if packed else heads
    return query // parts if query % parts == 0 else None


def _kv_bytes(graph: Graph, model: StepModel, past: list[str], window: int | None, where: str,
              node_head_size: int | None = None) -> dict | None:
    """K + V bytes one step reads from the cache: 2 x kv_heads x head_size x dtype x B x L_eff, with
    L_eff = min(context, window) for a sliding window (and min(context, a fixed cache length)). A symbolic head
    size is the attention node's (`node_head_size`) when it could be read from the node."""
    shape = model.shape
    if not past:
        return None
    total = 0.0
    kv_heads = head_size = 0
    positions = shape.context
    dtype = None
    for name in past[:2]:
        dims = graph.shape(name)
        dt = graph.dtype(name)
        size = dtype_bytes(dt)
        if not dims or len(dims) != 4 or size is None:
            why = "unknown dtype" if size is None else "shape not [batch, heads, positions, head_size]"
            model.uncounted.append(Uncounted("attention", f"KV cache {name} at {where}: {why}: not counted"))
            return None
        batch = shape.dim(dims[0])
        heads, seq, hs = dims[1], dims[2], dims[3]
        if isinstance(hs, str) and node_head_size:
            hs = node_head_size
        if not isinstance(heads, int) or not isinstance(hs, int) or batch is None:
            unresolved = [str(d) for d in (dims[0], heads, hs) if not isinstance(d, int) and shape.dim(d) is None]
            model.uncounted.append(Uncounted("attention", f"KV cache {name} at {where}: symbolic dims "
                                                          f"{', '.join(unresolved) or '?'}: not counted"))
            return None
        pos = shape.context
        if isinstance(seq, int) and seq > 0:
            pos = min(pos, seq)  # a fixed-length (or sliding-window) cache holds at most this many positions
        if window is not None and window > 0:
            pos = min(pos, window)
        positions = pos
        kv_heads, head_size, dtype = heads, hs, dt
        total += batch * heads * pos * hs * size
    if len(past) == 1:
        total *= 2
    return {"bytes": total, "kv_heads": kv_heads, "head_size": head_size, "positions": positions,
            "window": window if window and window > 0 else None, "dtype": dtype, "factor": 1.0}


def _linear_attention_state(graph: Graph, model: StepModel) -> None:
    """Recurrent and convolution states of linear-attention layers: read and written once per step."""
    inputs = graph.input_names
    for d, o in LINEAR_ATTENTION_OPS:
        for node in graph.by_op(d, o):
            if node.graph is not None:
                continue
            for name in node.inputs:
                if name not in inputs:
                    continue
                n, unresolved = model.shape.numel(graph.shape(name))
                size = dtype_bytes(graph.dtype(name))
                if n is None or size is None:
                    what = f"dims {', '.join(unresolved)}" if n is None else "dtype"
                    model.uncounted.append(Uncounted("attention", f"state {name} of {node.display_name}: {what} "
                                                                  "unknown: not counted"))
                    continue
                nc = model.costed(node.index)
                nc.cost.add_bytes(2.0 * n * size, graph.dtype(name))
                nc.label = "linear-attention states (read and written each step)"


# ---- ORT's own fusions ---------------------------------------------------------------------------------------


def _apply_ort_fusions(graph: Graph, model: StepModel, provider: str | None, level: str | None,
                       optimized: bool) -> None:
    """Launches as ORT will run them: decomposed RMSNorms its SimplifiedLayerNormFusion matches become one node,
    x * Sigmoid(x) becomes QuickGelu. An optimized dump already shows ORT's fusions: nothing is applied to it."""
    if optimized:
        return
    from ortgate.knowledge.fusions import pass_applies, rmsnorm_form_fused

    launches = model.launches
    if pass_applies("SimplifiedLayerNormFusion", provider, level):
        fused = 0
        for norm in decomposed_rmsnorms(graph):
            if rmsnorm_form_fused(norm.form, provider, level):
                fused += 1
                for n in norm.nodes[:-1]:
                    launches[n.index] = 0
        if fused:
            model.ort_fusions_applied.append(f"SimplifiedLayerNormFusion ({fused} RMSNorms)")
    if pass_applies("QuickGeluFusion", provider, level):
        fused = 0
        for sig in graph.by_op_type("Sigmoid"):
            g = sig.input(0)
            if not sig.outputs or not launches[sig.index]:
                continue
            if all(c.op_type == "Mul" and g in c.inputs for c in graph.consumers(sig.outputs[0])):
                launches[sig.index] = 0
                fused += 1
        if fused:
            model.ort_fusions_applied.append(f"QuickGeluFusion ({fused} SiLUs)")
