"""Inputs for one decode (or prefill) step, synthesised from the model's signature: LLM-aware, weights never read.

Every symbolic dim gets a value: the policy's `runner.dims` first, then `session.free_dimension_overrides`, then
its role in an LLM's interface (batch, query length, past length, total length, sliding-window cache, head size;
ortgate.knowledge.dims, the classifier the session rules use too), taken from `runner:` (batch_size,
sequence_length, past_sequence_length, max_sequence_length). A dim named by an expression of other dims
(`past_sequence_length + sequence_length`) is computed from its terms. A dim none of these decide is an input error
naming the input and the dim.

Values follow what an LLM runtime feeds: token ids inside the vocabulary (rows of the embedding initializer,
read from its shape only), an all-ones attention mask over past + new tokens, position ids continuing after the
past (also Qwen3.5's [3, batch, seq] layout), GQA's seqlens_k / total_sequence_length, and small seeded random
KV caches and linear-attention conv / recurrent states.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import TensorProto

from ortgate.config.genai import GenaiConfig
from ortgate.config.policy import Policy
from ortgate.cost.shapes import StepShape
from ortgate.errors import InputError
from ortgate.findings import Location
from ortgate.graph.index import Graph
from ortgate.graph.patterns.decoder import token_ids_input
from ortgate.knowledge.dims import dim_role, dim_terms, dim_value, parse_dim
from ortgate.runner.settings import RunnerSettings

SEED = 0
STATE_SCALE = 0.1  # random KV caches and recurrent states: small values, like a real cache's scale

STEP_ROLES = {"batch": "batch_size", "query": "sequence_length", "past": "past_sequence_length"}


@dataclass(frozen=True)
class InputSpec:
    name: str
    elem_type: int  # onnx.TensorProto data type
    shape: tuple[int | str | None, ...] | None


@dataclass
class Feeds:
    arrays: dict[str, np.ndarray]  # bfloat16 inputs hold their bit patterns as uint16
    elem_types: dict[str, int]
    kinds: dict[str, str]  # input -> token_ids | attention_mask | position_ids | seqlens_k | ... | state | zeros
    dims: dict[str, int]
    step: StepShape

    def describe(self) -> dict[str, dict[str, Any]]:
        return {name: {"shape": list(a.shape), "dtype": _dtype_label(self.elem_types[name]), "kind": self.kinds[name]}
                for name, a in self.arrays.items()}


def graph_signature(graph: Graph) -> list[InputSpec]:
    specs = []
    for info in graph.inputs:
        elem = TensorProto.DataType.Value(info.dtype.upper()) if info.dtype else TensorProto.UNDEFINED
        specs.append(InputSpec(info.name, elem, info.shape))
    return specs


_ORT_TYPE = re.compile(r"^tensor\((\w+)\)$")


def session_signature(session) -> list[InputSpec]:
    """The session's inputs after free-dimension overrides (pinned dims are ints there)."""
    specs = []
    for arg in session.get_inputs():
        match = _ORT_TYPE.match(arg.type or "")
        name = match.group(1).upper() if match else "UNDEFINED"
        name = {"FLOAT32": "FLOAT", "FLOAT64": "DOUBLE"}.get(name, name)
        elem = TensorProto.DataType.Value(name) if name in TensorProto.DataType.keys() else TensorProto.UNDEFINED
        shape = None if arg.shape is None else tuple(d if isinstance(d, int) else (d or None) for d in arg.shape)
        specs.append(InputSpec(arg.name, elem, shape))
    return specs


# ---- model facts read from the graph (metadata only) ---------------------------------------------------------

_PASS_THROUGH = {"Cast", "DequantizeLinear", "Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze"}


def _initializer_dims(graph: Graph, value: str, depth: int = 4) -> tuple[int, ...] | None:
    """Dims of the initializer behind `value`, through a few shape-preserving ops (Cast, DequantizeLinear, ...)."""
    for _ in range(depth):
        init = graph.initializers.get(value)
        if init is not None:
            return init.dims
        producer = graph.producer(value)
        if producer is None or producer.op_type not in _PASS_THROUGH or not producer.inputs:
            return None
        value = producer.inputs[0]
    return None


