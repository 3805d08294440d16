"""A decode step's time on a device, as exported and with every fix: the estimate the gate, the reports and
`ortgate estimate` share.

Per node, the roofline time max(bytes / (bandwidth x memory efficiency), FLOPs / (peak x compute efficiency));
the step adds launches x per-kernel time (larger without CUDA graph) and host synchronisations x per-sync time.
The hard ceiling is the floor no real run can beat: max(bytes / peak bandwidth, FLOPs / peak), no overhead.
Tokens per second = batch x new tokens / step time. Every figure is an estimate for its device, never a
measurement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ortgate.cost.model import COMPONENTS, Cost, NodeCost, StepModel, Uncounted, expert_bytes_read, step_model
from ortgate.cost.repairs import Repair, RepairKind, find_repairs, partial
from ortgate.cost.shapes import StepShape
from ortgate.graph.index import DEFAULT_DOMAIN, Graph
from ortgate.knowledge import cuda_providers
from ortgate.knowledge.deployment_facts import deployment_fact
from ortgate.knowledge.devices import Device
from ortgate.knowledge.provider_names import CPU, CUDA

GPU_GRAPH_PROVIDERS = cuda_providers()  # their graph capture is CUDA graph


@dataclass(frozen=True)
class CostSetup:
    """What the estimate is for: a device, the step's shape, and how the session runs the graph."""

    device: Device
    shape: StepShape = StepShape()
    provider: str | None = None  # the execution provider (None: the device's usual one)
    optimization_level: str | None = None  # None: ORT's default, ORT_ENABLE_ALL
    cuda_graph: bool = False  # CUDA graph capture requested
    optimized: bool = False  # the graph is ORT's optimized dump (ORT's fusions are already in it)
    ort_release: str | None = None  # the deployment's ONNX Runtime release (None: not known; release-gated paths off)

    @property
    def gpu(self) -> bool:
        return self.device.is_gpu_like and (self.provider is None or self.provider != CPU)


@dataclass
class Totals:
    """Additive totals of a set of nodes on one device."""

    bytes: float = 0.0
    flops: float = 0.0
    launches: int = 0
    syncs: int = 0
    roofline_s: float = 0.0  # sum of the nodes' max(memory time, compute time)
    flop_floor_s: float = 0.0  # sum of FLOPs / peak: the compute floor
    roofline_cache_s: float = 0.0  # the same with the weights served from the last-level cache (CPUs)

    def add(self, cost: Cost, roofline_s: float, flop_floor_s: float, roofline_cache_s: float, sign: int = 1) -> None:
        self.bytes += sign * cost.bytes
        self.flops += sign * cost.flops
        self.launches += sign * cost.launches
        self.syncs += sign * cost.syncs
        self.roofline_s += sign * roofline_s
        self.flop_floor_s += sign * flop_floor_s
        self.roofline_cache_s += sign * roofline_cache_s

    def add_totals(self, other: Totals, sign: int = 1) -> None:
        self.bytes += sign * other.bytes
        self.flops += sign * other.flops
        self.launches += sign * other.launches
        self.syncs += sign * other.syncs
        self.roofline_s += sign * other.roofline_s
        self.flop_floor_s += sign * other.flop_floor_s
        self.roofline_cache_s += sign * other.roofline_cache_s

    def copy(self) -> Totals:
        return Totals(self.bytes, self.flops, self.launches, self.syncs, self.roofline_s, self.flop_floor_s,
                      self.roofline_cache_s)


