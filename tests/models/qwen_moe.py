"""Generator of small Qwen3-MoE-family ONNX graphs for ortgate's tests, examples and benchmarks.

``build_model(ModelSpec(...))`` writes a decoder-only LLM graph with onnx.helper: token embedding,
``layers`` decoder layers (input RMSNorm -> attention or linear attention -> residual + RMSNorm ->
MoE or MLP -> residual), a final RMSNorm and an lm_head MatMul. Each block kind (norm, rotary,
attention, linear attention, MoE, MLP) has its own small function, and every block has a fused form
(the com.microsoft contrib ops that onnxruntime-genai's builder emits) and unfused forms (what a
torch.onnx export of a transformers model looks like), selected by the spec.

The graph interface follows onnxruntime-genai: inputs ``input_ids`` [batch_size, sequence_length],
``attention_mask`` [batch_size, total_sequence_length] (int64), optionally ``position_ids``,
``past_key_values.{i}.key/value`` [batch_size, kv_num_heads, past_sequence_length, head_dim] for
attention layers and ``past.{i}.conv`` / ``past.{i}.recurrent`` for linear-attention layers; outputs
``logits`` and the matching ``present.{i}.*``. Without a position_ids input, positions are computed
in the graph from the lengths of input_ids and attention_mask.

Naming (``ModelSpec.naming``) decides how node, initializer and intermediate value names carry the
layer: "genai" (``/model/layers.3/attn/qkv_proj/MatMul``), "hf" (``model.layers.3.self_attn.q_proj/MatMul``),
"opaque" (``node_1234``, ``w_12``, ``t_56``) and "none" (empty node names, opaque values and initializers).
With "opaque" and "none" the only names that still hold a layer number are the graph inputs and
outputs (``past_key_values.3.key``...): they are the runtime interface that genai binds by name.

Weights are seeded random values (``weights="random"``) so that the models run in ONNX Runtime, or
external-data stubs (``weights="external_stub"``: data_location=EXTERNAL, location/offset/length, no
bytes), so that benchmark graphs with 48 layers x 128 experts build in about a second without memory.
Random values are derived from (seed, logical parameter) - q_proj, expert 3's up_proj, ... - not from
the order of creation, so every fused and unfused form of one spec computes the same logits (MoE's
stacked fc1 holds the same numbers as the dense loop's per-expert MatMuls; QMoE and MatMulNBits
weights are random bytes and do not).

ONNX Runtime 1.31 CPU runs every combination except (seen): MoE/QMoE with swiglu_fusion 0 or 2
("CPU MoE only supports interleaved SwiGLU format. Please set swiglu_fusion=1.") and float16
gather_loop (ScatterND reduction="add" has no MLFloat16 CPU kernel). float16 GroupQueryAttention,
MoE, QMoE, MultiHeadAttention, ai.onnx Attention and the linear-attention ops do run on CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = [
    "ModelSpec",
    "build_model",
    "save_model",
    "make_feeds",
    "op_counts",
    "spec_from_model",
]

MS_DOMAIN = "com.microsoft"
IR_VERSION = 10  # ORT 1.31 rejects IR 14, the onnx 1.23 default
OPSET = 21
OPSET_WITH_ONNX_ATTENTION = 23  # ai.onnx Attention appeared in opset 23
SPEC_METADATA_KEY = "qwen_moe.spec"

LAYER_TYPES = ("full_attention", "linear_attention", "sliding_attention")
MOE_KINDS = ("fused", "qmoe", "dense_loop", "gather_loop", "dense")
ATTENTION_KINDS = ("gqa", "decomposed", "mha", "onnx_attention")
QKV_KINDS = ("packed", "separate")
ROTARY_KINDS = ("fused", "gqa", "decomposed")
NORM_KINDS = ("fused", "decomposed", "decomposed_cast", "decomposed_div")
GATE_UP_KINDS = ("merged", "separate")
NAMING_STYLES = ("genai", "hf", "opaque", "none")
WEIGHT_KINDS = ("random", "external_stub")
ROUTER_ORDERS = ("softmax_topk", "topk_softmax")
MOE_ACTIVATIONS = ("swiglu", "silu", "gelu", "relu", "identity")

# bfloat16 is for external-stub skeletons (sizes only): ORT's CPU provider has few bfloat16 kernels.
_ONNX_DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}


@dataclass(frozen=True)
class ModelSpec:
    """What to generate. Defaults: a 2-layer, 4-expert fused model that runs in milliseconds."""

    layers: int = 2
    hidden: int = 64
    vocab: int = 256
    experts: int = 4
    top_k: int = 2
    moe_intermediate: int = 32
    shared_expert: bool = False  # Qwen3.5-MoE: one always-on expert scaled by a sigmoid gate
    num_heads: int = 4
    kv_num_heads: int = 2
    head_dim: int = 16
    dtype: str = "float32"  # "float32" | "float16" | "bfloat16" (external-stub skeletons only)
    layer_types: tuple[str, ...] | None = None  # per layer, see LAYER_TYPES; None = all full_attention
    moe: str = "fused"  # see MOE_KINDS
    swiglu_fusion: int = 1  # fused/qmoe: 0 separate fc3, 1 interleaved, 2 concatenated
    moe_activation: str = "swiglu"
    normalize_routing_weights: int = 1
    # how the top-k weights are renormalised: "sum" (ReduceSum -> Div, Qwen3), "l1" (ReduceL1 -> Div, DBRX's
    # torch.norm(p=1)), "clamped_sum" (ReduceSum -> Clip(min) -> Div, ERNIE-4.5's moe_norm_min)
    renormalisation: str = "sum"
    attention: str = "gqa"  # see ATTENTION_KINDS
    qkv: str = "packed"  # "packed" (one MatMul to [q|k|v]) | "separate" (q_proj, k_proj, v_proj)
    rotary: str = "fused"  # "fused" (com.microsoft RotaryEmbedding) | "gqa" (do_rotary=1) | "decomposed"
    norm: str = "fused"  # see NORM_KINDS
    gate_up: str = "merged"  # dense_loop/gather_loop experts and MLPs: "merged" (one MatMul + Split) | "separate"
    norm_epsilon: float | None = 1e-6  # None = omit the epsilon attribute on the fused norm ops
    kv_cache: bool = True  # past/present KV tensors (GroupQueryAttention always has them)
    naming: str = "genai"  # see NAMING_STYLES
    control_flow: bool = False  # add an If node (prompt vs decode branch) after the embedding
    external_data: bool = False  # save_model() writes the weights to "<name>.data" even if not asked
    seed: int = 0
    weights: str = "random"  # "random" (small seeded arrays) | "external_stub" (external data, no bytes)
    # --- knobs beyond the basic Qwen3-MoE shape ---
    router_order: str = "softmax_topk"  # loops: Softmax -> TopK (Qwen3 HF) or TopK -> Softmax (Mixtral)
    attention_scale: str = "div"  # decomposed attention: scores Div sqrt(head_dim) | Mul 1/sqrt(head_dim)
    qk_norm: bool = False  # Qwen3's per-head RMSNorm on q and k (Reshape -> norm -> Reshape)
    sliding_window: int = 16  # window of "sliding_attention" layers
    max_position: int = 256  # rows of the rotary cos/sin caches
    rope_theta: float = 1_000_000.0
    dense_intermediate: int = 64  # MLP width for moe="dense"
    qmoe_bits: int = 4  # QMoE expert_weight_bits: 4 or 8
    qmoe_block_size: int = 0  # QMoE block_size; 0 = one scale per output column
    matmul_nbits: bool = False  # attention / MLP / lm_head projections as com.microsoft MatMulNBits (int4)
    linear_key_heads: int = 2  # Qwen3.5 gated DeltaNet: q/k heads ...
    linear_value_heads: int = 4  # ... and v heads (more v heads than k heads, as in Qwen3.5)
    linear_key_head_dim: int = 16
    linear_value_head_dim: int = 16
    linear_conv_kernel: int = 4
    stub_location: str = "model.onnx.data"  # external_stub: the location every stub points to
    # "computed" in the graph from the mask lengths | "input" (int64 [batch_size, sequence_length]) | "input_3d"
    # (int64 [3, batch_size, sequence_length], Qwen3.5's multimodal layout, fed as is to the rotary: what
    # onnxruntime-genai 0.18's Qwen3.5-MoE export does, and what ORT's RotaryEmbedding kernel refuses at run time)
    position_ids: str = "computed"
    # Where the residual stream is taken: "pre" (h + block(norm(h)), Llama/Qwen), "post" (n = norm(h); n + block(n),
    # MiniMax, whose residual is the normalised value, scaled by residual_alpha), "sandwich" (h + norm(block(norm(h))),
    # Gemma 2/3: a norm before and after each block)
    residual: str = "pre"
    residual_alpha: float = 1.0  # "post": the residual's scale (MiniMax-Text-01: 3.5565588200778455)

    def __post_init__(self) -> None:
        choices = {
            "dtype": tuple(_ONNX_DTYPES),
            "moe": MOE_KINDS,
            "attention": ATTENTION_KINDS,
            "qkv": QKV_KINDS,
            "rotary": ROTARY_KINDS,
            "norm": NORM_KINDS,
            "gate_up": GATE_UP_KINDS,
            "naming": NAMING_STYLES,
            "weights": WEIGHT_KINDS,
            "router_order": ROUTER_ORDERS,
            "moe_activation": MOE_ACTIVATIONS,
            "attention_scale": ("div", "mul"),
            "position_ids": ("computed", "input", "input_3d"),
            "residual": ("pre", "post", "sandwich"),
        }
        for field, allowed in choices.items():
            if getattr(self, field) not in allowed:
                raise ValueError(f"ModelSpec.{field}={getattr(self, field)!r}: expected one of {allowed}")
        if self.layer_types is not None:
            if len(self.layer_types) != self.layers:
                raise ValueError(f"layer_types has {len(self.layer_types)} entries for {self.layers} layers")
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad:
                raise ValueError(f"unknown layer types {bad}: expected {LAYER_TYPES}")
        if self.num_heads % self.kv_num_heads:
            raise ValueError("num_heads must be a multiple of kv_num_heads")
        if self.linear_value_heads % self.linear_key_heads:
            raise ValueError("linear_value_heads must be a multiple of linear_key_heads")
        if self.rotary == "gqa" and self.attention != "gqa":
            raise ValueError('rotary="gqa" needs attention="gqa"')
        if self.top_k > self.experts:
            raise ValueError("top_k > experts")
        if self.swiglu_fusion not in (0, 1, 2):
            raise ValueError("swiglu_fusion must be 0, 1 or 2")
        if self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary)")
        if self.moe == "qmoe":
            if self.qmoe_bits not in (4, 8):
                raise ValueError("qmoe_bits must be 4 or 8")
            pack = 8 // self.qmoe_bits
            block = self.qmoe_block_size or 1
            for width in (self.hidden, self.moe_intermediate):
                if width % (pack * block):
                    raise ValueError(f"QMoE needs hidden and moe_intermediate divisible by {pack * block}")

    # ---- derived sizes -------------------------------------------------------------------------
    @property
    def resolved_layer_types(self) -> tuple[str, ...]:
        return self.layer_types if self.layer_types is not None else ("full_attention",) * self.layers

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Layers with softmax attention (full or sliding window)."""
        return tuple(i for i, t in enumerate(self.resolved_layer_types) if t != "linear_attention")

    @property
    def linear_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.resolved_layer_types) if t == "linear_attention")

    @property
    def has_kv_cache(self) -> bool:
        return self.kv_cache or self.attention == "gqa"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_num_heads * self.head_dim

    @property
    def linear_key_dim(self) -> int:
        return self.linear_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def np_dtype(self) -> type:
        if self.dtype == "bfloat16":
            import ml_dtypes

            return ml_dtypes.bfloat16
        return np.float16 if self.dtype == "float16" else np.float32

    @property
    def onnx_dtype(self) -> int:
        return _ONNX_DTYPES[self.dtype]

    @property
    def fused_moe_fc1_rows(self) -> int:
        """Rows of the fused MoE's fc1 per expert: gate and up together when SwiGLU is fused."""
        fused = self.moe_activation == "swiglu" and self.swiglu_fusion in (1, 2)
        return 2 * self.moe_intermediate if fused else self.moe_intermediate

    def to_json(self) -> str:
        values = dataclasses.asdict(self)
        for key in _OMITTED_AT_DEFAULT:  # later knobs: models built without them keep the bytes they had
            if values[key] == _DEFAULTS[key]:
                del values[key]
        return json.dumps(values, sort_keys=True)


