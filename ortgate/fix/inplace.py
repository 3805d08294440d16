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

KEEP_CONDITION = "ortgate/moe_keep_input/true"
KEEP_SUFFIX = "/moe_unkept"


@dataclass(frozen=True)
class KeptInput:
    node: str  # the MoE node
    input: str  # the value kept alive past it
    output: str  # the value the Where writes: the MoE node's former output name


def needs_keep_alive(releases: list[str | None]) -> bool:
    """Whether any of these ORT releases (the installed one, the policy's target) is not known to be fixed."""
    defect = moe_op_facts().inplace_defect
    known = [r for r in releases if r]
    return not known or any(defect.status(r) != "fixed" for r in known)


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