@dataclass
class StepEstimate:
    """One step of one graph form ("as exported" or "with fixes") on the device."""

    label: str
    totals: Totals
    cuda_graph: bool
    kernel_us: float  # per-launch time used
    sync_us: float
    bandwidth: float  # bytes/s of memory (the catalog's or the probe's)
    tokens: int
    cache_bandwidth: float | None = None  # bytes/s when the step's bytes fit in the last-level cache
    _breakdown: tuple = ()  # (model, nodes() of the repaired form or None, device): components on demand
    _removed_of: Callable[[], set[int]] | None = None  # the nodes repairs removed (with fixes)
    _components: dict[str, Totals] | None = None
    _layers: dict[int | None, dict[str, Totals]] | None = None
    _by_dtype: dict[str, float] | None = None

    @property
    def components(self) -> dict[str, Totals]:
        """Totals per component (computed on first use: a pass over every node)."""
        if self._components is None:
            self._tally()
        return self._components  # type: ignore[return-value]

    @property
    def layers(self) -> dict[int | None, dict[str, Totals]]:
        """Totals per decoder layer (None: outside the layers) and component."""
        if self._layers is None:
            self._tally()
        return self._layers  # type: ignore[return-value]

    @property
    def bytes_by_dtype(self) -> dict[str, float]:
        if self._by_dtype is None:
            self._tally()
        return self._by_dtype  # type: ignore[return-value]

    def _tally(self) -> None:
        model, nodes, device = self._breakdown
        components: dict[str, Totals] = {c: Totals() for c in COMPONENTS}
        layers: dict[int | None, dict[str, Totals]] = defaultdict(dict)
        component = model.components.get
        graph_nodes = model.graph.nodes
        removed = self._removed_of() if self._removed_of is not None else set()
        for i, count in enumerate(model.launches):
            if count and i not in removed:
                c = component(i, "other")
                layer = graph_nodes[i].layer
                components[c].launches += count
                layers[layer].setdefault(c, Totals()).launches += count
        items = nodes() if nodes is not None else model.costs.values()
        by_dtype: dict[str, float] = defaultdict(float)
        for nc in items:
            times = _node_time(nc, device)
            components[nc.component].add(nc.cost, *times)
            layers[nc.layer].setdefault(nc.component, Totals()).add(nc.cost, *times)
            for k, v in nc.cost.bytes_by_dtype.items():
                by_dtype[k] += v
        self._by_dtype = dict(by_dtype)
        self._components = {c: t for c, t in components.items() if t.bytes or t.launches or t.flops or t.syncs}
        self._layers = dict(layers)

    @property
    def in_cache(self) -> bool:
        """The step reads little enough for the device's last-level cache to hold it (CPUs)."""
        return self.cache_bandwidth is not None

    @property
    def step_bandwidth(self) -> float:
        return self.cache_bandwidth if self.cache_bandwidth is not None else self.bandwidth

    def _roofline(self, t: Totals) -> float:
        return t.roofline_cache_s if self.in_cache else t.roofline_s

    @property
    def overhead_s(self) -> float:
        return self.totals.launches * self.kernel_us * 1e-6 + self.totals.syncs * self.sync_us * 1e-6

    @property
    def expected_s(self) -> float:
        return self._roofline(self.totals) + self.overhead_s

    @property
    def ceiling_s(self) -> float:
        """The floor time: perfect overlap, no overhead."""
        bandwidth = self.step_bandwidth
        return max(self.totals.bytes / bandwidth if bandwidth else 0.0, self.totals.flop_floor_s)

    @property
    def tokens_per_s_expected(self) -> float | None:
        return self.tokens / self.expected_s if self.expected_s > 0 else None

    @property
    def tokens_per_s_ceiling(self) -> float | None:
        return self.tokens / self.ceiling_s if self.ceiling_s > 0 else None

    def component_time_s(self, component: str) -> float:
        t = self.components.get(component)
        if t is None:
            return 0.0
        return self._roofline(t) + t.launches * self.kernel_us * 1e-6 + t.syncs * self.sync_us * 1e-6

    def to_dict(self) -> dict[str, Any]:
        expected = self.expected_s
        return {
            "bytes_per_step": round(self.totals.bytes),
            "bytes_per_token": round(self.totals.bytes / self.tokens) if self.tokens else None,
            "bytes_by_dtype": {k: round(v) for k, v in sorted(self.bytes_by_dtype.items()) if v},
            "flops_per_step": round(self.totals.flops),
            "kernel_launches": self.totals.launches,
            "host_syncs": self.totals.syncs,
            "cuda_graph": self.cuda_graph,
            "ms_per_step_ceiling": _ms(self.ceiling_s),
            "ms_per_step_expected": _ms(expected),
            "tokens_per_s_ceiling": _round(self.tokens_per_s_ceiling),
            "tokens_per_s_expected": _round(self.tokens_per_s_expected),
            "components": {
                name: {
                    "bytes_per_step": round(t.bytes),
                    "flops_per_step": round(t.flops),
                    "kernel_launches": t.launches,
                    "host_syncs": t.syncs,
                    "ms_expected": _ms(self.component_time_s(name)),
                    "share_of_step": round(self.component_time_s(name) / expected, 4) if expected else None,
                }
                for name, t in self.components.items()
            },
        }