_OMITTED_AT_DEFAULT = ("renormalisation", "residual", "residual_alpha")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelSpec)}


def spec_from_model(model: onnx.ModelProto) -> ModelSpec | None:
    """The ModelSpec a generated model was built from (kept in its metadata), or None."""
    for prop in model.metadata_props:
        if prop.key == SPEC_METADATA_KEY:
            values = json.loads(prop.value)
            if values.get("layer_types") is not None:
                values["layer_types"] = tuple(values["layer_types"])
            known = {f.name for f in dataclasses.fields(ModelSpec)}
            return ModelSpec(**{k: v for k, v in values.items() if k in known})
    return None


# =================================================================================================
# Names
# =================================================================================================


@dataclass(frozen=True)
class _Scope:
    """Where a node or weight belongs: a layer (None = model level) and a module path.

    Module paths use onnxruntime-genai's vocabulary ("attn/qkv_proj", "moe/router", "moe/experts.3/up_proj");
    the "hf" style translates them to transformers module names.
    """

    layer: int | None
    module: str

    def sub(self, name: str) -> _Scope:
        return _Scope(self.layer, f"{self.module}/{name}" if self.module else name)


_HF_MODULE_NAMES = {
    "attn": "self_attn",
    "moe": "mlp",
    "router": "gate",
    "final_norm_layernorm": "norm",
}

# genai names its norm nodes after the role, not the op type
_GENAI_NODE_LABELS = {
    "SimplifiedLayerNormalization": "LayerNorm",
    "SkipSimplifiedLayerNormalization": "SkipLayerNorm",
}


class _Namer:
    """Makes node, value and initializer names in one of NAMING_STYLES; all names are unique."""

    def __init__(self, style: str, num_layers: int) -> None:
        self.style = style
        self.num_layers = num_layers
        self._used: dict[str, int] = {}
        self._node_ids = itertools.count()
        self._value_ids = itertools.count()
        self._weight_ids = itertools.count()
        self._constant_ids = itertools.count()

    def _unique(self, name: str) -> str:
        count = self._used.get(name)
        if count is None:
            self._used[name] = 0
            return name
        while True:
            count += 1
            candidate = f"{name}_{count}"
            if candidate not in self._used:
                self._used[name] = count
                self._used[candidate] = 0
                return candidate

    def _genai_path(self, scope: _Scope) -> str:
        if scope.layer is not None:
            return f"/model/layers.{scope.layer}/{scope.module}"
        if scope.module == "lm_head":
            return "/lm_head"
        if scope.module == "final_norm_layernorm":  # genai numbers the final norm as one layer past the last
            return f"/model/layers.{self.num_layers}/final_norm_layernorm"
        return f"/model/{scope.module}"

    def _hf_path(self, scope: _Scope) -> str:
        parts = [_HF_MODULE_NAMES.get(p, p) for p in scope.module.split("/")]
        if scope.layer is not None:
            return ".".join(["model", "layers", str(scope.layer), *parts])
        if scope.module == "lm_head":
            return "lm_head"
        return ".".join(["model", *parts])

    def node(self, scope: _Scope, label: str) -> str:
        if self.style == "none":
            return ""
        if self.style == "opaque":
            return f"node_{next(self._node_ids)}"
        if self.style == "genai":
            return self._unique(f"{self._genai_path(scope)}/{_GENAI_NODE_LABELS.get(label, label)}")
        return self._unique(f"{self._hf_path(scope)}/{label}")

    def value(self, node_name: str, index: int) -> str:
        if self.style == "genai":
            return f"{node_name}/output_{index}"
        if self.style == "hf":
            return f"{node_name}_output_{index}"
        return f"t_{next(self._value_ids)}"

    def weight(self, scope: _Scope, leaf: str) -> str:
        if self.style in ("opaque", "none"):
            return f"w_{next(self._weight_ids)}"
        if self.style == "genai":
            path = self._genai_path(scope).lstrip("/").replace("/", ".")
        else:
            path = self._hf_path(scope)
        return self._unique(f"{path}.{leaf}")

    def constant(self, key: str) -> str:
        if self.style in ("opaque", "none"):
            return f"w_{next(self._weight_ids)}"
        if self.style == "genai":
            return self._unique(f"/model/constants/{key}")
        return f"model.constants.c{next(self._constant_ids)}"


# =================================================================================================
# Graph under construction
# =================================================================================================


