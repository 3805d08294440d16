"""Which decoder layer each node belongs to.

Exporters name things differently: onnxruntime-genai's builder writes `/model/layers.3/attn/...`, torch.onnx
(dynamo) writes opaque node names but keeps `model.layers.3.self_attn` in node metadata, optimum writes
`/model/layers.3/...`. The node's own metadata and name are read first ("names").

When no node carries a layer in its metadata or name (ORT's optimized dumps drop metadata; some tools strip
names), the layers come from structure ("structure"): the residual stream, where each decoder layer adds twice
(after attention, after the MLP/MoE). Every node takes the position on the stream of the latest stream value it
depends on: positions 2i and 2i+1 are layer i, everything after the last residual addition (final norm,
lm_head) is outside the layers. Initializer names are the last resort ("initializers"): optimizers merge
identical weights (every RMSNorm gamma of a random-init model is the same vector of ones), so a weight named
`model.layers.0...` may serve every layer.

onnxruntime-genai files its final norm under a pseudo layer one past the last (`/model/layers.N/
final_norm_layernorm`); a highest layer that holds nothing but norms is no decoder layer and is cleared.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ortgate.graph.index import Graph, Node

_LAYER_IN_NAME = re.compile(
    r"(?:^|[/._\-:'\"\[ ])(?:layers|layer|h|blocks|block|decoder_layers|decoder_layer)[._/\-](\d{1,5})(?=$|[/._\-:'\"\] ])"
)
# ORT names a node it creates "<old name>/<Pass>/" (MatMulScaleFusion, QuickGeluFusion, ...).
_ORT_PASS_SUFFIX = re.compile(r"(/[A-Za-z0-9_]*(?:Fusion|Transformer|Elimination|Rewriter)[A-Za-z0-9_]*/?)+$")
_METADATA_KEYS = ("pkg.torch.onnx.name_scopes", "namespace", "pkg.torch.onnx.class_hierarchy")
_FINAL_NORM_NAME = re.compile(r"final_norm|final_layernorm", re.IGNORECASE)
# Ops a norm-only pseudo layer may hold besides the norms themselves.
_NORM_OPS = frozenset({
    "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "LayerNormalization",
    "SkipLayerNormalization", "RMSNormalization",
})
_HELPER_OPS = frozenset({"Constant", "Cast", "Reshape", "Identity", "Shape", "Squeeze", "Unsqueeze"})
_SKIP_NORM_OPS = ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization")
_STREAM_CARRIERS = frozenset({"If", "Identity", "Cast"})

NAMES, STRUCTURE, INITIALIZERS, NONE = "names", "structure", "initializers", "none"


def layer_from_name(text: str) -> int | None:
    m = _LAYER_IN_NAME.search(text)
    return int(m.group(1)) if m else None


def _own_layer(node: Node) -> tuple[int | None, bool]:
    """(layer, whether the node's metadata or name is authoritative even when it names no layer)."""
    for prop in node.proto.metadata_props:
        if prop.key in _METADATA_KEYS:
            return layer_from_name(prop.value), True
    if node.name:
        layer = layer_from_name(node.name)
        if layer is not None:
            return layer, True
        # A scoped name such as "/model/norm/Mul", "model.norm/Mul" or "/lm_head/MatMul" places the node outside
        # every layer; "node_silu_3/QuickGeluFusion/" is ORT's name for a fused node, not a scope.
        return None, "/" in _ORT_PASS_SUFFIX.sub("", node.name)
    return None, False


def _initializer_layer(graph: Graph, node: Node) -> int | None:
    for name in node.inputs:
        if name and name in graph.initializers:
            layer = layer_from_name(name)
            if layer is not None:
                return layer
    return None


def assign_layers(graph: Graph) -> str:
    """Sets `node.layer` on every node it can; returns how: "names", "structure", "initializers" or "none"."""
    fixed: set[int] = set()
    named = False
    for node in graph.nodes:
        node.layer, authoritative = _own_layer(node)
        named = named or node.layer is not None
        if authoritative:
            fixed.add(node.index)
    if named:
        for node in graph.nodes:
            if node.index not in fixed:
                node.layer = _initializer_layer(graph, node)
                if node.layer is not None:
                    fixed.add(node.index)
        _clear_pseudo_layers(graph)
        _propagate(graph, fixed)
        return NAMES
    placed = _assign_by_residual_stream(graph)
    if placed is not None:
        _propagate(graph, placed)  # only nodes off the stream (shape helpers, constants) take a neighbour's layer
        return STRUCTURE
    for node in graph.nodes:
        node.layer = _initializer_layer(graph, node)
    if any(node.layer is not None for node in graph.nodes):
        _propagate(graph, set())
        return INITIALIZERS
    return NONE


def _clear_pseudo_layers(graph: Graph) -> None:
    """Nodes named as the final norm, and a highest layer holding nothing but norms, belong to no layer."""
    for node in graph.nodes:
        if node.layer is not None and node.name and _FINAL_NORM_NAME.search(node.name):
            node.layer = None
    layers = {n.layer for n in graph.nodes if n.layer is not None}
    if len(layers) < 2:
        return
    top = max(layers)
    members = [n for n in graph.nodes if n.layer == top]
    if members and all(n.op_type in _NORM_OPS or n.op_type in _HELPER_OPS for n in members) \
            and any(n.op_type in _NORM_OPS for n in members):
        for n in members:
            n.layer = None


def _propagate(graph: Graph, fixed: set[int]) -> None:
    """Unlabelled helper nodes (Shape, Cast, Constant, ...) take the layer of their neighbours."""
    for node in graph.nodes:  # forward: from producers (the latest layer among them)
        if node.layer is None and node.index not in fixed:
            layers = [p.layer for p in (graph.producer(i) for i in node.inputs if i) if p is not None and p.layer is not None]
            if layers:
                node.layer = max(layers)
    for node in reversed(graph.nodes):  # backward: constants and shape helpers take their consumers' layer
        if node.layer is None and node.index not in fixed:
            consumer_layers = {c.layer for o in node.outputs if o for c in graph.consumers(o)}
            if len(consumer_layers) == 1 and None not in consumer_layers:
                node.layer = consumer_layers.pop()


# ---- the residual stream ------------------------------------------------------------------------------


def _walk_stream(graph: Graph) -> tuple[list[Node], list[Node]]:
    """(residual steps, nodes the stream passed through unchanged).

    The residual steps are the stream's additions in order: Add or Skip(Simplified)LayerNormalization nodes.
    The walk starts at the token embedding (a Gather from a 2-D initializer) and follows the stream: at each
    value, the residual step is the Skip*LayerNormalization it feeds (whose 4th output, input + skip, carries
    the stream on) or the consuming Add of two computed tensors (the latest one in graph order). A value
    that only passes through an If (a prompt/decode branch) or an Identity/Cast is followed through it.
    """
    start = _embedding_output(graph)
    if start is None:
        return [], []
    steps: list[Node] = []
    carriers: list[Node] = []
    seen: set[str] = set()
    current = start
    parents = _subgraph_owners(graph)
    while current and current not in seen:
        seen.add(current)
        step = _next_step(graph, current)
        if step is None:
            carrier = _stream_carrier(graph, current, parents)
            if carrier is None:
                break
            carriers.append(carrier)
            current = carrier.outputs[0]
            continue
        steps.append(step)
        if step.op_type == "Add":
            current = step.outputs[0]
        else:  # Skip(Simplified)LayerNormalization: output 3 is input + skip (+ bias)
            current = step.outputs[3] if len(step.outputs) > 3 else ""
    return steps, carriers


def _embedding_output(graph: Graph) -> str | None:
    gathers = [n for n in graph.by_op_type("Gather") if n.graph is None]
    graph_inputs = {i.name for i in graph.inputs}
    for node in gathers:
        init = graph.initializers.get(node.input(0))
        if init is not None and len(init.dims) == 2 and node.input(1) in graph_inputs:
            return node.outputs[0]
    for node in gathers:
        init = graph.initializers.get(node.input(0))
        if init is not None and len(init.dims) == 2 and init.dims[0] > init.dims[1]:
            return node.outputs[0]
    return None


def _next_step(graph: Graph, value: str) -> Node | None:
    consumers = [c for c in graph.consumers(value) if c.graph is None]
    skip_norms = [c for c in consumers if c.op_type in _SKIP_NORM_OPS and value in c.inputs[:2]]
    if skip_norms:
        return min(skip_norms, key=lambda n: n.index)
    adds = [
        c for c in consumers
        if c.op_type == "Add" and c.domain == "ai.onnx" and not any(graph.is_constant(i) for i in c.inputs)
    ]
    return max(adds, key=lambda n: n.index) if adds else None


def _stream_carrier(graph: Graph, value: str, parents: dict[str, Node]) -> Node | None:
    """The one node the stream passes through unchanged (an If whose branches read it, an Identity, a Cast)."""
    owners = {id(_top_level(c, parents)): _top_level(c, parents) for c in graph.consumers(value)}
    carriers = [n for n in owners.values() if n is not None and n.op_type in _STREAM_CARRIERS and n.outputs]
    return carriers[0] if len(carriers) == 1 and len(owners) == 1 else None


def _subgraph_owners(graph: Graph) -> dict[str, Node]:
    """Subgraph path (as graph.Node.graph spells it) -> the node whose attribute holds that subgraph."""
    return graph.subgraph_owners  # recorded while indexing: no second pass over every node's attributes


def _top_level(node: Node, parents: dict[str, Node]) -> Node | None:
    for _ in range(64):  # nesting depth guard
        if node.graph is None:
            return node
        owner = parents.get(node.graph)
        if owner is None:
            return None
        node = owner
    return None


def _assign_by_residual_stream(graph: Graph) -> set[int] | None:
    """Layers from the residual stream; returns the nodes placed by it (None: no stream found)."""
    steps, carriers = _walk_stream(graph)
    if len(steps) < 2:
        return None
    layer_count = (len(steps) + 1) // 2
    end = 2 * layer_count  # stream positions 0 .. end-1 are inside the layers
    step_of = {node.index: k for k, node in enumerate(steps)}
    carrier_indices = {node.index for node in carriers}
    parents = _subgraph_owners(graph)
    captured = _captured_inputs(graph, parents)
    position: dict[str, int] = {}
    embedding = _embedding_output(graph)
    if embedding:
        position[embedding] = 0
    placed: set[int] = set()

    def layer_at(p: int) -> int | None:
        return p // 2 if 0 <= p < end else None

    for node in graph.nodes:
        if node.graph is not None:
            continue
        inputs: Iterable[str] = node.inputs
        if node.index in captured:
            inputs = list(node.inputs) + captured[node.index]
        p = max((position[i] for i in inputs if i in position), default=-1)
        k = step_of.get(node.index)
        if k is not None:
            p = k + 1
            # An Add closes sublayer k; a fused Skip*Norm also normalises for the sublayer after it.
            node.layer = k // 2 if node.op_type == "Add" else layer_at(k + 1)
        elif node.index in carrier_indices:
            node.layer = None  # the stream passes through before the first layer starts (a prompt/decode If)
        else:
            node.layer = layer_at(p)
        if p >= 0:
            placed.add(node.index)
            for o in node.outputs:
                if o and o not in position:
                    position[o] = p
    for node in graph.nodes:
        if node.graph is not None:
            owner = _top_level(node, parents)
            node.layer = owner.layer if owner is not None else None
            if owner is not None and owner.index in placed:
                placed.add(node.index)
    return placed


def _captured_inputs(graph: Graph, parents: dict[str, Node]) -> dict[int, list[str]]:
    """Values a top-level node's subgraphs read from outside (what an If branch captures)."""
    if not parents:
        return {}
    produced_inside: dict[int, set[str]] = {}
    read_inside: dict[int, list[str]] = {}
    for node in graph.nodes:
        if node.graph is None:
            continue
        owner = _top_level(node, parents)
        if owner is None:
            continue
        produced_inside.setdefault(owner.index, set()).update(o for o in node.outputs if o)
        read_inside.setdefault(owner.index, []).extend(i for i in node.inputs if i)
    return {
        index: [v for v in values if v not in produced_inside.get(index, set())]
        for index, values in read_inside.items()
    }
