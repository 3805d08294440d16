"""A decoder layer's number as a node's name, scope or initializer says it, and the node metadata keys that carry a
scope. Read by the index while it builds (Graph.metadata_layers) and by the layer assignment (ortgate.graph.layers)
after: a module of its own, so that neither imports the other."""

from __future__ import annotations

import re

LAYER_IN_NAME = re.compile(
    r"(?:^|[/._\-:'\"\[ ])(?:layers|layer|h|blocks|block|decoder_layers|decoder_layer)[._/\-](\d{1,5})(?=$|[/._\-:'\"\] ])"
)
# The node metadata that scopes a node (the index reads it: Graph.metadata_layers).
METADATA_KEYS = frozenset({"pkg.torch.onnx.name_scopes", "namespace", "pkg.torch.onnx.class_hierarchy"})


def layer_from_name(text: str) -> int | None:
    m = LAYER_IN_NAME.search(text)
    return int(m.group(1)) if m else None