class _Graph:
    """Collects nodes and initializers; knows the spec's dtype, naming and weight kind."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.names = _Namer(spec.naming, spec.layers)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._constants: dict[tuple, str] = {}
        self._stub_offset = 0

    # ---- nodes ---------------------------------------------------------------------------------
    def ops(
        self,
        op_type: str,
        inputs: Sequence[str],
        scope: _Scope,
        outputs: int | Sequence[str | None] = 1,
        *,
        label: str | None = None,
        domain: str = "",
        **attrs,
    ) -> list[str]:
        """Add one node; return its output names.

        outputs: a count, or a list of names where None means "generate one" and "" an unused optional output.
        """
        name = self.names.node(scope, label or op_type)
        if isinstance(outputs, int):
            outputs = [None] * outputs
        outputs = [self.names.value(name, i) if out is None else out for i, out in enumerate(outputs)]
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name, domain=domain, **attrs))
        return outputs

    def op(self, op_type: str, inputs: Sequence[str], scope: _Scope, **kwargs) -> str:
        """Add a single-output node; return the output name."""
        return self.ops(op_type, inputs, scope, 1, **kwargs)[0]

    # ---- constants and weights ----------------------------------------------------------------
    def const(self, values, dtype=np.int64) -> str:
        """A small inline constant (shape vectors, axes, scalars), shared by every user."""
        array = np.asarray(values, dtype=dtype)
        key = (array.dtype.str, array.shape, array.tobytes())
        name = self._constants.get(key)
        if name is None:
            type_name = helper.tensor_dtype_to_string(helper.np_dtype_to_tensor_dtype(array.dtype))
            label = f"{type_name.replace('TensorProto.', '')}/{array.tolist()}"
            name = self.names.constant(label)
            self.initializers.append(numpy_helper.from_array(array, name))
            self._constants[key] = name
        return name

    def float_const(self, value: float) -> str:
        """A scalar in the model's float dtype."""
        return self.const(value, self.spec.np_dtype)

    def param(self, key: tuple, shape: Sequence[int], std: float = 0.02) -> np.ndarray:
        """float32 normal(0, std) values of one logical parameter, derived from (spec.seed, key) alone.

        Every variant that holds the same logical parameter (q_proj alone or inside a packed qkv_proj,
        an expert's gate_proj alone, in a merged gate_up_proj or in MoE's stacked fc1) gets the same
        numbers, so the fused and unfused forms of one spec compute the same function.
        """
        rng = np.random.default_rng([self.spec.seed, zlib.crc32(repr(key).encode())])
        return rng.standard_normal(size=tuple(shape), dtype=np.float32) * std

    def weight(
        self,
        scope: _Scope,
        leaf: str,
        shape: Sequence[int],
        *,
        data: Callable[[], np.ndarray] | None = None,
        fill: float | None = None,
        dtype=None,
        std: float = 0.02,
    ) -> str:
        """A parameter initializer: `data()`, `fill` everywhere, or keyed random values (uniform bytes
        for uint8) - or, with weights="external_stub", an external-data stub with no bytes at all."""
        dtype = np.dtype(dtype or self.spec.np_dtype)
        name = self.names.weight(scope, leaf)
        if self.spec.weights == "external_stub":
            self.initializers.append(self._external_stub(name, shape, dtype))
            return name
        key = (scope.layer, scope.module, leaf)
        if data is not None:
            array = data()
        elif fill is not None:
            array = np.full(shape, fill)
        elif dtype == np.uint8:
            array = np.random.default_rng([self.spec.seed, zlib.crc32(repr(key).encode())]).integers(0, 256, size=shape)
        else:
            array = self.param(key, shape, std)
        assert tuple(array.shape) == tuple(shape), (name, array.shape, shape)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=dtype), name))
        return name

    def _external_stub(self, name: str, shape: Sequence[int], dtype: np.dtype) -> TensorProto:
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = helper.np_dtype_to_tensor_dtype(dtype)
        tensor.dims.extend(shape)
        tensor.data_location = TensorProto.EXTERNAL
        length = math.prod(shape) * dtype.itemsize
        for key, value in (
            ("location", self.spec.stub_location),
            ("offset", str(self._stub_offset)),
            ("length", str(length)),
        ):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self._stub_offset += -(-length // 4096) * 4096  # 4 KiB aligned, like ORT's own external writer
        return tensor

    # ---- graph interface -----------------------------------------------------------------------
    def add_input(self, name: str, elem_type: int, shape: Sequence) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def add_output(self, name: str, elem_type: int, shape: Sequence) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name


# =================================================================================================
# Graph-wide tensors (positions, masks, rotary tables), made once on first use
# =================================================================================================


class _Context:
    """Tensors that all layers share; each is built at its first use, so unused ones cost no nodes."""

    def __init__(self, g: _Graph) -> None:
        self.g = g
        self.spec = g.spec
        self._made: dict[tuple, object] = {}

    def _once(self, key: tuple, make):
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    # ---- lengths ------------------------------------------------------------------------------
    def lengths(self) -> tuple[str, str, str]:
        """(sequence_length, total_sequence_length, past_sequence_length) as int64 scalars."""

        def make():
            g, scope = self.g, _Scope(None, "attn_mask_reformat")
            seq_len = g.op("Gather", [g.op("Shape", ["input_ids"], scope), g.const(1)], scope, axis=0)
            total_len = g.op("Gather", [g.op("Shape", ["attention_mask"], scope), g.const(1)], scope, axis=0)
            past_len = g.op("Sub", [total_len, seq_len], scope)
            return seq_len, total_len, past_len

        return self._once(("lengths",), make)

    def position_ids(self) -> str:
        """[batch_size, sequence_length] int64 positions past_len .. total_len - 1 (or the position_ids input)."""
        if self.spec.position_ids in ("input", "input_3d"):
            return "position_ids"

        def make():
            g, scope = self.g, _Scope(None, "pos_ids")
            _, total_len, past_len = self.lengths()
            positions = g.op("Range", [past_len, total_len, g.const(1)], scope)
            row = g.op("Unsqueeze", [positions, g.const([0])], scope)
            return g.op("Expand", [row, g.op("Shape", ["input_ids"], scope)], scope)

        return self._once(("position_ids",), make)

    def gqa_lengths(self) -> tuple[str, str]:
        """GroupQueryAttention's seqlens_k (int32 [batch]) and total_sequence_length (int32 scalar)."""

        def make():
            g, scope = self.g, _Scope(None, "attn_mask_reformat/attn_mask_subgraph")
            summed = g.op("ReduceSum", ["attention_mask", g.const([1])], scope, keepdims=0)
            seqlens = g.op("Cast", [g.op("Sub", [summed, g.const(1)], scope)], scope, to=TensorProto.INT32)
            _, total_len, _ = self.lengths()
            total = g.op("Cast", [total_len], scope, to=TensorProto.INT32)
            return seqlens, total

        return self._once(("gqa_lengths",), make)

    def additive_mask(self, window: int | None) -> str:
        """[batch, 1, seq, total] float mask: 0 where a query may attend, the dtype's minimum elsewhere."""

        def make():
            g, scope = self.g, _Scope(None, "attn_mask_reformat" if window is None else "attn_mask_reformat/sliding")
            _, total_len, past_len = self.lengths()
            query_pos = g.op("Unsqueeze", [g.op("Range", [past_len, total_len, g.const(1)], scope), g.const([1])], scope)
            key_pos = g.op("Unsqueeze", [g.op("Range", [g.const(0), total_len, g.const(1)], scope), g.const([0])], scope)
            allowed = g.op("LessOrEqual", [key_pos, query_pos], scope)  # causal, [seq, total]
            if window is not None:
                distance = g.op("Sub", [query_pos, key_pos], scope)
                allowed = g.op("And", [allowed, g.op("Less", [distance, g.const(window)], scope)], scope)
            not_padding = g.op(
                "Cast", [g.op("Unsqueeze", ["attention_mask", g.const([1, 2])], scope)], scope, to=TensorProto.BOOL
            )
            allowed = g.op("And", [allowed, not_padding], scope)
            lowest = float(np.finfo(self.spec.np_dtype).min)
            return g.op("Where", [allowed, g.float_const(0.0), g.float_const(lowest)], scope)

        return self._once(("mask", window), make)

    def rotary_caches(self) -> tuple[str, str]:
        """cos/sin caches [max_position, head_dim / 2] for RotaryEmbedding and GroupQueryAttention."""

        def make():
            g, scope = self.g, _Scope(None, "rotary_emb")
            shape = (self.spec.max_position, self.spec.head_dim // 2)
            angles = lambda: np.outer(np.arange(self.spec.max_position), self._inverse_frequencies())  # noqa: E731
            return (
                g.weight(scope, "cos_cache", shape, data=lambda: np.cos(angles())),
                g.weight(scope, "sin_cache", shape, data=lambda: np.sin(angles())),
            )

        return self._once(("rotary_caches",), make)

    def rotary_cos_sin(self) -> tuple[str, str]:
        """cos/sin [batch, seq, 1, head_dim] computed with Sin/Cos like transformers' rotary_emb."""

        def make():
            g, scope = self.g, _Scope(None, "rotary_emb")
            inv_freq = g.const(self._inverse_frequencies().reshape(1, 1, -1), np.float32)
            positions = g.op("Cast", [g.op("Unsqueeze", [self.position_ids(), g.const([2])], scope)], scope, to=TensorProto.FLOAT)
            freqs = g.op("Mul", [positions, inv_freq], scope)  # [batch, seq, head_dim / 2]
            emb = g.op("Concat", [freqs, freqs], scope, axis=-1)
            out = []
            for trig in ("Cos", "Sin"):
                table = g.op("Cast", [g.op(trig, [emb], scope)], scope, to=self.spec.onnx_dtype)
                out.append(g.op("Unsqueeze", [table, g.const([2])], scope))  # broadcast over heads (BSNH)
            return tuple(out)

        return self._once(("rotary_cos_sin",), make)

    def _inverse_frequencies(self) -> np.ndarray:
        dim = self.spec.head_dim
        return (1.0 / self.spec.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)).astype(np.float32)


# =================================================================================================
# Building blocks
# =================================================================================================


_Parts = Sequence[tuple[tuple, int]]  # (logical parameter key, output width) blocks of a packed weight


def _packed_weight(g: _Graph, in_features: int, parts: _Parts | None) -> Callable[[], np.ndarray] | None:
    """data() for a weight whose output columns concatenate logical parameters (e.g. [q | k | v])."""
    if parts is None:
        return None
    return lambda: np.concatenate([g.param(key, (in_features, width)) for key, width in parts], axis=1)


def _plain_matmul(
    g: _Graph, x: str, scope: _Scope, in_features: int, out_features: int,
    *, parts: _Parts | None = None, output: str | None = None,
) -> str:
    """x @ W as a float MatMul."""
    weight = g.weight(scope, "weight", (in_features, out_features), data=_packed_weight(g, in_features, parts))
    return g.ops("MatMul", [x, weight], scope, [output])[0]


def _linear(
    g: _Graph, x: str, scope: _Scope, in_features: int, out_features: int,
    *, parts: _Parts | None = None, output: str | None = None,
) -> str:
    """A projection: float MatMul, or com.microsoft MatMulNBits (int4, random bytes) with spec.matmul_nbits."""
    if not g.spec.matmul_nbits:
        return _plain_matmul(g, x, scope, in_features, out_features, parts=parts, output=output)
    block = 32 if in_features % 32 == 0 else 16
    blocks = -(-in_features // block)
    packed = g.weight(scope, "qweight", (out_features, blocks, block // 2), dtype=np.uint8)
    scales = g.weight(scope, "scales", (out_features * blocks,), fill=_quant_scale(4))
    return g.ops(
        "MatMulNBits", [x, packed, scales], scope, [output], domain=MS_DOMAIN,
        K=in_features, N=out_features, bits=4, block_size=block, accuracy_level=0,
    )[0]


def _quant_scale(bits: int) -> float:
    """Dequantization scale that keeps random quantized weights within about +-0.16 (fp16-safe)."""
    return 0.16 / 2 ** (bits - 1)


def _norm_weight(g: _Graph, scope: _Scope, width: int) -> str:
    """RMSNorm gamma: 1 + noise, the same values whichever norm form uses it."""
    return g.weight(scope, "weight", (width,), data=lambda: 1.0 + g.param((scope.layer, scope.module), (width,), std=0.1))


def _rms_norm(g: _Graph, x: str, scope: _Scope, width: int) -> str:
    """RMSNorm over the last axis: SimplifiedLayerNormalization, or the decomposed pattern."""
    spec = g.spec
    gamma = _norm_weight(g, scope, width)
    if spec.norm == "fused":
        return g.op("SimplifiedLayerNormalization", [x, gamma], scope, axis=-1, epsilon=spec.norm_epsilon, stash_type=1)
    epsilon = 1e-6 if spec.norm_epsilon is None else spec.norm_epsilon
    compute_type = spec.np_dtype
    if spec.norm == "decomposed_cast":  # transformers: hidden_states.to(torch.float32) ... .to(input_dtype)
        x = g.op("Cast", [x], scope, to=TensorProto.FLOAT)
        compute_type = np.float32
    variance = g.op("ReduceMean", [g.op("Pow", [x, g.const(2.0, compute_type)], scope), g.const([-1])], scope, keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [variance, g.const(epsilon, compute_type)], scope)], scope)
    if spec.norm == "decomposed_div":
        normed = g.op("Div", [x, std], scope)
    else:
        normed = g.op("Mul", [x, g.op("Reciprocal", [std], scope)], scope)
    if spec.norm == "decomposed_cast":
        normed = g.op("Cast", [normed], scope, to=spec.onnx_dtype)
    return g.op("Mul", [gamma, normed], scope)


def _add_and_norm(g: _Graph, x: str, residual: str | None, scope: _Scope) -> tuple[str, str]:
    """residual += x, then RMSNorm; return (normed, new residual).

    Fused: SkipSimplifiedLayerNormalization (its 4th output is the sum), or SimplifiedLayerNormalization
    for the first norm, which has no residual yet - exactly like onnxruntime-genai's builder.
    """
    spec = g.spec
    if spec.norm != "fused":
        new_residual = x if residual is None else g.op("Add", [residual, x], scope)
        return _rms_norm(g, new_residual, scope, spec.hidden), new_residual
    if residual is None:
        return _rms_norm(g, x, scope, spec.hidden), x
    gamma = _norm_weight(g, scope, spec.hidden)
    normed, _, _, new_residual = g.ops(
        "SkipSimplifiedLayerNormalization", [x, residual, gamma], scope, [None, "", "", None],
        domain=MS_DOMAIN, epsilon=spec.norm_epsilon,
    )
    return normed, new_residual


def _residual_step(g: _Graph, x: str, residual: str, normed: str, scope: _Scope) -> tuple[str, str]:
    """The residual addition after a block and the norm for the next: (normed, new residual).

    Pre-norm and sandwich-norm add to the un-normalised stream (`_add_and_norm`). Post-norm adds to the block's
    normalised input (scaled by residual_alpha), and the next norm's output is both the next block's input and the
    next residual: fused, a SkipSimplifiedLayerNormalization whose input + skip output nothing reads (what ORT's
    SkipLayerNormFusion makes of `norm(n * alpha + x)`)."""
    spec = g.spec
    if spec.residual != "post":
        return _add_and_norm(g, x, residual, scope)
    kept = normed if spec.residual_alpha == 1.0 else g.op("Mul", [normed, g.const(spec.residual_alpha, spec.np_dtype)], scope)
    if spec.norm != "fused":
        out = _rms_norm(g, g.op("Add", [kept, x], scope), scope, spec.hidden)
        return out, out
    gamma = _norm_weight(g, scope, spec.hidden)
    out = g.op("SkipSimplifiedLayerNormalization", [x, kept, gamma], scope, domain=MS_DOMAIN, epsilon=spec.norm_epsilon)
    return out, out


def _split_heads(g: _Graph, x: str, scope: _Scope, heads: int, head_dim: int) -> str:
    """[batch, seq, heads * head_dim] -> [batch, seq, heads, head_dim]"""
    return g.op("Reshape", [x, g.const([0, 0, heads, head_dim])], scope)


def _merge_heads(g: _Graph, x: str, scope: _Scope) -> str:
    """[batch, seq, heads, head_dim] -> [batch, seq, heads * head_dim]"""
    return g.op("Reshape", [x, g.const([0, 0, -1])], scope)


def _rotate(g: _Graph, ctx: _Context, x_bsnh: str, scope: _Scope) -> str:
    """Decomposed rotary on [batch, seq, heads, head_dim]: x * cos + rotate_half(x) * sin."""
    half = g.spec.head_dim // 2
    cos, sin = ctx.rotary_cos_sin()
    first = g.op("Slice", [x_bsnh, g.const([0]), g.const([half]), g.const([-1])], scope)
    second = g.op("Slice", [x_bsnh, g.const([half]), g.const([g.spec.head_dim]), g.const([-1])], scope)
    rotated = g.op("Concat", [g.op("Neg", [second], scope), first], scope, axis=-1)
    return g.op("Add", [g.op("Mul", [x_bsnh, cos], scope), g.op("Mul", [rotated, sin], scope)], scope)


def _qk_norm_and_rotary(g: _Graph, ctx: _Context, x: str, scope: _Scope, heads: int, kind: str) -> str:
    """Per-head q/k RMSNorm (spec.qk_norm) and rotary, on a [batch, seq, heads * head_dim] tensor.

    kind is "q" or "k"; rotary="gqa" leaves the rotation to GroupQueryAttention.
    """
    spec = g.spec
    if spec.qk_norm:
        heads_4d = _split_heads(g, x, scope.sub(f"{kind}_norm"), heads, spec.head_dim)
        x = _merge_heads(g, _rms_norm(g, heads_4d, scope.sub(f"{kind}_norm"), spec.head_dim), scope.sub(f"{kind}_norm"))
    if spec.rotary == "fused":
        cos_cache, sin_cache = ctx.rotary_caches()
        return g.op(
            "RotaryEmbedding", [x, ctx.position_ids(), cos_cache, sin_cache], scope.sub(f"{kind}_rotary"),
            domain=MS_DOMAIN, interleaved=0,
        )
    if spec.rotary == "decomposed":
        rot_scope = scope.sub(f"{kind}_rotary")
        return _merge_heads(g, _rotate(g, ctx, _split_heads(g, x, rot_scope, heads, spec.head_dim), rot_scope), rot_scope)
    return x


def _to_bnsh(g: _Graph, x: str, scope: _Scope, heads: int) -> str:
    """[batch, seq, heads * head_dim] -> [batch, heads, seq, head_dim]"""
    return g.op("Transpose", [_split_heads(g, x, scope, heads, g.spec.head_dim)], scope, perm=[0, 2, 1, 3])


def _from_bnsh(g: _Graph, x: str, scope: _Scope) -> str:
    """[batch, heads, seq, head_dim] -> [batch, seq, heads * head_dim]"""
    return _merge_heads(g, g.op("Transpose", [x], scope, perm=[0, 2, 1, 3]), scope)


def _repeat_kv(g: _Graph, x_bnsh: str, scope: _Scope) -> str:
    """Repeat each kv head num_heads / kv_num_heads times (transformers' repeat_kv: Expand + Reshape)."""
    spec = g.spec
    repeats = spec.num_heads // spec.kv_num_heads
    if repeats == 1:
        return x_bnsh
    expanded = g.op("Expand", [g.op("Unsqueeze", [x_bnsh, g.const([2])], scope), g.const([1, 1, repeats, 1, 1])], scope)
    return g.op("Reshape", [expanded, g.const([0, spec.num_heads, -1, spec.head_dim])], scope)


def _with_past(g: _Graph, x_bnsh: str, layer: int, which: str, scope: _Scope) -> str:
    """Concat past_key_values.{layer}.{which} in front of the new keys/values; the result is present."""
    if not g.spec.kv_cache:
        return x_bnsh
    return g.ops("Concat", [f"past_key_values.{layer}.{which}", x_bnsh], scope, [f"present.{layer}.{which}"], axis=2)[0]


def _attention(g: _Graph, ctx: _Context, layer: int, x: str, window: int | None) -> str:
    """Self-attention of one layer: projections, q/k norm, rotary, attention core, o_proj."""
    spec = g.spec
    scope = _Scope(layer, "attn")
    if spec.qkv == "packed":
        qkv = _linear(
            g, x, scope.sub("qkv_proj"), spec.hidden, spec.q_size + 2 * spec.kv_size,
            parts=[((layer, "q"), spec.q_size), ((layer, "k"), spec.kv_size), ((layer, "v"), spec.kv_size)],
        )
        gqa_packed = spec.attention == "gqa" and spec.rotary == "gqa" and not spec.qk_norm
        if gqa_packed:  # genai's packed form: GQA takes [q|k|v] and rotates itself
            return _o_proj(g, _gqa(g, ctx, layer, [qkv, "", ""], window), scope)
        q, k, v = g.ops(
            "Split", [qkv, g.const([spec.q_size, spec.kv_size, spec.kv_size])], scope.sub("qkv_proj"), 3, axis=-1
        )
    else:
        q = _linear(g, x, scope.sub("q_proj"), spec.hidden, spec.q_size, parts=[((layer, "q"), spec.q_size)])
        k = _linear(g, x, scope.sub("k_proj"), spec.hidden, spec.kv_size, parts=[((layer, "k"), spec.kv_size)])
        v = _linear(g, x, scope.sub("v_proj"), spec.hidden, spec.kv_size, parts=[((layer, "v"), spec.kv_size)])
    q = _qk_norm_and_rotary(g, ctx, q, scope, spec.num_heads, "q")
    k = _qk_norm_and_rotary(g, ctx, k, scope, spec.kv_num_heads, "k")
    core = {
        "gqa": lambda: _gqa(g, ctx, layer, [q, k, v], window),
        "decomposed": lambda: _decomposed_attention(g, ctx, layer, q, k, v, window),
        "mha": lambda: _mha(g, ctx, layer, q, k, v, window),
        "onnx_attention": lambda: _onnx_attention(g, ctx, layer, q, k, v, window),
    }[spec.attention]
    return _o_proj(g, core(), scope)


def _o_proj(g: _Graph, attn: str, scope: _Scope) -> str:
    return _linear(g, attn, scope.sub("o_proj"), g.spec.q_size, g.spec.hidden)


def _gqa(g: _Graph, ctx: _Context, layer: int, qkv: list[str], window: int | None) -> str:
    """com.microsoft GroupQueryAttention with past/present KV, seqlens_k and total_sequence_length."""
    spec = g.spec
    seqlens_k, total_len = ctx.gqa_lengths()
    cos_sin = list(ctx.rotary_caches()) if spec.rotary == "gqa" else []
    return g.ops(
        "GroupQueryAttention",
        [*qkv, f"past_key_values.{layer}.key", f"past_key_values.{layer}.value", seqlens_k, total_len, *cos_sin],
        _Scope(layer, "attn"),
        [None, f"present.{layer}.key", f"present.{layer}.value"],
        domain=MS_DOMAIN,
        num_heads=spec.num_heads,
        kv_num_heads=spec.kv_num_heads,
        do_rotary=int(spec.rotary == "gqa"),
        local_window_size=window if window is not None else -1,
    )[0]


def _decomposed_attention(g: _Graph, ctx: _Context, layer: int, q: str, k: str, v: str, window: int | None) -> str:
    """MatMul -> Div|Mul -> Add(mask) -> Softmax -> MatMul, with repeat_kv, like a torch export."""
    spec = g.spec
    scope = _Scope(layer, "attn")
    q4 = _to_bnsh(g, q, scope, spec.num_heads)
    k4 = _repeat_kv(g, _with_past(g, _to_bnsh(g, k, scope, spec.kv_num_heads), layer, "key", scope), scope)
    v4 = _repeat_kv(g, _with_past(g, _to_bnsh(g, v, scope, spec.kv_num_heads), layer, "value", scope), scope)
    scores = g.op("MatMul", [q4, g.op("Transpose", [k4], scope, perm=[0, 1, 3, 2])], scope)
    if spec.attention_scale == "div":
        scores = g.op("Div", [scores, g.float_const(math.sqrt(spec.head_dim))], scope)
    else:
        scores = g.op("Mul", [scores, g.float_const(1.0 / math.sqrt(spec.head_dim))], scope)
    scores = g.op("Add", [scores, ctx.additive_mask(window)], scope)
    probs = g.op("Softmax", [scores], scope, axis=-1)
    return _from_bnsh(g, g.op("MatMul", [probs, v4], scope), scope)


def _mha(g: _Graph, ctx: _Context, layer: int, q: str, k: str, v: str, window: int | None) -> str:
    """com.microsoft MultiHeadAttention; the KV cache concat and repeat_kv stay outside it (MHA has no GQA)."""
    spec = g.spec
    scope = _Scope(layer, "attn")
    k4 = _repeat_kv(g, _with_past(g, _to_bnsh(g, k, scope, spec.kv_num_heads), layer, "key", scope), scope)
    v4 = _repeat_kv(g, _with_past(g, _to_bnsh(g, v, scope, spec.kv_num_heads), layer, "value", scope), scope)
    return g.op(
        "MultiHeadAttention", [q, k4, v4, "", "", ctx.additive_mask(window)], scope, domain=MS_DOMAIN,
        num_heads=spec.num_heads,
    )


def _onnx_attention(g: _Graph, ctx: _Context, layer: int, q: str, k: str, v: str, window: int | None) -> str:
    """ai.onnx Attention (opset 23): native GQA and KV cache, 4D BNSH inputs."""
    spec = g.spec
    scope = _Scope(layer, "attn")
    inputs = [
        _to_bnsh(g, q, scope, spec.num_heads),
        _to_bnsh(g, k, scope, spec.kv_num_heads),
        _to_bnsh(g, v, scope, spec.kv_num_heads),
        ctx.additive_mask(window),
    ]
    outputs: list[str | None] = [None]
    if spec.kv_cache:
        inputs += [f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"]
        outputs += [f"present.{layer}.key", f"present.{layer}.value"]
    attn = g.ops("Attention", inputs, scope, outputs, scale=1.0 / math.sqrt(spec.head_dim))[0]
    return _from_bnsh(g, attn, scope)


def _linear_attention(g: _Graph, layer: int, x: str) -> str:
    """Qwen3.5 gated DeltaNet layer as onnxruntime-genai 0.18 emits it (com.microsoft contrib ops).

    qkv/z/b/a projections -> CausalConvWithState (silu, carries past.{i}.conv) -> split q, k, v ->
    per-head L2 norm of q and k -> LinearAttentionGate (decay, beta) -> LinearAttention (gated_delta,
    carries past.{i}.recurrent) -> GatedRMSNorm gated by z -> out_proj.
    """
    spec = g.spec
    scope = _Scope(layer, "linear_attn")
    key_dim, value_dim, conv_dim = spec.linear_key_dim, spec.linear_value_dim, spec.linear_conv_dim
    heads_v = spec.linear_value_heads
    qkv = _linear(g, x, scope.sub("qkv_proj"), spec.hidden, conv_dim)
    z = _linear(g, x, scope.sub("z_proj"), spec.hidden, value_dim)
    b = g.op("MatMul", [x, g.weight(scope.sub("b_proj"), "weight", (spec.hidden, heads_v))], scope.sub("b_proj"))
    a = g.op("MatMul", [x, g.weight(scope.sub("a_proj"), "weight", (spec.hidden, heads_v))], scope.sub("a_proj"))

    conv_scope = scope.sub("conv1d")
    channels_first = g.op("Transpose", [qkv], scope.sub("qkv_proj"), perm=[0, 2, 1])
    conv_out = g.ops(
        "CausalConvWithState",
        [
            channels_first,
            g.weight(conv_scope, "weight", (conv_dim, 1, spec.linear_conv_kernel), std=0.2),
            g.weight(conv_scope, "bias", (conv_dim,), fill=0.0),
            f"past.{layer}.conv",
        ],
        scope,
        [None, f"present.{layer}.conv"],
        domain=MS_DOMAIN, ndim=1, activation="silu",
    )[0]
    mixed = g.op("Transpose", [conv_out], scope.sub("conv_out"), perm=[0, 2, 1])
    q, k, v = g.ops("Split", [mixed, g.const([key_dim, key_dim, value_dim])], scope.sub("split_qkv"), 3, axis=-1)
    q = g.op("Mul", [_l2_normalize(g, q, scope.sub("q_l2norm")), g.float_const(1.0 / math.sqrt(spec.linear_key_head_dim))], scope.sub("q_scaled"))
    k = _l2_normalize(g, k, scope.sub("k_l2norm"))

    gate_scope = scope.sub("gate")
    decay, beta = g.ops(
        "LinearAttentionGate",
        [
            a,
            g.weight(gate_scope, "dt_bias", (heads_v,), fill=1.0, dtype=np.float32),
            g.weight(gate_scope, "neg_exp_A", (heads_v,), fill=-1.0, dtype=np.float32),  # -exp(A_log), A_log = 0
            b,
        ],
        scope, 2, domain=MS_DOMAIN,
    )
    attn = g.ops(
        "LinearAttention",
        [q, k, v, f"past.{layer}.recurrent", decay, beta],
        scope,
        [None, f"present.{layer}.recurrent"],
        domain=MS_DOMAIN,
        q_num_heads=spec.linear_key_heads, kv_num_heads=heads_v, update_rule="gated_delta", scale=1.0,
    )[0]
    norm_scope = scope.sub("norm")
    normed = g.op(
        "GatedRMSNorm", [attn, _norm_weight(g, norm_scope, spec.linear_value_head_dim), z],
        scope, domain=MS_DOMAIN, epsilon=1e-6 if spec.norm_epsilon is None else spec.norm_epsilon,
    )
    return _linear(g, normed, scope.sub("out_proj"), value_dim, spec.hidden)


def _l2_normalize(g: _Graph, x: str, scope: _Scope) -> str:
    """Per-head L2 norm of a packed [batch, seq, heads * dim] tensor (Reshape -> LpNormalization -> Reshape)."""
    spec = g.spec
    heads = _split_heads(g, x, scope, spec.linear_key_heads, spec.linear_key_head_dim)
    return _merge_heads(g, g.op("LpNormalization", [heads], scope, axis=-1, p=2), scope)


# ---- feed-forward ---------------------------------------------------------------------------------


def _swiglu_mlp(
    g: _Graph, x: str, scope: _Scope, key: tuple, width: int, intermediate: int, *, projections=_linear
) -> str:
    """down(silu(gate(x)) * up(x)); gate/up as one MatMul + Split, or two MatMuls (spec.gate_up).

    `key` names the logical parameters (key + ("gate",) ...) shared with the fused MoE's stacked weights.
    SiLU is Sigmoid + Mul (ai.onnx has no Silu), as torch.onnx writes it.
    """
    gate_key, up_key, down_key = key + ("gate",), key + ("up",), key + ("down",)
    if g.spec.gate_up == "merged":
        gate_up = projections(
            g, x, scope.sub("gate_up_proj"), width, 2 * intermediate,
            parts=[(gate_key, intermediate), (up_key, intermediate)],
        )
        gate, up = g.ops("Split", [gate_up, g.const([intermediate, intermediate])], scope.sub("gate_up_proj"), 2, axis=-1)
    else:
        gate = projections(g, x, scope.sub("gate_proj"), width, intermediate, parts=[(gate_key, intermediate)])
        up = projections(g, x, scope.sub("up_proj"), width, intermediate, parts=[(up_key, intermediate)])
    act_scope = scope.sub("act_fn")
    silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], act_scope)], act_scope)
    hidden = g.op("Mul", [silu, up], scope)
    return projections(g, hidden, scope.sub("down_proj"), intermediate, width, parts=[(down_key, width)])


