"""Execution-provider option catalogs and ONNX Runtime / onnxruntime-genai facts, as data.

provider_options.json: for CUDA, TensorRT, CANN and CPU, every option key the provider accepts, with its type,
default, allowed values and a one-line description (hand-curated from the ORT C++ sources named in each provider's
"source", checked against the onnxruntime-gpu 1.31.1 binaries).
ort_facts.json: graph optimization levels, known session/run config keys, provider names as onnxruntime-genai
writes them in genai_config.json.

    cat = provider_catalog("cuda")                  # or "CUDAExecutionProvider"
    cat.option("cuda_graph_enable_partial")         # None: not a CUDA option
    cat.suggest("enable_cuda_graphs")               # "enable_cuda_graph"
    cat.option("enable_cuda_graph").validate("yes") # 'expects a boolean (0/1/true/false/True/False), got "yes"'
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ortgate.knowledge.facts import ORT_FACTS, ConfigKey, CpuFallback, CudaGraphCapture, GraphCapture, OrtFacts
from ortgate.knowledge.loader import KnowledgeError, build, read_json
from ortgate.knowledge.provider_names import TRT_RTX

PROVIDER_OPTIONS_JSON = Path(__file__).with_name("provider_options.json")

OPTION_TYPES = ("bool", "int", "size", "float", "enum", "string", "path")
_INT_RE = re.compile(r"^[+-]?[0-9]+$")
_SIZE_RE = re.compile(r"^\+?[0-9]+$")
_INT32 = (-(2**31), 2**31 - 1)
_SIZE_MAX = 2**64 - 1


def _as_option_string(value: Any) -> str | None:
    """How a value reaches ORT: Python's InferenceSession str()s provider option values."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    return None


