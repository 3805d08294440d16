"""The decode cost model: what one decode step costs on a device, from the graph alone (never a weight byte).

    from ortgate.cost import CostSetup, StepShape, estimate
    from ortgate.knowledge.devices import find_device

    est = estimate(graph, CostSetup(find_device("h100-sxm"), StepShape(batch=1, new_tokens=1, context=4096)))
    est.as_exported.tokens_per_s_expected, est.with_fixes.tokens_per_s_expected, est.as_exported.ceiling_s
    est.as_exported.components["moe"].bytes      # per component: bytes, flops, launches, syncs, roofline_s
    est.as_exported.layers[3]["attention"]       # per layer and component
    est.model.node_cost(node.index)              # per node: Cost(bytes, flops, launches, syncs, bytes_by_dtype)
    est.model.moe_forms                          # per MoE layer: form, experts, top_k, experts_read
    est.saving(est.repairs_of("moe"))            # Saving(ms_per_token, share) of fusing every MoE layer
    est.uncounted                                # what could not be counted, per component, and why

Layers: `shapes` (dtype sizes, symbolic dims), `model` (per-node costs), `repairs` (what fixing a finding
changes), `estimate` (time on a device, as exported and with fixes, plain words).
"""

from ortgate.cost.estimate import CostItem, CostSetup, Estimate, LayerGroup, Saving, StepEstimate, estimate
from ortgate.cost.model import COMPONENTS, Cost, NodeCost, StepModel, Uncounted, expected_experts, step_model
from ortgate.cost.repairs import REPAIR_KINDS, Repair
from ortgate.cost.shapes import StepShape, dtype_bytes

__all__ = [
    "COMPONENTS",
    "REPAIR_KINDS",
    "Cost",
    "CostItem",
    "CostSetup",
    "Estimate",
    "LayerGroup",
    "NodeCost",
    "Repair",
    "Saving",
    "StepEstimate",
    "StepModel",
    "StepShape",
    "Uncounted",
    "dtype_bytes",
    "estimate",
    "expected_experts",
    "step_model",
]
