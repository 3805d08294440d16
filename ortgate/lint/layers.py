"""Which decoder layer each node belongs to.

Exporters name things differently: onnxruntime-genai's builder writes `/model/layers.3/attn/...`, torch.onnx
(dynamo) writes opaque node names but keeps `model.layers.3.self_attn` in node metadata and initializer
names, optimum writes `/model/layers.3/...`. Names are read first; when nothing in the graph carries a
layer number, the layers are recovered from structure: the residual stream, where each decoder layer adds
twice (after attention, after the MLP/MoE).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortgate.lint.graph import Graph, Node

_LAYER_IN_NAME = re.compile(
    r"(?:^|[/._\-:'\"\[ ])(?:layers|layer|h|blocks|block|decoder_layers|decoder_layer)[._/\-](\d{1,5})(?=$|[/._\-:'\"\] ])"
)
_METADATA_KEYS = ("pkg.torch.onnx.name_scopes", "namespace", "pkg.torch.onnx.class_hierarchy")


def layer_from_name(text: str) -> int | None:
    m = _LAYER_IN_NAME.search(text)
    return int(m.group(1)) if m else None


def _named_layer(graph: "Graph", node: "Node") -> tuple[int | None, bool]:
    """(layer, whether the node's own naming is authoritative even when it names no layer)."""
    for prop in node.proto.metadata_props:
        if prop.key in _METADATA_KEYS:
            return layer_from_name(prop.value), True
    if node.name:
        layer = layer_from_name(node.name)
        if layer is not None:
            return layer, True
    for name in node.inputs:
        if name and name in graph.initializers:
            layer = layer_from_name(name)
            if layer is not None:
                return layer, True
    # A scoped name such as "/model/norm/Mul" or "/lm_head/MatMul" places the node outside every layer.
    return None, bool(node.name) and "/" in node.name


def assign_layers(graph: "Graph") -> str:
    """Sets `node.layer` on every node it can; returns how: "names", "structure" or "none"."""
    fixed: set[int] = set()
    for node in graph.nodes:
        node.layer, authoritative = _named_layer(graph, node)
        if authoritative:
            fixed.add(node.index)
    if any(node.layer is not None for node in graph.nodes):
        _propagate(graph, fixed)
        return "names"
    if _assign_by_residual_stream(graph):
        _propagate(graph, set())
        return "structure"
    return "none"


def _propagate(graph: "Graph", fixed: set[int]) -> None:
    """Unlabelled helper nodes (Shape, Cast, Constant, ...) take the layer of their neighbours."""
    for node in graph.nodes:  # forward: from producers (the latest layer among them)
        if node.layer is None and node.index not in fixed:
            layers = [p.layer for p in (graph.producer(i) for i in node.inputs if i) if p is not None and p.layer is not None]
            if layers:
                node.layer = max(layers)
    for node in reversed(graph.nodes):  # backward: constants and shape helpers take their consumers' layer
        if node.layer is None and node.index not in fixed:
            layers = {c.layer for o in node.outputs if o for c in graph.consumers(o)}
            if len(layers) == 1 and None not in layers:
                node.layer = layers.pop()


def residual_steps(graph: "Graph") -> list["Node"]:
    """The residual-stream additions in order: Add or SkipSimplifiedLayerNormalization nodes.

    Starts at the token embedding (a Gather from a 2-D initializer) and follows the stream: at each
    value, the residual step is the consuming Add (the latest one in graph order) or the
    Skip*LayerNormalization it feeds, whose 4th output (input + skip) carries the stream on.
    """
    start = _embedding_output(graph)
    if start is None:
        return []
    steps: list[Node] = []
    seen: set[str] = set()
    current = start
    while current and current not in seen:
        seen.add(current)
        step = _next_step(graph, current)
        if step is None:
            break
        steps.append(step)
        if step.op_type == "Add":
            current = step.outputs[0]
        else:  # Skip(Simplified)LayerNormalization: output 3 is input + skip (+ bias)
            current = step.outputs[3] if len(step.outputs) > 3 else ""
    return steps


def _embedding_output(graph: "Graph") -> str | None:
    for node in graph.by_op_type("Gather"):
        init = graph.initializers.get(node.input(0))
        if init is not None and len(init.dims) == 2 and node.input(1) in {i.name for i in graph.inputs}:
            return node.outputs[0]
    for node in graph.by_op_type("Gather"):
        init = graph.initializers.get(node.input(0))
        if init is not None and len(init.dims) == 2 and init.dims[0] > init.dims[1]:
            return node.outputs[0]
    return None


def _next_step(graph: "Graph", value: str) -> "Node | None":
    skip_norms = [
        c for c in graph.consumers(value)
        if c.op_type in ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization") and value in c.inputs[:2]
    ]
    if skip_norms:
        return min(skip_norms, key=lambda n: n.index)
    adds = [
        c for c in graph.consumers(value)
        if c.op_type == "Add" and c.domain == "ai.onnx" and not any(graph.is_constant(i) for i in c.inputs)
    ]
    return max(adds, key=lambda n: n.index) if adds else None


def _assign_by_residual_stream(graph: "Graph") -> bool:
    steps = residual_steps(graph)
    if len(steps) < 2:
        return False
    # Layer i ends at its second residual step; its nodes are those after the previous layer's end.
    ends = [steps[i].index for i in range(1, len(steps), 2)]
    first = _first_layer_node_index(graph, steps[0])
    layer = 0
    for node in graph.nodes:
        if node.graph is not None or node.index < first:
            continue
        while layer < len(ends) and node.index > ends[layer]:
            layer += 1
        if layer >= len(ends):
            break
        node.layer = layer
    return True


def _first_layer_node_index(graph: "Graph", first_step: "Node") -> int:
    embedding = _embedding_output(graph)
    producer = graph.producer(embedding) if embedding else None
    return producer.index + 1 if producer is not None else first_step.index