def _router_logits(g: _Graph, x: str, scope: _Scope) -> str:
    return g.op("MatMul", [x, g.weight(scope.sub("router"), "weight", (g.spec.hidden, g.spec.experts))], scope.sub("router"))


def _top_k_routing(g: _Graph, logits: str, scope: _Scope) -> tuple[str, str]:
    """(weights, expert indices) of the top-k experts, each [..., top_k].

    softmax_topk: Softmax -> TopK (-> ReduceSum/Div when normalize_routing_weights), like Qwen3-MoE;
    topk_softmax: TopK -> Softmax over the k logits, like Mixtral.
    """
    spec = g.spec
    route_scope = scope.sub("routing")
    k = g.const([spec.top_k])
    if spec.router_order == "topk_softmax":
        values, indices = g.ops("TopK", [logits, k], route_scope, 2, axis=-1)
        return g.op("Softmax", [values], route_scope, axis=-1), indices
    probs = g.op("Softmax", [logits], route_scope, axis=-1)
    values, indices = g.ops("TopK", [probs, k], route_scope, 2, axis=-1)
    if spec.normalize_routing_weights:
        if spec.renormalisation == "l1":
            total = g.op("ReduceL1", [values, g.const([-1])], route_scope, keepdims=1)
        else:
            total = g.op("ReduceSum", [values, g.const([-1])], route_scope, keepdims=1)
        if spec.renormalisation == "clamped_sum":
            total = g.op("Clip", [total, g.float_const(1e-12)], route_scope)
        values = g.op("Div", [values, total], route_scope)
    return values, indices