@dataclass(frozen=True)
class Saving:
    """What a set of repairs saves on one step: the time per output token and its share of the step."""

    ms_per_token: float  # each sequence's time per output token (the step time) saved
    share: float  # of the as-exported expected step
    repairs: int


@dataclass(frozen=True)
class CostItem:
    """One of the step's largest costs, in plain words."""

    words: str
    ms: float
    share: float


@dataclass
class LayerGroup:
    """Decoder layers whose costed nodes are alike, priced once."""

    layers: list[int]
    signature: tuple
    totals: dict[str, Totals]
    forms: str


@dataclass
class Estimate:
    """A decode step's estimated cost on one device, as exported and with the fixes applied."""

    setup: CostSetup
    model: StepModel
    as_exported: StepEstimate
    with_fixes: StepEstimate
    repairs: list[Repair]
    node_times: dict[int, tuple[float, float, float]]  # node index -> (roofline s, flop floor s, in-cache roofline s)

    @property
    def uncounted(self) -> list[Uncounted]:
        return self.model.uncounted

    @property
    def device(self) -> Device:
        return self.setup.device

    def saving(self, repairs: Iterable[Repair]) -> Saving:
        repairs = list(repairs)
        repaired = _apply(self, repairs)
        saved = max(0.0, self.as_exported.expected_s - repaired.expected_s)
        expected = self.as_exported.expected_s
        return Saving(saved * 1e3, saved / expected if expected else 0.0, len(repairs))

    def repairs_of(self, kind: str, layer: int | None | str = "any") -> list[Repair]:
        # Indexed once: pricing asks for each finding's repairs, and a long model has many of both.
        index = self.__dict__.get("_repairs_index")
        if index is None or index[0] != len(self.repairs):
            by_kind: dict[str, list[Repair]] = {}
            by_layer: dict[tuple[str, int | str | None], list[Repair]] = {}
            for r in self.repairs:
                by_kind.setdefault(r.kind, []).append(r)
                by_layer.setdefault((r.kind, r.layer), []).append(r)
            index = self.__dict__["_repairs_index"] = (len(self.repairs), by_kind, by_layer)
        found = index[1].get(kind, []) if layer == "any" else index[2].get((kind, layer), [])
        return list(found)

    def largest_costs(self, n: int = 3) -> list[CostItem]:
        return largest_costs(self, n)

    def layer_groups(self) -> list[LayerGroup]:
        return layer_groups(self)

    def to_dict(self) -> dict[str, Any]:
        s = self.setup
        d = s.device
        return {
            "estimate": True,
            "device": d.name,
            "device_label": d.label,
            "figures": d.figures(),
            "batch_size": s.shape.batch,
            "new_tokens": s.shape.new_tokens,
            "context_length": s.shape.context,
            "provider": s.provider,
            "as_exported": self.as_exported.to_dict(),
            "with_fixes": self.with_fixes.to_dict(),
            "moe_layers": [{"layer": f.layer, "form": f.form, "experts": f.experts, "top_k": f.top_k,
                            "experts_read": None if f.experts_read is None else round(f.experts_read, 2),
                            "expert_bytes_read": None if (b := expert_bytes_read(f)) is None else round(b)}
                           for f in self.model.moe_forms],
            "largest_costs": [{"what": c.words, "ms": round(c.ms, 4), "share_of_step": round(c.share, 4)}
                              for c in self.largest_costs()],
            "ort_fusions_counted": list(self.model.ort_fusions_applied),
            "not_counted": [{"component": u.component, "what": u.what} for u in self.uncounted],
        }


