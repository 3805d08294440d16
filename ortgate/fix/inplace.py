"""The form `ortgate fix` writes so that ORT's CPU MoE kernel computes a rewritten node right on the releases with
its in-place defect (knowledge/ort_moe.json cpu_inplace_defect).

On those releases the kernel zeroes its output before it reads its input, and the planner may give the output the
input's buffer. A node after the MoE that reads the MoE input keeps that buffer alive past the node, so the planner
cannot hand it over: `Where(true, moe_output, moe_input)` returns the MoE output bit for bit and costs one
elementwise pass over the hidden state. ort_moe.json records where this form was proven.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortgate.graph import build_graph
from ortgate.graph.patterns.moe_inplace import inplace_candidates
from ortgate.knowledge.moe_op import moe_op_facts
from ortgate.knowledge.provider_names import CPU, CUDA

KEEP_CONDITION = "ortgate/moe_keep_input/true"
KEEP_SUFFIX = "/moe_unkept"


@dataclass(frozen=True)
class KeptInput:
    node: str  # the MoE node
    input: str  # the value kept alive past it
    output: str  # the value the Where writes: the MoE node's former output name




@dataclass(frozen=True)
class KeepDecision:
    """Whether `fix` writes the keep-alive form, for which deployment, and why."""

    keep: bool
    release: str | None  # the deployment's onnxruntime release (the policy's), None when it names none
    provider: str | None  # the deployment's execution provider (the policy's), None when it names none
    reason: str


def needs_keep_alive(release: str | None, provider: str | None) -> KeepDecision:
    """Whether the MoE nodes `fix` writes need the keep-alive form on the deployment: the policy's onnxruntime
    release and execution provider, never the onnxruntime installed where ortgate runs. The form is left out only
    when every provider that can run the node is known fixed in that release: CPU at or after the first release seen
    fixed. Another provider (CUDA: its kernel is registered MayInplace(0, 0) too and was never run) is not known
    fixed, and ORT places on the CPU whatever that provider does not take."""
    defect = moe_op_facts().inplace_defect
    status = defect.status(release) if release else "unknown"
    if release is None:
        return KeepDecision(True, None, provider,
                            f"kept for the releases whose CPU MoE kernel computes the node wrongly (onnxruntime "
                            f"{', '.join(defect.releases_seen_affected)} seen); pin the deployment's release with "
                            "execution_provider.onnxruntime_version in the policy")
    if status != "fixed":
        return KeepDecision(True, release, provider,
                            f"onnxruntime {release} is {status} by the CPU MoE in-place defect "
                            f"(right from {defect.first_seen_fixed})")
    if provider is None:
        return KeepDecision(True, release, None,
                            f"the policy names no execution provider: onnxruntime {release}'s CPU kernel is right "
                            "but another provider's MoE kernel is not known to be")
    if provider != CPU:
        return KeepDecision(True, release, provider,
                            f"{provider}'s MoE kernel is not known to be right in place ({defect.cuda})"
                            if provider == CUDA else
                            f"{provider}'s MoE kernel is not known to be right in place")
    return KeepDecision(False, release, provider,
                        f"onnxruntime {release} on {provider} computes the node right in place (fixed from "
                        f"{defect.first_seen_fixed})")


def keep_inputs_alive(model: onnx.ModelProto) -> list[KeptInput]:
    """Guard every com.microsoft.MoE node of `model` that can hit the defect; the nodes guarded."""
    defect = moe_op_facts().inplace_defect
    graph = build_graph(model, "fixed")
    targets = {c.node.position: c for c in inplace_candidates(graph)
               if defect.triggered_by(c.normalize_routing_weights) and c.node.graph is None}
    if not targets:
        return []
    kept = []
    rebuilt: list[onnx.NodeProto] = []
    for i, original in enumerate(model.graph.node):
        node = onnx.NodeProto()
        node.CopyFrom(original)
        rebuilt.append(node)
        candidate = targets.get(i)
        if candidate is None:
            continue
        output = node.output[0]
        node.output[0] = output + KEEP_SUFFIX
        rebuilt.append(helper.make_node("Where", [KEEP_CONDITION, node.output[0], candidate.input], [output],
                                        name=(node.name or f"moe_{i}") + "/keep_input"))
        kept.append(KeptInput(node.name, candidate.input, output))
    del model.graph.node[:]
    model.graph.node.extend(rebuilt)
    model.graph.initializer.append(numpy_helper.from_array(np.array(True), KEEP_CONDITION))
    return kept