def _moe_fused(g: _Graph, x: str, layer: int) -> str:
    """com.microsoft MoE: router MatMul -> Reshape [-1, experts] -> MoE with stacked expert weights."""
    spec = g.spec
    scope = _Scope(layer, "moe")
    router = g.op("Reshape", [_router_logits(g, x, scope), g.const([-1, spec.experts])], scope.sub("router"))
    fc1_rows, inter = spec.fused_moe_fc1_rows, spec.moe_intermediate
    experts = scope.sub("experts")
    fc1, fc2, fc3 = _stacked_expert_weights(g, layer)
    inputs = [
        x, router,
        g.weight(experts.sub("gate_up_proj"), "weight", (spec.experts, fc1_rows, spec.hidden), data=fc1),
        g.weight(experts.sub("gate_up_proj"), "bias", (spec.experts, fc1_rows), fill=0.0),
        g.weight(experts.sub("down_proj"), "weight", (spec.experts, spec.hidden, inter), data=fc2),
        g.weight(experts.sub("down_proj"), "bias", (spec.experts, spec.hidden), fill=0.0),
    ]
    if fc3 is not None:
        inputs.append(g.weight(experts.sub("up_proj"), "weight", (spec.experts, inter, spec.hidden), data=fc3))
    return g.op("MoE", inputs, scope, domain=MS_DOMAIN, **_moe_attributes(spec))