def token_inputs(graph: Graph, genai: GenaiConfig | None = None) -> dict[str, int]:
    """Integer inputs used as embedding indices -> vocabulary size (rows of the embedding table).

    An `input_ids` whose embedding is not an initializer gets the vocabulary from genai_config.json, else from
    the last dim of a `logits` output.
    """
    found: dict[str, int] = {}
    for info in graph.inputs:
        if info.dtype not in ("int64", "int32"):
            continue
        for node in graph.consumers(info.name):
            if node.op_type in ("Gather", "GatherBlockQuantized") and node.input(1) == info.name:
                dims = _initializer_dims(graph, node.input(0))
                if dims and len(dims) >= 2 and dims[0] > 0:
                    found[info.name] = int(dims[0])
                    break
        if info.name not in found and "input_ids" in info.name.lower():
            vocab = _declared_vocabulary(graph, genai)
            if vocab:
                found[info.name] = vocab
    return found


def _declared_vocabulary(graph: Graph, genai: GenaiConfig | None) -> int | None:
    if genai is not None:
        value = genai.data["model"].get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    for out in graph.outputs:
        if "logits" in out.name and out.shape and isinstance(out.shape[-1], int) and out.shape[-1] > 0:
            return out.shape[-1]
    return None


def sliding_window(graph: Graph, genai: GenaiConfig | None) -> int | None:
    windows = [int(n.attr("local_window_size", -1)) for n in graph.by_op("com.microsoft", "GroupQueryAttention")]
    windows = [w for w in windows if w > 0]
    if windows:
        return max(windows)
    window = genai.decoder.get("sliding_window") if genai else None
    if isinstance(window, dict) and isinstance(window.get("window_size"), int):
        return int(window["window_size"])
    return None


def head_size(policy: Policy | None, genai: GenaiConfig | None) -> int | None:
    if genai is not None and genai.decoder_int("head_size"):
        return genai.decoder_int("head_size")
    value = policy.get("model", "head_size") if policy else None
    return int(value) if isinstance(value, int) else None


# ---- dims --------------------------------------------------------------------------------------------------


def graph_dim_roles(graph: Graph) -> dict[str, str]:
    """The roles of the symbolic dims whose names say none (transformers' exporter names them s54, s70, ...), read
    from the input and axis they size: the token input's [batch, sequence], a KV-cache input's [batch, heads, past,
    head size], the attention mask's [batch, past + new tokens] (the new tokens alone without a cache), position
    ids' [batch, sequence]. A dim read with two different roles gets none (the runner then asks for a value)."""
    found: dict[str, set[str]] = {}

    def note(dim, role: str) -> None:
        if isinstance(dim, str) and dim and parse_dim(dim) is None and dim_role(dim) is None:
            found.setdefault(dim, set()).add(role)

    tokens = token_ids_input(graph)
    if tokens is not None and tokens.shape is not None and len(tokens.shape) == 2:
        note(tokens.shape[0], "batch")
        note(tokens.shape[1], "query")
    cached = False
    for info in graph.inputs:
        name, shape = info.name.lower(), info.shape
        if shape is None or info is tokens:
            continue
        if name.startswith("past") and len(shape) == 4 and info.dtype not in ("int64", "int32"):
            note(shape[0], "batch")
            note(shape[2], "past")
            cached = True
    for info in graph.inputs:
        name, shape = info.name.lower(), info.shape
        if shape is None or len(shape) != 2 or info is tokens:
            continue
        if "attention_mask" in name:
            note(shape[0], "batch")
            note(shape[1], "total" if cached else "query")
        elif "position_ids" in name:
            note(shape[0], "batch")
            note(shape[1], "query")
    return {dim: roles.pop() for dim, roles in found.items() if len(roles) == 1}