def estimate(graph: Graph, setup: CostSetup) -> Estimate:
    """The step estimate of `graph` for `setup` (see the module docstring). Never reads a weight byte."""
    device = setup.device
    if device.bandwidth is None:
        raise ValueError(f"device {device.name}: no bandwidth figure (the cpu device needs its probe first)")
    model = step_model(graph, setup.shape, gpu=setup.gpu, provider=setup.provider,
                       optimization_level=setup.optimization_level, optimized=setup.optimized)
    times, totals = _node_times(model, device)
    repairs = list(_repairs(model))
    repairs += _onnx_attention_on_cuda(model, setup, times, totals)
    repairs += _qmoe_off_gemv_on_cuda(model, setup, times, totals)
    cuda_graph_now = setup.cuda_graph and _graph_capturable(setup, model.control_flow, totals.syncs)
    as_exported = _step("as exported", totals, setup, cuda_graph_now, None, model)
    est = Estimate(setup, model, as_exported, as_exported, repairs, times)
    if setup.gpu and not setup.cuda_graph and (setup.provider is None or setup.provider in GPU_GRAPH_PROVIDERS):
        repairs.append(Repair(RepairKind.cuda_graph, None, "", frozenset(), []))
    est.with_fixes = _apply(est, repairs, label="with fixes")
    return est




def _onnx_attention_on_cuda(model: StepModel, setup: CostSetup, times: dict[int, tuple[float, float, float]],
                            totals: Totals) -> list[Repair]:
    """ONNX-domain Attention on the CUDA provider runs a generic kernel without GroupQueryAttention's decode paths
    (knowledge/deployment_facts.json, onnx_attention_cuda_decode: about 34 us against 10 us per layer and decode
    step). Each such node's time gains the difference (`times` and `totals` are updated), and a repair per node puts
    a GroupQueryAttention with the same bytes, FLOPs and launches in its place: the difference is its saving."""
    if not setup.gpu or (setup.provider or CUDA) != CUDA:
        return []
    nodes = [n for n in model.graph.by_op(DEFAULT_DOMAIN, "Attention") if n.graph is None]
    if not nodes:
        return []
    slow_us, fast_us = deployment_fact("onnx_attention_cuda_decode").values[:2]
    extra = (slow_us - fast_us) * 1e-6
    return _slow_path_repairs(model, times, totals, nodes, lambda roof: extra, RepairKind.onnx_attention,
                              "com.microsoft.GroupQueryAttention", "attention",
                              "GroupQueryAttention's decode kernels in place of the ONNX Attention's generic one")


def qmoe_off_gemv(graph, node) -> bool:
    """A float16/bfloat16 QMoE with integer weights outside the CUDA batch-1 GEMV fast path
    (knowledge/ort_cuda_contracts.json qmoe_gemv: INT4/INT8, per-column or block 32/64/128)."""
    from ortgate.knowledge.cuda_contracts import cuda_contracts

    gemv = cuda_contracts().qmoe_gemv
    quant = node.attr("quant_type", "int")
    if (quant.decode() if isinstance(quant, bytes) else str(quant)) != "int":
        return False
    if graph.dtype(node.input(0)) not in gemv.activation_dtypes:
        return False
    return node.attr("expert_weight_bits", 4) not in gemv.bits or node.attr("block_size", 0) not in gemv.block_sizes


def _qmoe_off_gemv_on_cuda(model: StepModel, setup: CostSetup, times: dict[int, tuple[float, float, float]],
                           totals: Totals) -> list[Repair]:
    """A CUDA QMoE off the batch-1 GEMV fast path runs the grouped GEMM at decode. The fast path made GPT-OSS-20B
    decode about 15% faster (knowledge/ort_cuda_contracts.json qmoe_gemv); the cost model applies that speed-up
    to the node alone (its time divided by 1.15 on the fast path: ortgate's reading, a MoE-bound decode), only at
    batch-1 decode, on the releases that have the fast path. Each such node's time gains the difference, and a
    repair per node is the fast path in its place."""
    from ortgate.knowledge.cuda_contracts import cuda_contracts
    from ortgate.knowledge.deployment_facts import at_least

    if not setup.gpu or (setup.provider or CUDA) != CUDA or setup.shape.batch != 1 or setup.shape.new_tokens != 1:
        return []
    if not at_least(setup.ort_release, cuda_contracts().qmoe_gemv.since):
        return []  # before the fast path, every QMoE takes the grouped GEMM: nothing to repair
    nodes = [n for n in model.graph.by_op("com.microsoft", "QMoE") if n.graph is None and qmoe_off_gemv(model.graph, n)]
    speedup = cuda_contracts().qmoe_gemv.speedup
    # fast = slow / (1 + speedup): the slow path takes `speedup` times the fast one more
    return _slow_path_repairs(model, times, totals, nodes, lambda roof: roof * speedup, RepairKind.qmoe_gemv,
                              "com.microsoft.QMoE", "moe", "the QMoE batch-1 GEMV fast path in place of the grouped GEMM",
                              keep_efficiency=True)


