"""Which decoder layer each node belongs to.

Exporters name things differently: onnxruntime-genai's builder writes `/model/layers.3/attn/...`, torch.onnx
(dynamo) writes opaque node names but keeps `model.layers.3.self_attn` in node metadata, optimum writes
`/model/layers.3/...`. The node's own metadata and name are read first ("names").

ORT's optimized dump drops node metadata, so a dump of a torch.onnx export keeps no layer of its own: given
the model it was made from (`reference`), a dump node whose name (less ORT's "/<Pass>/" suffix) is a node of
the model takes that node's layer ("model"). Names count only when they cover the graph: a handful of nodes
named with a layer (the com.microsoft.MoE nodes `ortgate fix` writes) among hundreds of opaque ones does not
make the graph's attribution, it would put every other node in their layer.

When names do not cover the graph (ORT's dumps without the model; tools that strip names), the layers come
from structure ("structure"): the residual stream, where each decoder layer adds twice (after attention, after
the MLP/MoE). The walk follows the stream from the token embedding through each residual addition; where no
addition reads the stream value itself it follows the value through a norm or a scale by a constant to the
addition that reads that, so pre-norm (`h + attn(norm(h))`), sandwich-norm (`h + norm(attn(norm(h)))`) and
post-norm streams (`n = norm(h); n * alpha + attn(n)`, MiniMax) are all one walk. Every node takes the position
on the stream of the latest stream value it depends on: positions 2i and 2i+1 are layer i, everything after
the last residual addition (final norm, lm_head) is outside the layers. Nodes the names leave unplaced take
the stream's layer too. Initializer names are the last resort ("initializers"): optimizers merge identical
weights (every RMSNorm gamma of a random-init model is the same vector of ones), so a weight named
`model.layers.0...` may serve every layer.

onnxruntime-genai files its final norm under a pseudo layer one past the last (`/model/layers.N/
final_norm_layernorm`); a highest layer that holds nothing but norms is no decoder layer and is cleared.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from itertools import repeat
from typing import TYPE_CHECKING

from ortgate.graph.layer_names import LAYER_IN_NAME as _LAYER_IN_NAME
from ortgate.graph.layer_names import METADATA_KEYS, layer_from_name

if TYPE_CHECKING:
    from ortgate.graph.index import Graph, Node

__all__ = ["METADATA_KEYS", "layer_from_name"]  # read here by the tests; defined beside the index that reads them

# ORT names a node it creates "<old name>/<Pass>/" (MatMulScaleFusion, QuickGeluFusion, ...).
_ORT_PASS_SUFFIX = re.compile(r"(/[A-Za-z0-9_]*(?:Fusion|Transformer|Elimination|Rewriter)[A-Za-z0-9_]*/?)+$")
_FINAL_NORM_NAME = re.compile(r"final_norm|final_layernorm", re.IGNORECASE)
# Ops a norm-only pseudo layer may hold besides the norms themselves.
_NORM_OPS = frozenset({
    "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization", "LayerNormalization",
    "SkipLayerNormalization", "RMSNormalization",
})
_HELPER_OPS = frozenset({"Constant", "Cast", "Reshape", "Identity", "Shape", "Squeeze", "Unsqueeze"})
_SKIP_NORM_OPS = ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization")
_STREAM_CARRIERS = frozenset({"If", "Identity", "Cast"})

NAMES, MODEL, STRUCTURE, INITIALIZERS, NONE = "names", "model", "structure", "initializers", "none"
# Names decide the layers when at least this share of the computing nodes carries its own layer (or is scoped
# outside every layer) by metadata, name, or a name the reference model attributes.
_NAMES_COVERAGE = 0.5
_RMS_CHAIN_OPS = frozenset({"Reciprocal", "Sqrt", "Add", "Div", "Pow", "Cast"})


def _initializer_layer(graph: Graph, node: Node) -> int | None:
    for name in node.inputs:
        if name and name in graph.initializers:
            layer = layer_from_name(name)
            if layer is not None:
                return layer
    return None


def assign_layers(graph: Graph, reference: Graph | None = None) -> str:
    """Sets `node.layer` on every node it can; returns how: "names", "model" (carried from `reference`, the model
    this graph is ORT's dump of), "structure", "initializers" or "none"."""
    carried = _carried_layers(graph, reference) if reference is not None else {}
    fixed: set[int] = set()
    from_reference = 0
    nodes = graph.nodes
    # A node's own layer, and whether its metadata or name is authoritative even when it names no layer: its
    # scope metadata's (read by the index), else its name's.
    metadata_layers = graph.metadata_layers
    search, strip = _LAYER_IN_NAME.search, _ORT_PASS_SUFFIX.sub
    for node in nodes:
        index = node.index
        if index in metadata_layers:
            layer, authoritative = metadata_layers[index], True
        elif name := node.name:
            m = search(name)
            if m:
                layer, authoritative = int(m.group(1)), True
            else:
                # A scoped name such as "/model/norm/Mul", "model.norm/Mul" or "/lm_head/MatMul" places the node
                # outside every layer; "node_silu_3/QuickGeluFusion/" is ORT's name for a fused node, not a scope.
                layer, authoritative = None, "/" in strip("", name)
        else:
            layer, authoritative = None, False
        if not authoritative and index in carried:
            layer, authoritative = carried[index], True
            from_reference += 1
        node.layer = layer
        if authoritative:
            fixed.add(index)
    named = any(graph.nodes[i].layer is not None for i in fixed)
    # The residual stream decides the layers when names do not cover the graph, and places the nodes names leave
    # unplaced: it is walked only when one of those can happen.
    stream: dict[int, int | None] | None
    if named and _coverage(graph, fixed) >= _NAMES_COVERAGE:
        names_decide = True
        stream = _assign_by_residual_stream(graph) if len(fixed) < len(nodes) else None
    else:
        stream = _assign_by_residual_stream(graph)
        names_decide = named and stream is None
    if names_decide:
        for node in graph.nodes:
            if node.index in fixed:
                continue
            if stream is not None and node.index in stream:  # a node the names leave unplaced: the stream's layer
                node.layer = stream[node.index]
            else:
                node.layer = _initializer_layer(graph, node)
            if node.layer is not None:
                fixed.add(node.index)
        _clear_pseudo_layers(graph)
        _propagate(graph, fixed)
        return MODEL if from_reference * 2 > len(fixed) else NAMES
    if stream is not None:
        for node in graph.nodes:
            node.layer = stream.get(node.index)
        _propagate(graph, set(stream))  # only nodes off the stream (shape helpers, constants) take a neighbour's layer
        return STRUCTURE
    for node in graph.nodes:
        node.layer = _initializer_layer(graph, node)
    if any(node.layer is not None for node in graph.nodes):
        _propagate(graph, set())
        return INITIALIZERS
    for node in graph.nodes:
        node.layer = None
    return NONE


def _coverage(graph: Graph, fixed: set[int]) -> float:
    """The share of the top-level computing nodes (not constants or shape helpers) whose layer is known."""
    computing = [n for n in graph.nodes if n.graph is None and n.op_type not in _HELPER_OPS]
    return sum(1 for n in computing if n.index in fixed) / len(computing) if computing else 0.0


def _carried_layers(graph: Graph, reference: Graph) -> dict[int, int | None]:
    """Layers of `graph`'s nodes that kept a node name of `reference` (ORT appends "/<Pass>/" to what it rewrites)."""
    by_name: dict[str, int | None] = {}
    for node in reference.nodes:
        if node.name and node.graph is None:
            by_name.setdefault(node.name, node.layer)
    carried: dict[int, int | None] = {}
    for node in graph.nodes:
        if not node.name or node.graph is not None:
            continue
        name = node.name if node.name in by_name else _ORT_PASS_SUFFIX.sub("", node.name)
        if name in by_name:
            carried[node.index] = by_name[name]
    return carried


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
        step, via = _find_step(graph, current, parents, seen)
        if step is None:
            break
        carriers.extend(n for n in via if n.op_type in _STREAM_CARRIERS)
        steps.append(step)
        current = _stream_after(graph, step)
    return steps, carriers


def _stream_after(graph: Graph, step: Node) -> str:
    """The stream value a residual step produces: an Add's sum; a Skip*Norm's input + skip (output 3), or, when
    nothing reads that (post-norm: the stream is the normalised value), its normalised output."""
    if step.op_type == "Add":
        return step.outputs[0]
    total = step.outputs[3] if len(step.outputs) > 3 else ""
    if total and graph.consumers(total):
        return total
    return step.outputs[0] if step.outputs else ""


def _find_step(graph: Graph, value: str, parents: dict[str, Node], seen: set[str],
               depth: int = 3) -> tuple[Node | None, list[Node]]:
    """(the residual step the stream reaches from `value`, the nodes it passed on the way there).

    The step reads `value` itself (pre-norm, sandwich-norm), or a value reached through at most `depth` of:
    a node the stream passes unchanged (an If, Identity, Cast), a norm, a scale by a constant (post-norm)."""
    step = _next_step(graph, value)
    if step is not None or depth == 0:
        return step, []
    for node, out in _thin_successors(graph, value, parents):
        if out in seen:
            continue
        found, via = _find_step(graph, out, parents, seen, depth - 1)
        if found is not None:
            return found, [node, *via]
    return None, []


def _thin_successors(graph: Graph, value: str, parents: dict[str, Node]) -> list[tuple[Node, str]]:
    """What the stream value becomes without leaving the stream: (the node, its output)."""
    found: list[tuple[Node, str]] = []
    carrier = _stream_carrier(graph, value, parents)
    if carrier is not None:
        found.append((carrier, carrier.outputs[0]))
    for c in graph.consumers(value):
        if c.graph is not None or not c.outputs:
            continue
        if c.op_type in _NORM_OPS and c.inputs and c.inputs[0] == value:
            found.append((c, c.outputs[0]))
        elif c.op_type in ("Mul", "Div") and len(c.inputs) == 2 and c.inputs[0] == value \
                and graph.is_constant(c.inputs[1]) or c.op_type == "Mul" and len(c.inputs) == 2 \
                and c.inputs[1] == value and graph.is_constant(c.inputs[0]):
            found.append((c, c.outputs[0]))
    norm = _decomposed_rms_norm(graph, value)
    if norm is not None:
        found.append(norm)
    return found


def _decomposed_rms_norm(graph: Graph, value: str) -> tuple[Node, str] | None:
    """The last node and output of an RMSNorm spelled out on `value` (x * rsqrt(mean(x^2) + eps) or x / sqrt(..),
    then an optional Cast and the gamma Mul), or None."""
    sources = [value] + [c.outputs[0] for c in graph.consumers(value) if c.op_type == "Cast" and c.outputs]
    for source in sources:
        for c in graph.consumers(source):
            if c.op_type not in ("Mul", "Div") or len(c.inputs) != 2 or not c.outputs:
                continue
            other = c.inputs[1] if c.inputs[0] == source else c.inputs[0]
            if other == source or graph.is_constant(other) or not _from_mean_square(graph, other):
                continue
            node, out = c, c.outputs[0]
            for _ in range(2):  # a Cast back to the input dtype, then gamma
                after = graph.consumers(out)
                if len(after) != 1 or not after[0].outputs:
                    break
                nxt = after[0]
                if nxt.op_type == "Cast" or nxt.op_type == "Mul" and any(
                        i != out and (i in graph.initializers or graph.is_constant(i)) for i in nxt.inputs):
                    node, out = nxt, nxt.outputs[0]
                else:
                    break
            return node, out
    return None


def _from_mean_square(graph: Graph, value: str) -> bool:
    """Whether `value` is computed from a ReduceMean within a few elementwise steps (the norm's 1/rms or rms)."""
    frontier = [value]
    for _ in range(5):
        nxt: list[str] = []
        for v in frontier:
            producer = graph.producer(v)
            if producer is None:
                continue
            if producer.op_type == "ReduceMean":
                return True
            if producer.op_type in _RMS_CHAIN_OPS:
                nxt.extend(i for i in producer.inputs if i and not graph.is_constant(i))
        frontier = nxt
    return False


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


def _assign_by_residual_stream(graph: Graph) -> dict[int, int | None] | None:
    """Layers from the residual stream: the nodes placed by it and their layer (None: no stream found). Sets no
    node's layer."""
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
    placed: dict[int, int | None] = {}
    layer_of: dict[int, int | None] = {}

    position_of, minus_one = position.get, repeat(-1)

    def layer_at(p: int) -> int | None:
        return p // 2 if 0 <= p < end else None

    for node in graph.nodes:
        if node.graph is not None:
            continue
        inputs: Iterable[str] = node.inputs
        if node.index in captured:
            inputs = list(node.inputs) + captured[node.index]
        p = max(map(position_of, inputs, minus_one), default=-1)
        k = step_of.get(node.index)
        if k is not None:
            p = k + 1
            # An Add closes sublayer k; a fused Skip*Norm also normalises for the sublayer after it.
            layer = k // 2 if node.op_type == "Add" else layer_at(k + 1)
        elif node.index in carrier_indices:
            layer = None  # the stream passes through before the first layer starts (a prompt/decode If)
        else:
            layer = p // 2 if 0 <= p < end else None  # layer_at(p)
        layer_of[node.index] = layer
        if p >= 0:
            placed[node.index] = layer
            for o in node.outputs:
                if o and o not in position:
                    position[o] = p
    for node in graph.nodes:
        if node.graph is not None:
            owner = _top_level(node, parents)
            if owner is not None and owner.index in placed:
                placed[node.index] = layer_of.get(owner.index)
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