def _expert_key(layer: int, expert: int) -> tuple:
    return (layer, "expert", expert)


def _stacked_expert_weights(g: _Graph, layer: int):
    """data() callables for MoE's fc1 [E, rows, hidden], fc2 [E, hidden, inter] and fc3 (swiglu_fusion=0, else None),
    built from the same logical gate/up/down parameters as the unfused loops' per-expert MatMuls.

    swiglu_fusion=1 interleaves gate and up rows (g0, u0, g1, u1, ...), 2 concatenates them; other
    activations use the gate parameters alone as fc1.
    """
    spec = g.spec
    hidden, inter = spec.hidden, spec.moe_intermediate

    def per_expert(name: str, shape) -> np.ndarray:  # [E, out, in]: MoE stores W transposed
        return np.stack([g.param(_expert_key(layer, e) + (name,), shape).T for e in range(spec.experts)])

    def fc1() -> np.ndarray:
        gate = per_expert("gate", (hidden, inter))
        if spec.moe_activation != "swiglu" or spec.swiglu_fusion == 0:
            return gate
        up = per_expert("up", (hidden, inter))
        if spec.swiglu_fusion == 1:
            return np.stack([gate, up], axis=2).reshape(spec.experts, 2 * inter, hidden)
        return np.concatenate([gate, up], axis=1)

    def fc2() -> np.ndarray:
        return per_expert("down", (inter, hidden))

    def fc3() -> np.ndarray:
        return per_expert("up", (hidden, inter))

    needs_fc3 = spec.moe_activation == "swiglu" and spec.swiglu_fusion == 0
    return fc1, fc2, (fc3 if needs_fc3 else None)