def resolve_dims(signature: list[InputSpec], settings: RunnerSettings, overrides: dict[str, tuple[int, Location]],
                 *, window: int | None, head: int | None, policy_file: str | None,
                 roles: dict[str, str] | None = None) -> tuple[dict[str, int], StepShape]:
    """A value for every symbolic dim of the inputs, and the step shape they describe. `roles`: the role of dims
    whose names say none, read from the graph (which input and axis they size)."""
    read_roles = roles or {}

    def role_of(dim: str) -> str | None:
        return read_roles.get(dim) or dim_role(dim)

    symbolic: dict[str, str] = {}  # dim -> first input using it (for messages)
    for spec in signature:
        for dim in spec.shape or ():
            if isinstance(dim, str):
                symbolic.setdefault(dim, spec.name)

    step = {"batch": settings.batch_size, "query": settings.sequence_length, "past": settings.past_sequence_length}
    step_source: dict[str, str] = {}
    for dim in symbolic:
        role = role_of(dim)
        if role not in step:
            continue
        pinned = _explicit_value(dim, settings, overrides)
        if pinned is None:
            continue
        value, source = pinned
        key = STEP_ROLES[role]
        if key in settings.explicit and getattr(settings, key) != value:
            loc = settings.where(key)
            raise InputError(f"runner.{key} is {getattr(settings, key)} but {source} pins {dim!r} to {value}: "
                             "the session would reject the inputs; make them agree",
                             loc.file if loc else policy_file, line=loc.line if loc else None)
        if role in step_source and step[role] != value:
            raise InputError(f"dims {step_source[role]!r} and {dim!r} are both the {key} but are pinned to "
                             f"{step[role]} and {value}", policy_file)
        step[role], step_source[role] = value, dim
    shape = StepShape(step["batch"], step["query"], step["past"] + step["query"])

    def role_value(dim: str) -> int | None:
        role = role_of(dim)
        if role == "batch":
            return shape.batch
        if role == "query":
            return shape.new_tokens
        if role == "past":
            return shape.past
        if role == "total":
            return shape.context
        if role == "sliding_past":
            return window  # a sliding-window KV cache holds exactly the window (GQA sliding_window_cache)
        if role == "head":
            return head
        if role == "max":
            return settings.max_sequence_length
        return None

    dims: dict[str, int] = {}
    expressions = [d for d in symbolic if parse_dim(d) is not None]
    for dim, first_input in symbolic.items():
        if dim in expressions:
            continue
        pinned = _explicit_value(dim, settings, overrides)
        found = pinned[0] if pinned is not None else role_value(dim)
        if found is None and dim.strip().isdigit():
            found = int(dim)  # a dim named by a number (transformers' exporter: a cache's head axes "2", "16")
        if found is None:
            role = role_of(dim)
            hint = {"sliding_past": " (no GroupQueryAttention local_window_size in the graph)",
                    "head": " (no head_size in genai_config.json or the policy's model block)",
                    "max": " (set runner.max_sequence_length)"}.get(role or "", "")
            raise InputError(f"input {first_input!r}: cannot choose a value for dim {dim!r}{hint}; "
                             f"set runner.dims.{dim} in the policy", policy_file)
        dims[dim] = int(found)

    # A dim named by an expression ("past_sequence_length + sequence_length") is its terms' arithmetic.
    def term_value(term: str) -> int | None:
        if term in dims:
            return dims[term]
        pinned = _explicit_value(term, settings, overrides)
        return pinned[0] if pinned is not None else role_value(term)

    for dim in expressions:
        first_input = symbolic[dim]
        derived = dim_value(dim, term_value)
        pinned = _explicit_value(dim, settings, overrides)
        if pinned is not None:
            if derived is not None and derived != pinned[0] and all(t in dims for t in dim_terms(dim)):
                terms = ", ".join(f"{t} = {dims[t]}" for t in dim_terms(dim))
                raise InputError(f"{pinned[1]} pins {dim!r} to {pinned[0]} but its terms give {derived} ({terms}): "
                                 "the session would reject the inputs; pin the terms instead", policy_file)
            dims[dim] = pinned[0]
            continue
        if derived is None:
            unknown = ", ".join(repr(t) for t in dim_terms(dim) if term_value(t) is None)
            raise InputError(f"input {first_input!r}: cannot choose a value for dim {dim!r} (no value for "
                             f"{unknown}); set runner.dims.{dim} in the policy", policy_file)
        dims[dim] = int(derived)
    return dims, shape


def _explicit_value(dim: str, settings: RunnerSettings,
                    overrides: dict[str, tuple[int, Location]]) -> tuple[int, str] | None:
    in_dims = settings.dims.get(dim)
    in_overrides = overrides.get(dim)
    if in_dims is not None and in_overrides is not None and int(in_dims) != in_overrides[0]:
        loc = settings.where(f"dims.{dim}") or in_overrides[1]
        raise InputError(f"runner.dims.{dim} is {in_dims} but session.free_dimension_overrides pins it to "
                         f"{in_overrides[0]}", loc.file, line=loc.line)
    if in_dims is not None:
        return int(in_dims), f"runner.dims.{dim}"
    if in_overrides is not None:
        return in_overrides[0], "session.free_dimension_overrides"
    return None


# ---- values ------------------------------------------------------------------------------------------------


MAX_FEED_BYTES = 16 * 2**30  # one synthesised input; a hostile shape must not allocate (or overcommit) more