def _slow_path_repairs(model: StepModel, times: dict[int, tuple[float, float, float]], totals: Totals, nodes: list,
                       extra_s: Callable[[float], float], kind: RepairKind, op: str, component: str, label: str,
                       *, keep_efficiency: bool = False) -> list[Repair]:
    """Nodes that take a slow kernel path: each node's time gains `extra_s(its roofline time)` (`times` and `totals`
    are updated), and a repair per node puts `op` with the same bytes, FLOPs and launches in its place, so the
    difference is its saving."""
    out = []
    for node in nodes:
        roof, floor, roof_cache = times.get(node.index, (0.0, 0.0, 0.0))
        extra = extra_s(roof)
        times[node.index] = (roof + extra, floor, roof_cache + extra)
        totals.roofline_s += extra
        totals.roofline_cache_s += extra
        nc = model.costs.get(node.index)
        cost = nc.cost.copy() if nc is not None else Cost()
        cost.launches = model.launches[node.index]
        added = NodeCost(-1, f"{op} ({kind} repair, layer {node.layer})", op, node.layer,
                         nc.component if nc is not None else component, cost,
                         compute_dtype=nc.compute_dtype if nc is not None else None, label=label)
        if keep_efficiency:
            added.efficiency_kind = nc.efficiency_kind if nc is not None else None
        out.append(Repair(kind, node.layer, node.display_name, frozenset({node.index}), [added]))
    return out


def _repairs(model: StepModel) -> list[Repair]:
    # Kept on the model itself: the graph holds its models weakly, so an id() could name a later model.
    found = model.__dict__.get("_repairs")
    if found is None:
        found = model.__dict__["_repairs"] = find_repairs(model)
    return found


def _node_times(model: StepModel, device: Device) -> tuple[dict[int, tuple[float, float, float]], Totals]:
    """Per costed node (roofline s, FLOP floor s, roofline s from the cache), and the step's totals; factors are
    computed once per kind and dtype."""
    bandwidth = device.bandwidth or 0.0
    cache = (device.cache_bandwidth_gb_s.value or 0.0) * 1e9
    compute_eff = device.compute_efficiency.value or 1.0
    memory_factor: dict[str | None, tuple[float, float]] = {}
    flop_factor: dict[str | None, float] = {}
    out: dict[int, tuple[float, float, float]] = {}
    nbytes = flops = roof = floor_sum = roof_cache = 0.0
    syncs = 0
    for i, nc in model.costs.items():
        cost = nc.cost
        kind = nc.efficiency_kind
        mf = memory_factor.get(kind)
        if mf is None:
            eff = device.efficiency(kind)
            mf = memory_factor[kind] = (1.0 / (bandwidth * eff) if bandwidth else 0.0,
                                        1.0 / (max(cache, bandwidth) * eff) if bandwidth else 0.0)
        floor = 0.0
        if cost.flops:
            ff = flop_factor.get(nc.compute_dtype)
            if ff is None:
                peak = device.peak_flops(nc.compute_dtype)
                ff = flop_factor[nc.compute_dtype] = 1.0 / peak if peak else 0.0
            floor = cost.flops * ff
        compute = floor / compute_eff
        t = out[i] = (max(cost.bytes * mf[0], compute), floor, max(cost.bytes * mf[1], compute))
        nbytes += cost.bytes
        flops += cost.flops
        syncs += cost.syncs
        roof += t[0]
        floor_sum += floor
        roof_cache += t[2]
    launches = sum(model.launches) + sum(nc.cost.launches for nc in model.costs.values())
    return out, Totals(nbytes, flops, launches, syncs, roof, floor_sum, roof_cache)


