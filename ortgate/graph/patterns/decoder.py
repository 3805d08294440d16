"""The model's interface as a decoder: token ids in, logits over the vocabulary out, and the state a step hands to
the next (a KV cache, a linear-attention or convolution state).

A graph with token ids in, logits out and no state in or out computes every position of the sequence it is given
and keeps nothing: generating with it means running the whole sequence again for every new token. The graph
alone cannot tell such a causal LM from an encoder with a language-modelling head (BERT's masked LM has the same
interface): the deployment says which it is (the policy's `model.kind`, or a genai_config.json, which only
decoders have).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ortgate.graph.index import Graph, ValueInfo
from ortgate.graph.patterns.attention import fused_attention_nodes
from ortgate.graph.patterns.common import cached
from ortgate.knowledge.dims import dim_kind

# A graph output holding a KV cache: named for it (present.N.key, present_key_values, present_value) and of rank 4,
# or a fused attention op's present_key / present_value output.
PRESENT_NAME = re.compile(r"(^|[._/])present", re.IGNORECASE)
# A graph input that carries state from the previous step: a KV cache, a linear-attention or convolution state.
STATE_NAME = re.compile(r"past|cache|state|recurrent|conv", re.IGNORECASE)
_INTEGER = frozenset({"int64", "int32"})


@dataclass(frozen=True)
class CachelessDecoder:
    """A graph with the interface of a causal LM and no state between steps."""

    tokens: str  # the token-id input
    logits: str  # the output over the vocabulary
    vocab: int | None  # the logits' last dim (the embedding table's rows when that dim is symbolic)


def cache_outputs(graph: Graph) -> list[str]:
    """The graph outputs that hold a KV cache."""
    by_attention = {name for node in fused_attention_nodes(graph) if node.graph is None
                    for name in node.outputs[1:3] if name}
    return [o.name for o in graph.outputs
            if o.name in by_attention or (PRESENT_NAME.search(o.name) and o.shape is not None and len(o.shape) == 4)]


def carries_state(info: ValueInfo) -> bool:
    """Whether a graph input carries state from the previous step (by its name, or a dim that grows in decode)."""
    return bool(STATE_NAME.search(info.name)) or any(
        isinstance(d, str) and dim_kind(d) == "kv" for d in (info.shape or ()))


def cacheless_decoder(graph: Graph) -> CachelessDecoder | None:
    """The token input and logits of a graph that takes token ids, returns logits over a vocabulary and carries no
    state between steps (no state input, no KV-cache output); None otherwise."""
    return cached(graph, "cacheless_decoder", _find)


def _find(graph: Graph) -> CachelessDecoder | None:
    if any(carries_state(i) for i in graph.inputs) or cache_outputs(graph):
        return None
    if any(STATE_NAME.search(o.name) and o.shape is not None and len(o.shape) == 4 for o in graph.outputs):
        return None  # the prefill graph of a split export returns the cache its decode graph takes
    info = token_ids_input(graph)
    if info is None:
        return None
    tokens = info.name
    rows = _embedding_rows(graph, tokens)
    for out in graph.outputs:
        shape = out.shape
        if shape is None or len(shape) != 3:
            continue
        last = shape[-1]
        vocab = last if isinstance(last, int) and last > 0 else rows
        if "logits" in out.name.lower() or (rows is not None and last == rows):
            return CachelessDecoder(tokens, out.name, vocab)
    return None


def token_ids_input(graph: Graph) -> ValueInfo | None:
    """The integer [batch, sequence] input the token embedding reads (`input_ids` first)."""
    candidates = [i for i in graph.inputs if i.dtype in _INTEGER and i.shape is not None and len(i.shape) == 2]
    named = [i for i in candidates if i.name == "input_ids"]
    for info in named + candidates:
        if _embedding_rows(graph, info.name) is not None or info.name == "input_ids":
            return info
    return None


def _embedding_rows(graph: Graph, tokens: str) -> int | None:
    """Rows of the 2-D table a Gather indexes with `tokens` (the vocabulary size)."""
    for node in graph.consumers(tokens):
        if node.op_type == "Gather" and node.input(1) == tokens:
            table = graph.initializers.get(node.input(0))
            if table is not None and len(table.dims) == 2:
                return int(table.dims[0])
    return None
