"""The model as evidence: load the protobuf (never weights), index it once, attribute decoder layers, match patterns.

`build_graph` is the one way to get a Graph the rules can read: the index, then layer attribution as a
separate pass over it. Patterns (`ortgate.graph.patterns`) are computed on demand and cached per graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortgate.graph.index import Graph, Initializer
from ortgate.graph.layers import assign_layers

if TYPE_CHECKING:
    import onnx


def build_graph(model: onnx.ModelProto, path: str, *, role: str = "model", reference: Graph | None = None,
                initializers: dict[str, Initializer] | None = None) -> Graph:
    """Index `model` and attribute every node to its decoder layer. `reference`: the model this graph is ORT's
    optimized dump of; a node that kept its name there keeps its layer. `initializers`: its weights as
    read_model_indexed already indexed them."""
    graph = Graph(model, path, role=role, initializers=initializers)
    graph.layer_source = assign_layers(graph, reference)
    return graph


__all__ = ["Graph", "build_graph"]
