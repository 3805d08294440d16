"""What the model should contain: the policy's `model:` block, filled in from genai_config.json and the graph.

Every value remembers where it came from. A count check (e.g. "40 MoE layers expected, 38 found") only
means something when the expectation came from outside the graph (the policy or genai_config.json); values
inferred from the graph itself are used for wording and derived checks, never to judge the graph against
itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ortgate.config.genai import GenaiConfig
from ortgate.config.policy import Policy
from ortgate.findings import Location
from ortgate.graph.index import Graph
from ortgate.graph.patterns.attention import gqa_nodes, linear_attention_layers, token_mixer_layers
from ortgate.graph.patterns.moe import moe_blocks, moe_misses

GRAPH = "graph"
POLICY = "policy"
GENAI = "genai_config"


@dataclass(frozen=True)
class Expected:
    value: Any
    origin: str  # "policy" | "genai_config" | "graph"
    location: Location | None = None

    @property
    def declared(self) -> bool:
        """Set outside the graph, so the graph can be judged against it."""
        return self.origin != GRAPH

    def describe(self) -> str:
        if self.origin == POLICY:
            return f"the policy expects {self.value}"
        if self.origin == GENAI:
            return f"genai_config.json declares {self.value}"
        return f"the graph suggests {self.value}"


@dataclass
class Expectations:
    family: Expected | None = None
    kind: Expected | None = None  # "decoder" (generates token by token) | "encoder"
    layers: Expected | None = None
    moe_layers: Expected | None = None
    attention_layers: Expected | None = None
    experts: Expected | None = None
    top_k: Expected | None = None
    num_heads: Expected | None = None
    kv_num_heads: Expected | None = None
    head_size: Expected | None = None
    hidden_size: Expected | None = None
    moe_intermediate_size: Expected | None = None
    norm_topk_prob: Expected | None = None
    activation: Expected | None = None
    rms_norm_eps: Expected | None = None
    tensor_parallel: Expected | None = None
    required_ops: dict[str, Expected] | None = None
    forbidden_ops: list[str] | None = None

    def value(self, name: str, default: Any = None) -> Any:
        expected = getattr(self, name)
        return expected.value if expected is not None else default

    def declared(self, name: str) -> Expected | None:
        expected = getattr(self, name)
        return expected if expected is not None and expected.declared else None

    @property
    def gqa_expected(self) -> bool:
        """Grouped-query attention: fewer kv heads than q heads."""
        q, kv = self.value("num_heads"), self.value("kv_num_heads")
        return isinstance(q, int) and isinstance(kv, int) and kv < q


_SIMPLE_POLICY_KEYS = (
    "family", "kind", "layers", "moe_layers", "attention_layers", "experts", "top_k", "num_heads", "kv_num_heads",
    "head_size", "hidden_size", "moe_intermediate_size", "norm_topk_prob", "activation", "rms_norm_eps",
    "tensor_parallel",
)
_GENAI_KEYS = {
    "layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "kv_num_heads": "num_key_value_heads",
    "head_size": "head_size",
    "hidden_size": "hidden_size",
}


def resolve_expectations(policy: Policy | None, genai: GenaiConfig | None, graph: Graph) -> Expectations:
    exp = Expectations()
    model = (policy.get("model") if policy else None) or {}
    if policy is not None:
        for key in _SIMPLE_POLICY_KEYS:
            if key in model:
                setattr(exp, key, Expected(model[key], POLICY, policy.where("model", key)))
        if "required_ops" in model:
            exp.required_ops = {
                op: Expected(count, POLICY, policy.where("model", "required_ops", op))
                for op, count in model["required_ops"].items()
            }
    exp.forbidden_ops = list(model.get("forbidden_ops") or [])

    if genai is not None:
        for key, genai_key in _GENAI_KEYS.items():
            value = genai.decoder_int(genai_key)
            if getattr(exp, key) is None and value is not None:
                line = genai.line_of("model", "decoder", genai_key)
                setattr(exp, key, Expected(value, GENAI, Location(str(genai.path), line, f"model.decoder.{genai_key}")))
        if exp.kind is None:  # onnxruntime-genai runs decoders only: its config declares one
            exp.kind = Expected("decoder", GENAI, Location(str(genai.path), genai.line_of("model", "decoder"),
                                                           "model.decoder"))
        if exp.family is None and genai.model_type:
            exp.family = Expected(genai.model_type, GENAI, Location(str(genai.path), genai.line_of("model", "type"), "model.type"))
        if exp.attention_layers is None and genai.layer_types:
            softmax_layers = sum(1 for t in genai.layer_types if "attention" in t and "linear" not in t)
            line = genai.line_of("model", "decoder", "layer_types")
            exp.attention_layers = Expected(softmax_layers, GENAI, Location(str(genai.path), line, "model.decoder.layer_types"))

    _infer_from_graph(exp, graph)
    return exp


def _infer_from_graph(exp: Expectations, graph: Graph) -> None:
    blocks = moe_blocks(graph)
    decoder_layers = decoder_layer_count(graph)
    if exp.layers is None and decoder_layers:
        exp.layers = Expected(decoder_layers, GRAPH)
    if exp.attention_layers is None and exp.layers is not None and exp.layers.declared:
        # Declared layers minus the linear-attention layers the graph really has (hybrid models).
        linear = len(linear_attention_layers(graph))
        exp.attention_layers = Expected(exp.layers.value - linear, exp.layers.origin, exp.layers.location)
    if exp.attention_layers is None:
        mixers = token_mixer_layers(graph)
        count = len(mixers["fused"] | mixers["decomposed"])
        if count:
            exp.attention_layers = Expected(count, GRAPH)
    if exp.moe_layers is None and blocks and not moe_misses(graph):  # a count only when every router was read
        exp.moe_layers = Expected(len(blocks), GRAPH)
    if exp.experts is None:
        experts = sorted({b.experts for b in blocks if b.experts})
        if experts:
            exp.experts = Expected(experts[-1], GRAPH)
    if exp.top_k is None:
        ks = sorted({b.k for b in blocks if b.k})
        if ks:
            exp.top_k = Expected(ks[-1], GRAPH)
    gqa = gqa_nodes(graph)
    if gqa:
        first = gqa[0]
        if exp.num_heads is None and first.int_attr("num_heads"):
            exp.num_heads = Expected(first.int_attr("num_heads"), GRAPH)
        if exp.kv_num_heads is None and first.int_attr("kv_num_heads"):
            exp.kv_num_heads = Expected(first.int_attr("kv_num_heads"), GRAPH)


def decoder_layer_count(graph: Graph) -> int:
    """Layers holding a token mixer or a projection (genai's builder files its final norm under one more)."""
    from ortgate.graph.patterns.common import linear_nodes

    layers = {n.layer for n in linear_nodes(graph) if n.layer is not None}
    mixers = token_mixer_layers(graph)
    layers |= mixers["fused"] | mixers["decomposed"] | mixers["linear"]
    layers |= {b.layer for b in moe_blocks(graph) if b.layer is not None}
    return len(layers)