def _node_time(nc: NodeCost, device: Device) -> tuple[float, float, float]:
    cost = nc.cost
    bandwidth = device.bandwidth or 0.0
    cache = max((device.cache_bandwidth_gb_s.value or 0.0) * 1e9, bandwidth)
    eff = device.efficiency(nc.efficiency_kind)
    compute = floor = 0.0
    if cost.flops:
        peak = device.peak_flops(nc.compute_dtype)
        if peak:
            floor = cost.flops / peak
            compute = floor / (device.compute_efficiency.value or 1.0)
    memory = cost.bytes / (bandwidth * eff) if cost.bytes and bandwidth else 0.0
    memory_cache = cost.bytes / (cache * eff) if cost.bytes and cache else 0.0
    return max(memory, compute), floor, max(memory_cache, compute)


def _graph_capturable(setup: CostSetup, control_flow: int, syncs: int) -> bool:
    return setup.gpu and control_flow == 0 and syncs == 0


def _per_kernel_us(setup: CostSetup, cuda_graph: bool) -> float:
    d = setup.device
    figure = d.graph_kernel_us if cuda_graph and d.graph_kernel_us.value is not None else d.kernel_us
    return figure.value or 0.0


def _step(label: str, totals: Totals, setup: CostSetup, cuda_graph: bool,
          nodes: Callable[[], Iterable[NodeCost]] | None = None, model: StepModel | None = None) -> StepEstimate:
    device = setup.device
    sync = (device.sync_us.value or 0.0) if setup.gpu else 0.0
    bandwidth = device.bandwidth or 0.0
    step_bandwidth = device.step_bandwidth(totals.bytes) or bandwidth
    step = StepEstimate(label, totals, cuda_graph, _per_kernel_us(setup, cuda_graph), sync, bandwidth,
                        setup.shape.tokens, step_bandwidth if step_bandwidth > bandwidth else None)
    step._breakdown = (model, nodes, setup.device)
    return step


def _usable(est: Estimate, repairs: Iterable[Repair]) -> list[Repair]:
    """Repairs applied together, in order. One whose nodes another already replaced applies to the patterns left
    (a layer's q/k norms once its residual norms became SkipSimplifiedLayerNormalization), or not at all."""
    taken: set[int] = set()
    out = []
    for r in sorted(repairs, key=lambda r: r.order):
        if r.removed & taken:
            left = partial(est.model, r, taken) if r.parts else None
            if left is None:
                continue
            r = left
        taken |= r.removed
        out.append(r)
    return out


def _removed_totals(est: Estimate, repair: Repair) -> Totals:
    """What a repair's removed nodes cost (summed once per repair and kept)."""
    cache = est.__dict__.setdefault("_removed", {})
    key = id(repair)
    found = cache.get(key)
    if found is None:
        model, times = est.model, est.node_times
        launches, costs = model.launches, model.costs
        n = syncs = 0
        nbytes = flops = roof = floor = roof_cache = 0.0
        for i in repair.removed:
            n += launches[i]
            nc = costs.get(i)
            if nc is not None:
                c = nc.cost
                nbytes += c.bytes
                flops += c.flops
                syncs += c.syncs
                t = times[i]
                roof += t[0]
                floor += t[1]
                roof_cache += t[2]
        found = cache[key] = Totals(nbytes, flops, n, syncs, roof, floor, roof_cache)
    return found


def _apply(est: Estimate, repairs: list[Repair], label: str = "repaired") -> StepEstimate:
    """The as-exported step with `repairs` applied (each repair's removed cost is summed once)."""
    base = est.as_exported
    totals = base.totals.copy()
    usable = _usable(est, repairs)
    device = est.device
    model = est.model
    for r in usable:
        totals.add_totals(_removed_totals(est, r), sign=-1)
        for nc in r.added:
            totals.add(nc.cost, *_node_time(nc, device))
    cuda_graph = base.cuda_graph or (any(r.kind == RepairKind.cuda_graph for r in usable)
                                     and _graph_capturable(est.setup, model.control_flow, totals.syncs))

    def nodes() -> list[NodeCost]:
        removed = set().union(*(r.removed for r in usable)) if usable else set()
        return [*(nc for i, nc in model.costs.items() if i not in removed), *(n for r in usable for n in r.added)]

    step = _step(label, totals, est.setup, cuda_graph, nodes, model)
    step._removed_of = lambda: set().union(*(r.removed for r in usable)) if usable else set()
    return step