def _moe_quantized(g: _Graph, x: str, layer: int) -> str:
    """com.microsoft QMoE: uint8-packed int4/int8 expert weights with per-column (or per-block) scales."""
    spec = g.spec
    scope = _Scope(layer, "moe")
    router = g.op("Reshape", [_router_logits(g, x, scope), g.const([-1, spec.experts])], scope.sub("router"))
    pack = 8 // spec.qmoe_bits
    block = spec.qmoe_block_size
    experts = scope.sub("experts")

    def quantized(module: str, rows: int, cols: int) -> tuple[str, str]:
        weight = g.weight(experts.sub(module), "qweight", (spec.experts, rows, cols // pack), dtype=np.uint8)
        scale_shape = (spec.experts, rows, cols // block) if block else (spec.experts, rows)
        scales = g.weight(experts.sub(module), "scales", scale_shape, fill=_quant_scale(spec.qmoe_bits))
        return weight, scales

    fc1, fc1_scales = quantized("gate_up_proj", spec.fused_moe_fc1_rows, spec.hidden)
    fc2, fc2_scales = quantized("down_proj", spec.hidden, spec.moe_intermediate)
    inputs = [x, router, fc1, fc1_scales, "", fc2, fc2_scales, ""]
    if spec.moe_activation == "swiglu" and spec.swiglu_fusion == 0:
        inputs += list(quantized("up_proj", spec.moe_intermediate, spec.hidden))
    return g.op(
        "QMoE", inputs, scope, domain=MS_DOMAIN, expert_weight_bits=spec.qmoe_bits,
        block_size=block or None, **_moe_attributes(spec),
    )


def _moe_attributes(spec: ModelSpec) -> dict:
    attrs = {
        "k": spec.top_k,
        "activation_type": spec.moe_activation,
        "activation_alpha": 1.0,  # explicit, as genai writes for Qwen (1.0 / 0.0); GPT-OSS uses 1.702 / 1.0
        "activation_beta": 0.0,
        "normalize_routing_weights": spec.normalize_routing_weights,
        "use_sparse_mixer": 0,
    }
    if spec.moe_activation == "swiglu":
        attrs["swiglu_fusion"] = spec.swiglu_fusion
    return attrs


def _moe_dense_loop(g: _Graph, x: str, layer: int) -> str:
    """Every expert on every token, weighted by a ScatterElements routing matrix (torch dense-loop export)."""
    spec = g.spec
    scope = _Scope(layer, "moe")
    logits = _router_logits(g, x, scope)  # [batch, seq, experts]
    weights, indices = _top_k_routing(g, logits, scope)
    route_scope = scope.sub("routing")
    zeros = g.op(
        "ConstantOfShape", [g.op("Shape", [logits], route_scope)], route_scope,
        value=helper.make_tensor("value", spec.onnx_dtype, [1], [0]),
    )
    routing = g.op("ScatterElements", [zeros, indices, weights], route_scope, axis=-1)  # [batch, seq, experts]
    total = None
    for e in range(spec.experts):
        expert = scope.sub(f"experts.{e}")
        out = _swiglu_mlp(g, x, expert, _expert_key(layer, e), spec.hidden, spec.moe_intermediate, projections=_plain_matmul)
        weight = g.op("Slice", [routing, g.const([e]), g.const([e + 1]), g.const([-1])], expert)
        out = g.op("Mul", [out, weight], expert)
        total = out if total is None else g.op("Add", [total, out], expert)
    return total


def _moe_gather_loop(g: _Graph, x: str, layer: int) -> str:
    """Token dispatch per expert (transformers' eager loop): Equal/NonZero -> Gather tokens -> expert -> ScatterND add."""
    spec = g.spec
    scope = _Scope(layer, "moe")
    tokens = g.op("Reshape", [x, g.const([-1, spec.hidden])], scope)  # [tokens, hidden]
    weights, indices = _top_k_routing(g, _router_logits(g, tokens, scope), scope)  # [tokens, top_k]
    total = g.op(
        "ConstantOfShape", [g.op("Shape", [tokens], scope)], scope,
        value=helper.make_tensor("value", spec.onnx_dtype, [1], [0]),
    )
    for e in range(spec.experts):
        expert = scope.sub(f"experts.{e}")
        hits = g.op("NonZero", [g.op("Equal", [indices, g.const(e)], expert)], expert)  # [2, hits]: (token, slot)
        token_ids = g.op("Gather", [hits, g.const(0)], expert, axis=0)
        hit_weights = g.op("GatherND", [weights, g.op("Transpose", [hits], expert, perm=[1, 0])], expert)
        chosen = g.op("Gather", [tokens, token_ids], expert, axis=0)
        out = _swiglu_mlp(g, chosen, expert, _expert_key(layer, e), spec.hidden, spec.moe_intermediate, projections=_plain_matmul)
        out = g.op("Mul", [out, g.op("Unsqueeze", [hit_weights, g.const([1])], expert)], expert)
        scatter_at = g.op("Unsqueeze", [token_ids, g.const([1])], expert)
        total = g.op("ScatterND", [total, scatter_at, out], expert, reduction="add")
    return g.op("Reshape", [total, g.op("Shape", [x], scope)], scope)


def _shared_expert(g: _Graph, x: str, layer: int, routed: str) -> str:
    """Qwen3.5-MoE's shared expert: routed + sigmoid(x @ gate) * mlp(x).

    With fused MoE/QMoE the combine is com.microsoft GatedAdd (onnxruntime-genai 0.18), otherwise Mul + Add.
    """
    spec = g.spec
    scope = _Scope(layer, "moe/shared_expert")
    shared = _swiglu_mlp(g, x, scope, (layer, "shared_expert"), spec.hidden, spec.moe_intermediate)
    gate_scope = _Scope(layer, "moe/shared_expert_gate")
    gate = g.op("Sigmoid", [g.op("MatMul", [x, g.weight(gate_scope, "weight", (spec.hidden, 1))], gate_scope)], gate_scope)
    if spec.moe in ("fused", "qmoe"):
        return g.op("GatedAdd", [routed, shared, gate], _Scope(layer, "moe"), domain=MS_DOMAIN)
    return g.op("Add", [routed, g.op("Mul", [shared, gate], scope)], scope)


def _feed_forward(g: _Graph, x: str, layer: int) -> str:
    spec = g.spec
    if spec.moe == "dense":
        return _swiglu_mlp(g, x, _Scope(layer, "mlp"), (layer, "mlp"), spec.hidden, spec.dense_intermediate)
    routed = {
        "fused": _moe_fused,
        "qmoe": _moe_quantized,
        "dense_loop": _moe_dense_loop,
        "gather_loop": _moe_gather_loop,
    }[spec.moe](g, x, layer)
    return _shared_expert(g, x, layer, routed) if spec.shared_expert else routed


# =================================================================================================
# Model
# =================================================================================================


def _declare_io(g: _Graph) -> None:
    """Graph inputs and outputs, named and shaped like onnxruntime-genai's."""
    spec = g.spec
    dtype = spec.onnx_dtype
    g.add_input("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
    g.add_input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
    if spec.position_ids == "input":
        g.add_input("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
    elif spec.position_ids == "input_3d":
        g.add_input("position_ids", TensorProto.INT64, [3, "batch_size", "sequence_length"])
    g.add_output("logits", dtype, ["batch_size", "sequence_length", spec.vocab])
    conv_shape = ["batch_size", spec.linear_conv_dim, spec.linear_conv_kernel - 1]
    recurrent_shape = ["batch_size", spec.linear_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim]
    for i, kind in enumerate(spec.resolved_layer_types):
        if kind == "linear_attention":
            for state, shape in (("conv", conv_shape), ("recurrent", recurrent_shape)):
                g.add_input(f"past.{i}.{state}", dtype, shape)
                g.add_output(f"present.{i}.{state}", dtype, shape)
        elif spec.has_kv_cache:
            for which in ("key", "value"):
                g.add_input(f"past_key_values.{i}.{which}", dtype, ["batch_size", spec.kv_num_heads, "past_sequence_length", spec.head_dim])
                g.add_output(f"present.{i}.{which}", dtype, ["batch_size", spec.kv_num_heads, "total_sequence_length", spec.head_dim])


def _embed(g: _Graph) -> str:
    scope = _Scope(None, "embed_tokens")
    table = g.weight(scope, "weight", (g.spec.vocab, g.spec.hidden))
    return g.op("Gather", [table, "input_ids"], scope, axis=0)


def _prompt_or_decode_branch(g: _Graph, ctx: _Context, x: str) -> str:
    """An If node (prompt vs. decode step) around the embeddings: a control-flow node costs nothing to run
    but blocks CUDA graph capture."""
    scope = _Scope(None, "prompt_branch")
    seq_len, _, _ = ctx.lengths()
    is_prompt = g.op("Greater", [seq_len, g.const(1)], scope)

    def branch(label: str) -> onnx.GraphProto:
        name = g.names.node(scope.sub(label), "Identity")
        out = g.names.value(name, 0)
        node = helper.make_node("Identity", [x], [out], name=name)
        return helper.make_graph([node], f"{label}_branch", [], [helper.make_tensor_value_info(out, g.spec.onnx_dtype, None)])

    return g.op("If", [is_prompt], scope, then_branch=branch("prompt"), else_branch=branch("decode"))


def build_model(spec: ModelSpec) -> onnx.ModelProto:
    """Build the decoder graph that `spec` describes (see the module docstring)."""
    g = _Graph(spec)
    ctx = _Context(g)
    _declare_io(g)

    hidden = _embed(g)
    if spec.control_flow:
        hidden = _prompt_or_decode_branch(g, ctx, hidden)
    normed, residual = _add_and_norm(g, hidden, None, _Scope(0, "input_layernorm"))
    for i, kind in enumerate(spec.resolved_layer_types):
        if kind == "linear_attention":
            mixed = _linear_attention(g, i, normed)
        else:
            mixed = _attention(g, ctx, i, normed, spec.sliding_window if kind == "sliding_attention" else None)
        if spec.residual == "sandwich":
            mixed = _rms_norm(g, mixed, _Scope(i, "post_attention_norm"), spec.hidden)
        normed, residual = _residual_step(g, mixed, residual, normed, _Scope(i, "post_attention_layernorm"))
        ffn = _feed_forward(g, normed, i)
        if spec.residual == "sandwich":
            ffn = _rms_norm(g, ffn, _Scope(i, "post_feedforward_norm"), spec.hidden)
        next_norm = _Scope(i + 1, "input_layernorm") if i + 1 < spec.layers else _Scope(None, "final_norm_layernorm")
        normed, residual = _residual_step(g, ffn, residual, normed, next_norm)

    _linear(g, normed, _Scope(None, "lm_head"), spec.hidden, spec.vocab, output="logits")

    graph = helper.make_graph(g.nodes, "main_graph", g.inputs, g.outputs, initializer=g.initializers)
    opset = OPSET_WITH_ONNX_ATTENTION if spec.attention == "onnx_attention" else OPSET
    model = helper.make_model(
        graph,
        ir_version=IR_VERSION,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS_DOMAIN, 1)],
        producer_name="ortgate-tests.qwen_moe",
    )
    helper.set_model_props(model, {SPEC_METADATA_KEY: spec.to_json()})
    return model


# =================================================================================================
# Saving, feeds, counting
# =================================================================================================


def _has_stub_weights(model: onnx.ModelProto) -> bool:
    return any(
        t.data_location == TensorProto.EXTERNAL and not t.HasField("raw_data") for t in model.graph.initializer
    )


def save_model(model: onnx.ModelProto, path, *, external_data: bool = False, drop_data: bool = False) -> Path:
    """Write `model` to `path` (parents created); return the path.

    external_data: weights go to "<file name>.data" beside the model (also when the model's spec says
    external_data=True). drop_data: delete that .data file afterwards, leaving a model whose initializers
    point at a missing file - a linter must still lint it. Models built with weights="external_stub"
    are written as they are: their initializers already point at spec.stub_location and have no bytes.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    spec = spec_from_model(model)
    external_data = external_data or bool(spec and spec.external_data)
    data_path = path.with_name(path.name + ".data")
    if _has_stub_weights(model) or not external_data:
        onnx.save_model(model, path)
    else:
        if data_path.exists():
            data_path.unlink()  # onnx appends to an existing data file
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # onnx converts the proto in place; keep the caller's model intact
        onnx.save_model(copy, path, save_as_external_data=True, all_tensors_to_one_file=True, location=data_path.name)
    if drop_data and data_path.exists():
        data_path.unlink()
    return path


_DIM_DEFAULTS = ("batch_size", "sequence_length", "past_sequence_length", "total_sequence_length")


def make_feeds(model_or_path, *, batch: int = 1, seq: int = 4, past: int = 0) -> dict[str, np.ndarray]:
    """Inputs for one forward pass, from the graph signature: random token ids, an all-ones mask,
    small random past KV and linear-attention states. `past` is ignored (0) when the graph has no
    past_sequence_length dim (kv_cache=False)."""
    if isinstance(model_or_path, onnx.ModelProto):
        model = model_or_path
    else:
        model = onnx.load(str(model_or_path), load_external_data=False)
    if not any(d.dim_param == "past_sequence_length" for v in model.graph.input for d in v.type.tensor_type.shape.dim):
        past = 0  # no KV cache inputs: the mask covers the new tokens only
    dims = {"batch_size": batch, "sequence_length": seq, "past_sequence_length": past, "total_sequence_length": past + seq}
    rng = np.random.default_rng(0)
    vocab = _vocab_size(model)
    initializer_names = {t.name for t in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializer_names:
            continue
        tensor_type = value.type.tensor_type
        shape = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value"):
                shape.append(dim.dim_value)
            elif dim.dim_param in dims:
                shape.append(dims[dim.dim_param])
            else:
                raise ValueError(f"input {value.name}: unknown symbolic dim {dim.dim_param!r}")
        np_type = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones(shape, dtype=np_type)
        elif value.name == "position_ids":
            feeds[value.name] = np.broadcast_to(np.arange(past, past + seq, dtype=np_type), shape).copy()
        elif np.issubdtype(np_type, np.floating):
            feeds[value.name] = (rng.standard_normal(size=shape) * 0.1).astype(np_type)
        else:
            feeds[value.name] = np.zeros(shape, dtype=np_type)
    return feeds


def _vocab_size(model: onnx.ModelProto) -> int:
    """Rows of the embedding table that input_ids index (works without loading weight bytes)."""
    shapes = {t.name: t.dims for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] == "input_ids":
            dims = shapes.get(node.input[0])
            if dims:
                return int(dims[0])
    return 2


def op_counts(model: onnx.ModelProto) -> Counter:
    """Node count per (domain, op_type) of the main graph; the ONNX domain is "" (also for "ai.onnx")."""
    return Counter(("" if n.domain == "ai.onnx" else n.domain, n.op_type) for n in model.graph.node)