def _quote(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


@dataclass(frozen=True)
class ProviderOption:
    """One provider option: its type, default, values and description."""

    provider: str
    key: str
    type: str  # one of OPTION_TYPES
    default: Any
    description: str
    values: tuple[str, ...] = ()  # allowed values of an enum
    min: int | None = None
    max: int | None = None
    bool_values: tuple[str, ...] = ("0", "1", "true", "false", "True", "False")
    python_api: bool = True  # False: the Python API rejects the key (C/C++ API only)
    validated_by: str = "ort"  # "ort", or the backend that checks the value instead (ORT passes it on unchecked)
    note: str | None = None
    deprecated_since: str | None = None  # the ORT release that deprecated it
    deprecated_note: str | None = None

    @property
    def default_string(self) -> str:
        """The default as a string this option accepts ("0"/"1" for booleans, "True"/"False" where only those
        parse, e.g. TensorRT options through the Python API)."""
        if isinstance(self.default, bool):
            if "1" in self.bool_values:
                return "1" if self.default else "0"
            return "True" if self.default else "False"
        return str(self.default)

    @property
    def default_words(self) -> str:
        """The default for a message: "default on" / "default off" for booleans, else "default '<value>'"."""
        if isinstance(self.default, bool):
            return "default on" if self.default else "default off"
        return f"default {self.default_string!r}"

    def validate(self, value: Any) -> str | None:
        """None if ORT would accept `value` for this option, else a short reason."""
        text = _as_option_string(value)
        if text is None:
            return f"expects a string value, got {type(value).__name__} {value!r}"
        t = self.type
        if t == "bool":
            if text in self.bool_values:
                return None
            return f"expects a boolean ({'/'.join(self.bool_values)}), got {_quote(value)}"
        if t in ("int", "size"):
            if isinstance(value, bool) or not (_SIZE_RE if t == "size" else _INT_RE).match(text):
                kind = "a non-negative integer" if t == "size" else "an integer"
                return f"expects {kind}, got {_quote(value)}"
            n = int(text)
            lo, hi = (0, _SIZE_MAX) if t == "size" else _INT32
            lo = lo if self.min is None else max(lo, self.min)
            hi = hi if self.max is None else min(hi, self.max)
            if n < lo or n > hi:
                return f"expects an integer in [{lo}, {hi}], got {n}"
            return None
        if t == "float":
            try:
                float(text)
            except ValueError:
                return f"expects a number, got {_quote(value)}"
            return None
        if t == "enum":
            if text in self.values:
                return None
            hint = difflib.get_close_matches(text, self.values, n=1)
            did = f" (did you mean {hint[0]!r}?)" if hint else ""
            return f"expects one of {', '.join(self.values)}, got {_quote(value)}{did}"
        return None  # string / path: ORT does not check


@dataclass(frozen=True)
class ProviderCatalog:
    """A provider's option catalog (provider_options.json), checked."""

    name: str  # the ORT execution provider name, e.g. "CUDAExecutionProvider"
    short_names: tuple[str, ...]
    ort_version: str
    source: ProviderSource
    unknown_key_behavior: str  # "error" (session creation fails / falls back to CPU) or "ignored"
    unknown_key_note: str
    options: Mapping[str, ProviderOption] = field(repr=False)
    possibly_valid: tuple[str, ...] = ()  # keys seen in some source version but not verified
    possibly_valid_note: str | None = None
    graph_capture_option: str | None = None  # the option that turns CUDA-graph capture/replay on, if any

    def keys(self) -> list[str]:
        return list(self.options)

    def option(self, key: str) -> ProviderOption | None:
        return self.options.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self.options

    def suggest(self, key: str) -> str | None:
        """The valid key nearest to `key` (difflib), or None if nothing is close."""
        if key in self.options:
            return key
        lowered = {k.lower(): k for k in self.options}
        if key.lower() in lowered:
            return lowered[key.lower()]
        hits = difflib.get_close_matches(key, list(self.options), n=1, cutoff=0.75)
        if hits:
            return hits[0]
        # Same words in another order ("cuda_graph_enable_partial" -> "enable_cuda_graph").
        words = set(key.lower().replace("-", "_").split("_")) - {""}
        best, best_score = None, 0.0
        for k in self.options:
            kw = set(k.split("_"))
            shared = len(words & kw)
            score = shared / len(words | kw) if shared >= 2 else 0.0
            if score > best_score:
                best, best_score = k, score
        return best if best_score >= 0.5 else None

    def is_possibly_valid(self, key: str) -> bool:
        return key in self.possibly_valid

    def validate(self, options: Mapping[str, Any]) -> list[tuple[str, str]]:
        """(key, problem) for every unknown key or bad value in `options`."""
        problems = []
        for key, value in options.items():
            opt = self.options.get(key)
            if opt is None:
                hint = self.suggest(key)
                msg = f"not a {self.name} option"
                if self.is_possibly_valid(key):
                    msg += " in the catalog (seen in some ORT source versions; unverified)"
                if hint:
                    msg += f" (did you mean {hint!r}?)"
                problems.append((key, msg))
                continue
            reason = opt.validate(value)
            if reason:
                problems.append((key, reason))
        return problems


# ---- provider_options.json, as its schema ------------------------------------------------------------------------


@dataclass(frozen=True)
class _OptionEntry:
    """provider_options.json: one option."""

    type: Literal["bool", "int", "size", "float", "enum", "string", "path"]
    default: Any
    description: str
    values: tuple[str, ...] = ()
    min: int | None = None
    max: int | None = None
    python_api: bool = True
    validated_by: str = "ort"
    note: str | None = None
    deprecated_since: str | None = None
    deprecated_note: str | None = None


@dataclass(frozen=True)
class _PossiblyValid:
    """provider_options.json: keys seen in some source version but not verified, with a note."""

    keys: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class ProviderSource:
    """Where a provider's option catalog was read."""

    repo: str
    files: tuple[str, ...]
    commits: Mapping[str, str]  # file -> commit read
    checked_against: str


@dataclass(frozen=True)
class _ProviderEntry:
    """provider_options.json: one provider."""

    short_names: tuple[str, ...]
    graph_capture_option: str | None
    unknown_key_behavior: Literal["error", "ignored"]
    unknown_key_note: str
    source: ProviderSource
    options: Mapping[str, _OptionEntry]
    graph_capture_note: str | None = None
    bool_values: tuple[str, ...] | None = None
    bool_values_note: str | None = None
    possibly_valid: _PossiblyValid | None = None


@dataclass(frozen=True)
class _ProviderOptionsFile:
    """provider_options.json."""

    schema: Literal[1]
    ort_version: str
    about: str
    bool_values: tuple[str, ...]
    providers: Mapping[str, _ProviderEntry]


def _catalog(name: str, prov: _ProviderEntry, data: _ProviderOptionsFile) -> ProviderCatalog:
    bools = prov.bool_values or data.bool_values
    options = {
        key: ProviderOption(provider=name, key=key, type=o.type, default=o.default, description=o.description,
                            values=o.values, min=o.min, max=o.max, bool_values=bools, python_api=o.python_api,
                            validated_by=o.validated_by, note=o.note, deprecated_since=o.deprecated_since,
                            deprecated_note=o.deprecated_note)
        for key, o in prov.options.items()
    }
    catalog = ProviderCatalog(
        name=name, short_names=prov.short_names, ort_version=data.ort_version, source=prov.source,
        unknown_key_behavior=prov.unknown_key_behavior, unknown_key_note=prov.unknown_key_note, options=options,
        possibly_valid=prov.possibly_valid.keys if prov.possibly_valid else (),
        possibly_valid_note=prov.possibly_valid.note if prov.possibly_valid else None,
        graph_capture_option=prov.graph_capture_option,
    )
    where = f"{PROVIDER_OPTIONS_JSON.name}: providers.{name}"
    for option in options.values():
        if option.type == "enum" and option.default not in option.values:
            raise KnowledgeError(f"{where}.options.{option.key}: default {option.default!r} is not one of its values")
        if option.type != "enum" and option.values:
            raise KnowledgeError(f"{where}.options.{option.key}: only an enum lists values")
        problem = option.validate(option.default_string)
        if problem:
            raise KnowledgeError(f"{where}.options.{option.key}: its default {problem}")
    if catalog.graph_capture_option is not None and catalog.graph_capture_option not in options:
        raise KnowledgeError(f"{where}: graph_capture_option {catalog.graph_capture_option!r} is not one of its options")
    return catalog


_PROVIDER_OPTIONS = build(_ProviderOptionsFile, read_json(PROVIDER_OPTIONS_JSON), PROVIDER_OPTIONS_JSON.name)
_CATALOGS: dict[str, ProviderCatalog] = {name: _catalog(name, prov, _PROVIDER_OPTIONS)
                                         for name, prov in _PROVIDER_OPTIONS.providers.items()}


@functools.cache
def _alias_map() -> dict[str, str]:
    """lowercased name -> EP name, for every known provider, short name and genai spelling."""
    m: dict[str, str] = {}
    for ep in ORT_FACTS.known_providers:
        m[ep.lower()] = ep
        m[ep.lower().removesuffix("executionprovider")] = ep
    for short, info in ORT_FACTS.genai.provider_names.items():
        if info.ep:
            m[short] = info.ep
            m[info.genai_name.lower()] = info.ep
    for name, cat in _CATALOGS.items():
        m[name.lower()] = name
        for s in cat.short_names:
            m[s.lower()] = name
    # onnxruntime-genai builder's "-e trt-rtx"
    m["trt-rtx"] = TRT_RTX
    return m


@functools.cache
def canonical_provider_name(name: str) -> str | None:
    """The ORT execution provider name for an EP name or short name ("cuda", "CUDA", "CUDAExecutionProvider",
    "tensorrt", "trt", "cann", "cpu", "dml", "webgpu", "qnn", "openvino", "NvTensorRtRtx", ...), case-insensitive.
    None if the name is not a known provider."""
    if not isinstance(name, str) or not name.strip():
        return None
    return _alias_map().get(name.strip().lower())


def normalize_option_value(value: Any) -> str:
    """A provider option value as ORT parses it: the booleans 0/1/true/false/True/False become "0" or "1"."""
    text = str(value).strip()
    low = text.lower()
    if low in ("true", "1"):
        return "1"
    if low in ("false", "0"):
        return "0"
    return text


def provider_catalog(name: str) -> ProviderCatalog | None:
    """The option catalog of a provider (EP name or short name, case-insensitive), or None if the provider is
    unknown or has no catalog (only CUDA, TensorRT, CANN and CPU have one)."""
    ep = canonical_provider_name(name)
    return _CATALOGS.get(ep) if ep else None


def catalog_option(provider: str, key: str) -> ProviderOption:
    """An option a rule knows the provider's catalog lists (KeyError when it does not: a bug in the rule)."""
    catalog = provider_catalog(provider)
    option = catalog.option(key) if catalog else None
    if option is None:
        raise KeyError(f"{provider} option {key!r} is not in provider_options.json")
    return option


def catalog_providers() -> list[str]:
    return list(_CATALOGS)


# ---- ORT facts --------------------------------------------------------------------------------------------------


def ort_facts() -> OrtFacts:
    """ort_facts.json as typed, frozen data (loaded and checked when ortgate.knowledge is imported)."""
    return ORT_FACTS


def graph_optimization_levels() -> dict[str, int]:
    """ORT's GraphOptimizationLevel names -> values: ORT_DISABLE_ALL=0 ... ORT_ENABLE_LAYOUT=3, ORT_ENABLE_ALL=99."""
    return dict(ORT_FACTS.level_values)


def default_optimization_level() -> str:
    """The level ORT uses when none is set (ORT_ENABLE_ALL)."""
    return ORT_FACTS.graph_optimization_level_default


def optimization_level_skips(level: str) -> str | None:
    """What a session at `level` leaves out (for messages), or None for a name ORT does not have."""
    info = ORT_FACTS.level(level)
    return info.skips if info else None


def genai_graph_optimization_levels() -> list[str]:
    """The level names onnxruntime-genai's genai_config.json accepts (no ORT_ENABLE_LAYOUT)."""
    return list(ORT_FACTS.genai.graph_optimization_levels)


def session_config_key(key: str) -> ConfigKey | None:
    """What ort_facts.json knows about a session config key (description, values, default, source), or None."""
    return ORT_FACTS.session_config.keys.get(key)


def is_known_session_config_key(key: str) -> bool:
    """True for a documented/seen session config key, or a provider-scoped 'ep.<provider>.<option>' key.
    ORT silently accepts and ignores any other key, so an unknown key is most likely a typo."""
    if key in ORT_FACTS.session_config.keys:
        return True
    parts = key.split(".")
    return len(parts) >= 3 and parts[0] == "ep" and canonical_provider_name(parts[1]) is not None


def suggest_session_config_key(key: str) -> str | None:
    hits = difflib.get_close_matches(key, list(ORT_FACTS.session_config.keys), n=1, cutoff=0.75)
    return hits[0] if hits else None


def graph_capture_info(provider: str) -> GraphCapture | None:
    """How graph capture/replay is switched on for a provider (a provider option or a session config entry, its
    key and source); None if the provider has no such switch (CPU, CANN) or is unknown."""
    ep = canonical_provider_name(provider)
    return ORT_FACTS.graph_capture.get(ep) if ep else None


def graph_capture_option(provider: str) -> str | None:
    """The provider option that turns graph capture on (CUDA: enable_cuda_graph, TensorRT: trt_cuda_graph_enable,
    NvTensorRTRTX: enable_cuda_graph, WebGPU: enableGraphCapture); None if it is not a provider option."""
    info = graph_capture_info(provider)
    return info.key if info and info.kind == "provider_option" else None


def run_config_key(key: str) -> ConfigKey | None:
    return ORT_FACTS.run_config.keys.get(key)


def genai_provider_name(name: str) -> str | None:
    """How onnxruntime-genai normalizes a provider_options name ('cuda' -> 'cuda', 'dml' -> 'DML',
    'CUDAExecutionProvider' -> 'cuda'); None if genai does not know it (it then reaches ORT unchanged and fails)."""
    low = name.strip().lower().removesuffix("executionprovider") if isinstance(name, str) else ""
    info = ORT_FACTS.genai.provider_names.get(low)
    return info.genai_name if info else None


# ---- placement: which provider runs a node, and what CUDA graph capture demands ------------------------------


def kernel_free_op(domain: str, op_type: str) -> str | None:
    """Why ORT runs (domain, op_type) without a kernel (Constant becomes an initializer), or None."""
    if domain not in ("", "ai.onnx"):
        return None
    return ORT_FACTS.kernel_free_ops.ops.get(op_type)


def cpu_fallback_facts() -> CpuFallback:
    """session.disable_cpu_ep_fallback: its key, the value ORT honours, and what it really does."""
    return ORT_FACTS.cpu_fallback


def cuda_graph_capture_facts() -> CudaGraphCapture:
    """What CUDA graph capture demands of a session (control flow, placement, fixed shapes), with sources."""
    return ORT_FACTS.cuda_graph_capture


def data_dependent_shape_inputs(domain: str, op_type: str) -> tuple[int, ...] | None:
    """Input positions whose VALUES decide the output shape of an ai.onnx op (NonZero: (0,), TopK: (1,)), or None."""
    if domain not in ("", "ai.onnx"):
        return None
    return ORT_FACTS.cuda_graph_capture.data_dependent_shape_ops.ops.get(op_type)


def tensorrt_untaken_domain(domain: str) -> str | None:
    """Why TensorRT leaves nodes of this domain to another provider (com.microsoft), or None."""
    return ORT_FACTS.tensorrt.not_taken_domains.get(domain)


def cuda_providers() -> tuple[str, ...]:
    """Providers that run on the CUDA runtime (CUDA, TensorRT, NvTensorRTRTX): their graph capture is CUDA graph,
    they need the CUDA libraries loaded, and they pick the GPU with a provider option."""
    return ORT_FACTS.cuda_providers.names


def device_option(provider: str) -> str | None:
    """The provider option that selects the GPU of a CUDA-family provider ("device_id"), else None."""
    entry = ORT_FACTS.cuda_providers.providers.get(provider)
    return entry.device_option if entry else None


def memcpy_ops() -> tuple[str, ...]:
    """The copy nodes ORT inserts between a device provider and the CPU: MemcpyToHost, MemcpyFromHost."""
    return ORT_FACTS.memcpy_ops.ops


def compute_ops() -> frozenset[str]:
    """op_types whose placement on CPU in a GPU session costs real time (not the shape nodes left on CPU on
    purpose)."""
    return frozenset(ORT_FACTS.compute_ops.ops)


def tf32_ops() -> tuple[tuple[str, str], ...]:
    """(domain, op_type) of the ops whose float32 math CUDA runs as TF32 when use_tf32 allows it."""
    return ORT_FACTS.tf32.op_keys
