"""What batching buys, and the prompt phase: the decode step at several batch sizes (experts read, bytes, step
time, tokens/s per sequence and per device, what bounds the step) and the batch at which the MoE layers stop
being bandwidth-bound; the prefill of a prompt (time to first token). Estimates for the device, built on
`ortgate.cost.estimate` (never a weight byte, never a measurement).

The bound of a step is the largest of: the time of the nodes whose bytes take longer than their FLOPs
("bandwidth"), of the nodes whose FLOPs take longer ("compute"), and the kernel launches and host syncs
("launches"). The MoE layers are bandwidth-bound while their expert reads (E(1-(1-k/E)^T) experts at T = batch
tokens) take longer than their FLOPs (2 x T x k x the expert's MACs); past the crossover batch, compute.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ortgate.cost.estimate import CostSetup, Estimate, estimate
from ortgate.cost.model import StepModel
from ortgate.cost.shapes import StepShape
from ortgate.graph.index import Graph

MAX_CROSSOVER_BATCH = 1 << 16


@dataclass(frozen=True)
class BatchPoint:
    batch: int
    experts_read: float | None  # mean over the MoE layers (None: no MoE layer)
    bytes: float
    step_s: float
    ceiling_s: float
    bound: str  # "bandwidth" | "compute" | "launches"
    moe_bound: str | None  # the MoE layers': "bandwidth" | "compute" (None: no MoE layer)

    @property
    def tokens_per_s_sequence(self) -> float:
        return 1.0 / self.step_s if self.step_s > 0 else 0.0

    @property
    def tokens_per_s_device(self) -> float:
        return self.batch / self.step_s if self.step_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"batch_size": self.batch,
                "experts_read": None if self.experts_read is None else round(self.experts_read, 2),
                "bytes_per_step": round(self.bytes), "ms_per_step_expected": round(self.step_s * 1e3, 6),
                "ms_per_step_ceiling": round(self.ceiling_s * 1e3, 6),
                "tokens_per_s_per_sequence": round(self.tokens_per_s_sequence, 3),
                "tokens_per_s_per_device": round(self.tokens_per_s_device, 3),
                "bound": self.bound, "moe_bound": self.moe_bound}


def _times(model: StepModel, est: Estimate, component: str | None = None) -> tuple[float, float]:
    """(seconds of the nodes bound by their bytes, seconds of those bound by their FLOPs), of one component or
    all."""
    device = est.device
    bandwidth = est.as_exported.step_bandwidth
    compute_eff = device.compute_efficiency.value or 1.0
    memory = compute = 0.0
    for nc in model.costs.values():
        if component is not None and nc.component != component:
            continue
        m = nc.cost.bytes / (bandwidth * device.efficiency(nc.efficiency_kind)) if bandwidth else 0.0
        peak = device.peak_flops(nc.compute_dtype) if nc.cost.flops else None
        c = nc.cost.flops / (peak * compute_eff) if peak else 0.0
        if c > m:
            compute += c
        else:
            memory += m
    return memory, compute


def _estimate_at(graph: Graph, setup: CostSetup, batch: int) -> Estimate:
    return estimate(graph, replace(setup, shape=replace(setup.shape, batch=batch)))


def point(est: Estimate) -> BatchPoint:
    step = est.as_exported
    memory, compute = _times(est.model, est)
    overhead = step.overhead_s
    bound = max((memory, "bandwidth"), (compute, "compute"), (overhead, "launches"))[1]
    forms = [f for f in est.model.moe_forms if f.experts_read is not None]
    moe_bound = None
    if est.model.moe_forms:
        moe_memory, moe_compute = _times(est.model, est, "moe")
        moe_bound = "compute" if moe_compute > moe_memory else "bandwidth"
    read = sum(f.experts_read for f in forms) / len(forms) if forms else None  # type: ignore[misc]
    return BatchPoint(est.setup.shape.batch, read, step.totals.bytes, step.expected_s, step.ceiling_s, bound,
                      moe_bound)


def batch_sweep(graph: Graph, setup: CostSetup, batches: list[int]) -> list[BatchPoint]:
    return [point(_estimate_at(graph, setup, b)) for b in batches]


def moe_crossover(graph: Graph, setup: CostSetup) -> int | None:
    """The smallest batch at which the MoE layers' FLOPs take longer than their weight reads (None: no MoE layer,
    or still bandwidth-bound at MAX_CROSSOVER_BATCH)."""

    def compute_bound(b: int) -> bool | None:
        est = _estimate_at(graph, setup, b)
        if not est.model.moe_forms:
            return None
        memory, compute = _times(est.model, est, "moe")
        return compute > memory

    first = compute_bound(1)
    if first is None:
        return None
    if first:
        return 1
    low, high = 1, 2
    while True:
        found = compute_bound(high)
        if found:
            break
        if high >= MAX_CROSSOVER_BATCH:
            return None
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        if compute_bound(mid):
            high = mid
        else:
            low = mid
    return high


def prefill(graph: Graph, setup: CostSetup, prompt: int) -> Estimate:
    """The prompt phase: one step of `prompt` new tokens per sequence over a context of the prompt. Its time is
    the time to first token (attention FLOPs are counted over the whole prompt x prompt, not halved for the
    causal mask; the logits of every prompt token as the graph computes them)."""
    return estimate(graph, replace(setup, shape=StepShape(setup.shape.batch, prompt, prompt)))