def synthesize(signature: list[InputSpec], dims: dict[str, int], step: StepShape, vocab: dict[str, int],
               *, policy_file: str | None = None, seed: int = SEED) -> Feeds:
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    elem_types: dict[str, int] = {}
    kinds: dict[str, str] = {}
    for spec in signature:
        shape = _concrete_shape(spec, dims, policy_file)
        kind, array = _value(spec, shape, step, vocab, rng, policy_file)
        arrays[spec.name], elem_types[spec.name], kinds[spec.name] = array, spec.elem_type, kind
    return Feeds(arrays, elem_types, kinds, dims, step)


def _concrete_shape(spec: InputSpec, dims: dict[str, int], policy_file: str | None) -> tuple[int, ...]:
    if spec.shape is None:
        raise InputError(f"input {spec.name!r} has no shape in the model: cannot synthesise it", policy_file)
    out = []
    for axis, dim in enumerate(spec.shape):
        if isinstance(dim, int):
            out.append(dim)
        elif isinstance(dim, str) and dim in dims:
            out.append(dims[dim])
        else:
            raise InputError(f"input {spec.name!r}: axis {axis} has neither a size nor a dim name; "
                             "cannot synthesise it", policy_file)
    numel = 1
    for d in out:
        numel *= d
    if any(d < 0 for d in out) or numel * 8 > MAX_FEED_BYTES:  # 8: the widest element synthesised
        raise InputError(f"input {spec.name!r} would have shape {list(out)}: "
                         f"{'a negative size' if any(d < 0 for d in out) else 'more than 16 GiB'}; "
                         "set smaller runner dims in the policy", policy_file)
    return tuple(out)


def _value(spec: InputSpec, shape: tuple[int, ...], step: StepShape, vocab: dict[str, int],
           rng: np.random.Generator, policy_file: str | None) -> tuple[str, np.ndarray]:
    name = spec.name.lower()
    elem = spec.elem_type
    if elem in (TensorProto.STRING, TensorProto.UNDEFINED) or elem not in _NUMPY_TYPES:
        raise InputError(f"input {spec.name!r} has type {_dtype_label(elem)}: cannot synthesise it", policy_file)
    np_type = _NUMPY_TYPES[elem]
    is_int = np.issubdtype(np_type, np.integer)
    if spec.name in vocab and is_int:
        return "token_ids", rng.integers(0, vocab[spec.name], size=shape).astype(np_type)
    if "attention_mask" in name or name == "mask":
        if np_type is np.bool_ or is_int:
            return "attention_mask", np.ones(shape, dtype=np_type)
        return "attention_mask", _float_array(np.zeros(shape, dtype=np.float32), elem)  # additive: 0 attends
    if "position_ids" in name and is_int:
        if not shape:
            return "position_ids", np.array(step.past, dtype=np_type)
        positions = np.arange(step.past, step.past + shape[-1], dtype=np_type)
        return "position_ids", np.broadcast_to(positions, shape).copy()
    if "seqlens_k" in name and is_int:
        return "seqlens_k", np.full(shape, step.context - 1, dtype=np_type)
    if "total_sequence_length" in name and is_int:
        return "total_sequence_length", np.full(shape, step.context, dtype=np_type)
    if np.issubdtype(np_type, np.floating) or elem == TensorProto.BFLOAT16:
        values = (rng.standard_normal(size=shape) * STATE_SCALE).astype(np.float32)
        return "state", _float_array(values, elem)
    return "zeros", np.zeros(shape, dtype=np_type)


def _float_array(values: np.ndarray, elem: int) -> np.ndarray:
    if elem == TensorProto.BFLOAT16:
        bits = values.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    return values.astype(_NUMPY_TYPES[elem])


_NUMPY_TYPES: dict[int, Any] = {
    TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.DOUBLE: np.float64,
    TensorProto.BFLOAT16: np.uint16, TensorProto.INT64: np.int64, TensorProto.INT32: np.int32,
    TensorProto.INT16: np.int16, TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8,
    TensorProto.UINT16: np.uint16, TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64,
    TensorProto.BOOL: np.bool_,
}


def _dtype_label(elem: int) -> str:
    try:
        return TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return f"type #{elem}"


def written_positions(graph: Graph, step: StepShape) -> dict[str, tuple[int, int]]:
    """KV-cache outputs -> (sequence axis, positions this step wrote: past + new tokens), from the outputs' declared
    dims (an axis whose dim is a total length, e.g. total_sequence_length or total_sliding_length)."""
    out: dict[str, tuple[int, int]] = {}
    for info in graph.outputs:
        for axis, dim in enumerate(info.shape or ()):
            if isinstance(dim, str) and dim_role(dim) == "total":
                out[info.name] = (axis, step.context)
                break
    return out