# ---- plain words --------------------------------------------------------------------------------------------------

_COMPONENT_WORDS = {
    "attention": "attention weights (q/k/v/o projections)",
    "moe": "MoE router and expert weights",
    "mlp": "dense MLP weights",
    "norms": "norm weights",
    "embedding": "the embedding rows",
    "lm_head": "the lm_head (the whole vocabulary projection)",
    "other": "other weights",
}


def largest_costs(est: Estimate, n: int = 3) -> list[CostItem]:
    """The step's largest costs: bytes grouped by what reads them, kernel launches, host synchronisations."""
    step = est.as_exported
    expected = step.expected_s or 1.0
    which = 2 if step.in_cache else 0
    groups: dict[str, list] = defaultdict(lambda: [0.0, 0.0, set()])  # words -> [bytes, seconds, layers]
    times = est.node_times
    component_words = _COMPONENT_WORDS.get
    for i, nc in est.model.costs.items():
        nbytes = nc.cost.bytes
        if not nbytes:
            continue
        words = nc.label or component_words(nc.component, nc.component)
        g = groups[words]
        g[0] += nbytes
        g[1] += times[i][which]
        if nc.layer is not None:
            g[2].add(nc.layer)
    items = []
    bw = format_bandwidth(step.step_bandwidth)
    for words, (nbytes, seconds, layers) in groups.items():
        where = f" in {len(layers)} layer{'s' if len(layers) != 1 else ''}" if len(layers) > 1 else ""
        text = f"{words}{where}: {format_bytes(nbytes)} per step = {format_ms(seconds * 1e3)} at {bw}"
        items.append(CostItem(text, seconds * 1e3, seconds / expected))
    launches = step.totals.launches
    if launches:
        seconds = launches * step.kernel_us * 1e-6
        how = ("CPU dispatches" if not est.setup.gpu else
               "kernel launches with CUDA graph" if step.cuda_graph else "kernel launches without CUDA graph")
        items.append(CostItem(f"{launches:,} {how} x {step.kernel_us:g} us = {format_ms(seconds * 1e3)}",
                              seconds * 1e3, seconds / expected))
    syncs = step.totals.syncs
    if syncs and step.sync_us:
        seconds = syncs * step.sync_us * 1e-6
        items.append(CostItem(f"{syncs:,} host synchronisations (data-dependent shapes, copies) x {step.sync_us:g} us "
                              f"= {format_ms(seconds * 1e3)}", seconds * 1e3, seconds / expected))
    items.sort(key=lambda c: (-c.ms, c.words))
    return items[:n]


def layer_groups(est: Estimate) -> list[LayerGroup]:
    """Decoder layers grouped by identical cost (a 48-layer model is usually one group; a hybrid one, two)."""
    step = est.as_exported
    forms: dict[int | None, str] = {}
    for f in est.model.moe_forms:
        forms[f.layer] = f"MoE {f.form}"
    groups: dict[tuple, LayerGroup] = {}
    for layer, comps in step.layers.items():
        if layer is None:
            continue
        attention = est.model.attention_forms.get(layer, "")
        kind = ", ".join(x for x in (f"attention {attention}" if attention else "", forms.get(layer, "")) if x)
        signature = (kind,) + tuple(sorted((c, round(t.bytes), t.launches, t.syncs) for c, t in comps.items()))
        group = groups.get(signature)
        if group is None:
            groups[signature] = LayerGroup([layer], signature, comps, kind)
        else:
            group.layers.append(layer)
    return sorted(groups.values(), key=lambda g: g.layers[0])


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_ms(ms: float) -> str:
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 1:
        return f"{ms:.1f} ms"
    if ms >= 0.01:
        return f"{ms:.2f} ms"
    return f"{ms * 1e3:.1f} us"


def format_bandwidth(bytes_per_s: float) -> str:
    if bytes_per_s >= 1e12:
        return f"{bytes_per_s / 1e12:.3g} TB/s"
    return f"{bytes_per_s / 1e9:.3g} GB/s"


def format_rate(tokens_per_s: float | None) -> str:
    if tokens_per_s is None:
        return "n/a"
    if tokens_per_s >= 100:
        return f"{tokens_per_s:,.0f}"
    return f"{tokens_per_s:.3g}"


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 6)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
