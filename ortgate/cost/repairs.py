"""What fixing a finding changes in the step: each repair removes a decomposed pattern's nodes and puts the fused
op's cost in their place (its bytes, FLOPs and launches), or turns CUDA graph on.

One repair per kind and decoder layer (the findings are per layer too). Kinds (stable names;
each rule names the one that prices it, `price=` on its `@rule`):
moe, attention, qkv, rotary, skip_rmsnorm, rmsnorm, gate_up, swiglu, cuda_graph, and onnx_attention (an ONNX-domain
Attention on CUDA replaced by GroupQueryAttention) and qmoe_gemv (a CUDA QMoE re-quantized for the batch-1 GEMV fast
path), made by the estimate, which knows the provider.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from enum import Enum

from ortgate.cost.model import (
    Cost,
    NodeCost,
    StepModel,
    attention_core_nodes,
    expected_experts,
    fused_expert_bytes_read,
)
from ortgate.graph.index import Node
from ortgate.graph.patterns.attention import attention_cores
from ortgate.graph.patterns.norms import decomposed_rmsnorms, residual_norms
from ortgate.graph.patterns.projections import gated_mlps, qkv_projections
from ortgate.graph.patterns.rotary import decomposed_rotaries
from ortgate.knowledge.devices import op_costs


class RepairKind(str, Enum):
    """A repair the cost model prices, by its stable name: what `@rule(price=)` names and findings are priced with.
    A member is its name as a string (compares, hashes, formats and serializes as the name)."""

    moe = "moe"
    attention = "attention"
    onnx_attention = "onnx_attention"
    qkv = "qkv"
    rotary = "rotary"
    skip_rmsnorm = "skip_rmsnorm"
    rmsnorm = "rmsnorm"
    gate_up = "gate_up"
    swiglu = "swiglu"
    cuda_graph = "cuda_graph"
    qmoe_gemv = "qmoe_gemv"

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]


REPAIR_KINDS = tuple(RepairKind)
_ORDER = {kind: i for i, kind in enumerate(REPAIR_KINDS)}
_FUSED_OP = {
    RepairKind.moe: "com.microsoft.MoE",
    RepairKind.attention: "com.microsoft.GroupQueryAttention",
    RepairKind.qkv: "MatMul",
    RepairKind.rotary: "com.microsoft.RotaryEmbedding",
    RepairKind.skip_rmsnorm: "com.microsoft.SkipSimplifiedLayerNormalization",
    RepairKind.rmsnorm: "SimplifiedLayerNormalization",
    RepairKind.gate_up: "MatMul",
    RepairKind.swiglu: "com.microsoft.QuickGelu",
}
_COMPONENT = {RepairKind.moe: "moe", RepairKind.attention: "attention", RepairKind.qkv: "attention",
              RepairKind.rotary: "attention", RepairKind.skip_rmsnorm: "norms", RepairKind.rmsnorm: "norms"}
_WHAT = {
    RepairKind.moe: "decomposed MoE -> com.microsoft.MoE",
    RepairKind.attention: "decomposed attention -> com.microsoft.GroupQueryAttention",
    RepairKind.onnx_attention: "ONNX-domain Attention on CUDA -> com.microsoft.GroupQueryAttention",
    RepairKind.qkv: "q, k, v -> one packed GEMM",
    RepairKind.rotary: "rotate_half -> com.microsoft.RotaryEmbedding",
    RepairKind.skip_rmsnorm: "residual Add + RMSNorm -> com.microsoft.SkipSimplifiedLayerNormalization",
    RepairKind.rmsnorm: "decomposed RMSNorm -> SimplifiedLayerNormalization",
    RepairKind.gate_up: "gate and up -> one merged GEMM",
    RepairKind.swiglu: "Sigmoid + Mul -> QuickGelu",
    RepairKind.cuda_graph: "CUDA graph capture on",
    RepairKind.qmoe_gemv: "CUDA QMoE off the batch-1 GEMV fast path -> INT4/INT8, block 32/64/128",
}


@dataclass
class Repair:
    """One repair the cost model prices: the nodes it removes and adds in one layer."""

    kind: RepairKind
    layer: int | None
    anchor: str  # the first node the repair is about (display name)
    removed: frozenset[int]  # node indices whose cost goes away
    added: list[NodeCost] = field(default_factory=list)  # the fused op(s) in their place (summed)
    instances: int = 1  # patterns repaired (e.g. 128 experts' gate/up pairs in one layer)
    # Each pattern's nodes, for repairs whose fused op reads what the pattern read with one launch each (norms,
    # rotary, packed projections): when another repair already replaced some of them, the rest still apply.
    parts: tuple[frozenset[int], ...] = ()

    @property
    def order(self) -> int:
        return _ORDER.get(self.kind, len(_ORDER))

    @property
    def description(self) -> str:
        return _WHAT.get(self.kind, self.kind)


class _Group:
    """Instances of one repair kind in one layer, summed into one repair."""

    def __init__(self) -> None:
        self.removed: set[int] = set()
        self.cost = Cost()
        self.anchor: Node | None = None
        self.dtype: str | None = None
        self.label: str | None = None
        self.component: str | None = None
        self.instances = 0
        self.efficiency_kind: str | None = None


def find_repairs(model: StepModel) -> list[Repair]:
    """Every repair the graph allows, one per kind and layer, in the order they are applied together."""
    graph = model.graph
    launches = op_costs().gpu_launches if model.gpu_launches else (lambda _key: 1)
    costs = model.costs
    groups: dict[tuple[RepairKind, int | None], _Group] = defaultdict(_Group)

    launch_counts = model.launches

    def removed_cost(indices) -> Cost:
        """The nodes' costs summed (what Cost.add sums, node by node in `indices`' order)."""
        nbytes = flops = 0.0
        n = syncs = 0
        by_dtype: dict[str, float] = {}
        for i in indices:
            n += launch_counts[i]
            nc = costs.get(i)
            if nc is not None:
                c = nc.cost
                nbytes += c.bytes
                flops += c.flops
                n += c.launches
                syncs += c.syncs
                for k, v in c.bytes_by_dtype.items():
                    by_dtype[k] = by_dtype.get(k, 0.0) + v
        return Cost(nbytes, flops, n, syncs, by_dtype)

    def dtype_of(index: int) -> str | None:
        nc = costs.get(index)
        return nc.compute_dtype if nc is not None else None

    def add(kind: RepairKind, layer: int | None, anchor: Node, indices, cost: Cost, dtype: str | None = None,
            label: str | None = None, component: str | None = None, efficiency_kind: str | None = None) -> None:
        g = groups[(kind, layer)]
        g.removed.update(indices)
        g.cost.add(cost)
        g.instances += 1
        if g.anchor is None:
            g.anchor, g.dtype, g.label, g.component, g.efficiency_kind = anchor, dtype, label, component, efficiency_kind

    tokens = model.shape.tokens
    moe_launches = launches("com.microsoft.MoE")
    for form in model.moe_forms:
        if form.form.startswith("fused") or not form.nodes or not form.experts:
            continue
        k = form.top_k or 1
        touched = expected_experts(form.experts, k, tokens)
        cost = Cost()
        dtype = next((d for n in form.nodes if n.index in costs for d in costs[n.index].cost.bytes_by_dtype), None)
        cost.add_bytes((fused_expert_bytes_read(form, tokens) or 0.0) + form.shared_bytes, dtype)
        cost.flops = 2.0 * tokens * (k * form.expert_macs + form.shared_macs)
        cost.launches = moe_launches + form.shared_linears + (2 if form.shared_linears else 0)
        add(RepairKind.moe, form.layer, form.anchor, (n.index for n in form.nodes), cost, graph.dtype(form.anchor.input(0)),
            f"the fused MoE reads {touched:.1f} of {form.experts} experts per step", "moe", "moe")
    gqa = launches("com.microsoft.GroupQueryAttention")
    for core in attention_cores(graph):
        if core.softmax.graph is not None:
            continue
        indices = [n.index for n in attention_core_nodes(graph, core)]
        info = model.kv.get(core.layer)
        cost = Cost(flops=removed_cost(indices).flops, launches=gqa)
        if info is not None:
            cost.add_bytes(info["bytes"], info["dtype"])
        label = None if info is None else f"the KV cache at {info['positions']:,} positions"
        add(RepairKind.attention, core.layer, core.softmax, indices, cost, dtype_of(core.softmax.index), label)
    # patterns whose fused op reads the same bytes with fewer launches: grouped first, summed once per layer
    # (kind, layer) -> [indices, anchor, instances, dtype node, parts]
    simple: dict[tuple[RepairKind, int | None], list] = defaultdict(lambda: [[], None, 0, None, []])

    def collect(kind: RepairKind, layer: int | None, anchor: Node, indices, dtype_index: int | None = None) -> None:
        entry = simple[(kind, layer)]
        indices = list(indices)
        entry[0].extend(indices)
        entry[2] += 1
        entry[4].append(frozenset(indices))
        if entry[1] is None:
            entry[1] = anchor
            entry[3] = dtype_index

    for qkv in qkv_projections(graph):
        separate = qkv.separate
        if not qkv.packed and qkv.shared_input and len(separate) >= 2:
            collect(RepairKind.qkv, qkv.layer, separate[0], [n.index for n in separate], separate[0].index)
    for rot in decomposed_rotaries(graph):
        # its Sin/Cos nodes are shared by every layer's rotary: not removed per layer
        collect(RepairKind.rotary, rot.layer, rot.neg, [n.index for n in rot.nodes])
    for res in residual_norms(graph):
        nodes: list[Node] = [res.add] + (res.decomposed.nodes if res.decomposed is not None else [res.norm])
        collect(RepairKind.skip_rmsnorm, res.layer, res.norm, [n.index for n in nodes])
    launch_list = model.launches
    for norm in decomposed_rmsnorms(graph):
        indices = [n.index for n in norm.nodes]
        if sum(launch_list[i] for i in indices) > 1:  # else ORT's own fusion already makes it one node
            collect(RepairKind.rmsnorm, norm.layer, norm.last, indices)
    for mlp in gated_mlps(graph):
        if mlp.separate and mlp.gate is not None and mlp.up is not None:
            collect(RepairKind.gate_up, mlp.layer, mlp.gate, (mlp.gate.index, mlp.up.index), mlp.gate.index)
        if not mlp.fused_activation:
            sigmoid = [n.index for n in mlp.activation if n.op_type == "Sigmoid" and launch_list[n.index]]
            if sigmoid:
                collect(RepairKind.swiglu, mlp.layer, mlp.activation[0], sigmoid)
    parts_of: dict[tuple[RepairKind, int | None], tuple[frozenset[int], ...]] = {}
    for (kind, layer), (indices, anchor, instances, dtype_index, parts) in simple.items():
        parts_of[(kind, layer)] = tuple(parts)
        cost = removed_cost(set(indices))
        cost.launches = fused_launches(kind, instances)
        g = groups[(kind, layer)]
        g.removed.update(indices)
        g.cost.add(cost)
        g.instances = instances
        g.anchor = anchor
        g.dtype = dtype_of(dtype_index) if dtype_index is not None else None
        g.component = model.component(anchor.index)
    out: list[Repair] = []
    for (kind, layer), g in groups.items():
        assert g.anchor is not None
        added = [NodeCost(-1 - len(out), f"{_FUSED_OP.get(kind, kind)} ({kind} repair, layer {layer})",
                          _FUSED_OP.get(kind, kind), layer, g.component or _COMPONENT.get(kind, "other"), g.cost,
                          compute_dtype=g.dtype, efficiency_kind=g.efficiency_kind, label=g.label)]
        if not (g.cost.bytes or g.cost.flops or g.cost.launches or g.cost.syncs):
            added = []
        out.append(Repair(kind, layer, g.anchor.display_name, frozenset(g.removed), added, g.instances,
                          parts_of.get((kind, layer), ())))
    out.sort(key=lambda r: (r.order, -1 if r.layer is None else r.layer))
    return out


def fused_launches(kind: RepairKind, instances: int) -> int:
    """Launches of the fused ops that replace `instances` patterns of a simple repair kind."""
    return 0 if kind == RepairKind.swiglu else instances


def partial(model: StepModel, repair: Repair, taken: set[int]) -> Repair | None:
    """What is left of a simple repair once other repairs took some of its nodes (None: nothing is)."""
    parts = [p for p in repair.parts if not (p & taken)]
    if not parts:
        return None
    removed = frozenset().union(*parts)
    cost = Cost()
    for i in removed:
        cost.launches += model.launches[i]
        nc = model.costs.get(i)
        if nc is not None:
            cost.add(nc.cost)
    cost.launches = fused_launches(repair.kind, len(parts))
    added = [NodeCost(-1, f"{_FUSED_OP.get(repair.kind, repair.kind)} ({repair.kind} repair, layer {repair.layer})",
                      _FUSED_OP.get(repair.kind, repair.kind), repair.layer,
                      repair.added[0].component if repair.added else _COMPONENT.get(repair.kind, "other"), cost,
                      compute_dtype=repair.added[0].compute_dtype if repair.added else None)]
    return Repair(repair.kind, repair.layer, repair.anchor, removed, added, len(parts), tuple(parts))
