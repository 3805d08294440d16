"""ONNX Runtime and onnxruntime-genai facts (ort_facts.json) as frozen dataclasses, loaded and checked at import.

    from ortgate.knowledge.facts import ORT_FACTS
    ORT_FACTS.cuda_graph_capture.runs_before_capture.value   # 2
    ORT_FACTS.level("ORT_ENABLE_BASIC").skips                 # what a session at that level does not run

Every field is a key of ort_facts.json (see ortgate.knowledge.loader): a typo or a missing key there is an error
when this module is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ortgate.knowledge.loader import build, read_json
from ortgate.knowledge.op_keys import ONNX_DOMAIN, parse_op_key

ORT_FACTS_JSON = Path(__file__).with_name("ort_facts.json")


@dataclass(frozen=True)
class OptimizationLevel:
    """ort_facts.json: a graph optimization level's value and what it leaves out."""

    value: int
    skips: str  # what a session at this level leaves out, for messages


@dataclass(frozen=True)
class GraphCapture:
    """ort_facts.json: how a provider turns on CUDA graph capture."""

    kind: Literal["provider_option", "session_config"]
    key: str
    source: str
    note: str | None = None


@dataclass(frozen=True)
class CudaProvider:
    """ort_facts.json: a CUDA-family provider."""

    device_option: str  # the provider option that selects the GPU


@dataclass(frozen=True)
class CudaProviders:
    """ort_facts.json: the CUDA-family providers."""

    about: str
    providers: Mapping[str, CudaProvider]
    source: str

    def __contains__(self, provider: object) -> bool:
        return provider in self.providers

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.providers)


@dataclass(frozen=True)
class OpList:
    """ort_facts.json: a list of ops with what it is about and its source."""

    about: str
    ops: tuple[str, ...]
    source: str

    def __contains__(self, op_type: object) -> bool:
        return op_type in self.ops


@dataclass(frozen=True)
class Tf32:
    """ort_facts.json: the ops TF32 applies to and the option that turns it on."""

    about: str
    option: str
    ops: tuple[str, ...]  # [domain.]op_type
    source: str

    @property
    def op_keys(self) -> tuple[tuple[str, str], ...]:
        """(domain, op_type) of each op; '' is the ONNX domain."""
        return tuple(("" if domain == ONNX_DOMAIN else domain, op_type) for domain, op_type in map(parse_op_key, self.ops))


@dataclass(frozen=True)
class ConfigKey:
    """ort_facts.json: one session or run config key."""

    description: str
    source: str
    values: tuple[str, ...] = ()
    default: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class SessionConfig:
    """ort_facts.json: the session config keys."""

    unknown_key_behavior: str
    key_prefixes: Mapping[str, str]
    source: Mapping[str, str]
    keys: Mapping[str, ConfigKey]


@dataclass(frozen=True)
class RunConfig:
    """ort_facts.json: the run config keys."""

    source: str
    keys: Mapping[str, ConfigKey]


@dataclass(frozen=True)
class GenaiSource:
    """ort_facts.json: the onnxruntime-genai sources read."""

    repo: str
    files: Mapping[str, str]  # file -> commit read
    checked_against: str


@dataclass(frozen=True)
class GenaiProviderName:
    """ort_facts.json: a provider name genai_config.json uses and the provider it means."""

    genai_name: str
    ep: str | None  # None: a genai-only device with no ORT provider of that name
    note: str | None = None


@dataclass(frozen=True)
class Genai:
    """ort_facts.json: onnxruntime-genai's provider names and option values."""

    version: str
    source: GenaiSource
    provider_name_normalization: str
    provider_names: Mapping[str, GenaiProviderName]  # lowercased, 'executionprovider'-less name -> entry
    unsupported_provider_names: Mapping[str, str]
    provider_option_values: str
    graph_optimization_levels: tuple[str, ...]
    graph_optimization_levels_note: str
    session_option_keys: Mapping[str, Literal["string", "number", "bool", "array"]]
    session_option_keys_note: str
    builder_provider_options: Mapping[str, Mapping[str, str]]


@dataclass(frozen=True)
class KernelFreeOps:
    """ort_facts.json: the ops no provider needs a kernel for."""

    about: str
    ops: Mapping[str, str]  # ONNX-domain op_type -> why it runs without a kernel


@dataclass(frozen=True)
class CpuFallback:
    """ort_facts.json: what session.disable_cpu_ep_fallback does."""

    config_key: str
    enabled_value: str
    about: str
    disabled_behavior: str
    value_parsing: str
    source: str
    # dtypes the CPU provider runs through a float kernel where it has none of their own: ORT's InsertCastTransformer
    # casts such a node's inputs to float and its outputs back
    cast_to_float: tuple[str, ...] = ()
    cast_to_float_source: str = ""


@dataclass(frozen=True)
class SourcedInt:
    """ort_facts.json: a number with its source."""

    value: int
    source: str


@dataclass(frozen=True)
class DataDependentShapeOps:
    """ort_facts.json: the ops whose output shape depends on input values."""

    about: str
    ops: Mapping[str, tuple[int, ...]]  # ONNX-domain op_type -> the inputs whose values decide the output shape


@dataclass(frozen=True)
class CudaGraphCapture:
    """ort_facts.json: what CUDA graph capture demands of a graph."""

    source: str
    control_flow_ops: tuple[str, ...]
    control_flow_rule: str
    cuda_rule: str
    tensorrt_rule: str
    fixed_shapes: str
    runs_before_capture: SourcedInt
    data_dependent_shape_ops: DataDependentShapeOps


@dataclass(frozen=True)
class Tensorrt:
    """ort_facts.json: what TensorRT leaves to other providers."""

    not_taken_domains: Mapping[str, str]
    cuda_graph_consequence: str
    source: str


@dataclass(frozen=True)
class OrtFacts:
    """ort_facts.json."""

    schema: Literal[1]
    ort_version: str
    about: str
    graph_optimization_levels: Mapping[str, OptimizationLevel]
    graph_optimization_levels_source: str
    graph_optimization_level_default: str
    graph_capture: Mapping[str, GraphCapture]  # provider -> how its graph capture is switched on
    execution_modes: Mapping[str, int]
    known_providers: tuple[str, ...]
    known_providers_source: str
    cuda_providers: CudaProviders
    memcpy_ops: OpList
    compute_ops: OpList
    tf32: Tf32
    session_config: SessionConfig
    run_config: RunConfig
    genai: Genai
    kernel_free_ops: KernelFreeOps
    cpu_fallback: CpuFallback
    cuda_graph_capture: CudaGraphCapture
    tensorrt: Tensorrt
    _level_values: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.graph_optimization_level_default not in self.graph_optimization_levels:
            raise ValueError(f"graph_optimization_level_default {self.graph_optimization_level_default!r} "
                             "is not one of graph_optimization_levels")
        unknown = set(self.genai.graph_optimization_levels) - set(self.graph_optimization_levels)
        if unknown:
            raise ValueError(f"genai.graph_optimization_levels names unknown levels {sorted(unknown)}")
        for provider in (*self.graph_capture, *self.cuda_providers.providers):
            if provider not in self.known_providers:
                raise ValueError(f"{provider!r} is not one of known_providers")
        object.__setattr__(self, "_level_values",
                           {name: level.value for name, level in self.graph_optimization_levels.items()})

    @property
    def level_values(self) -> Mapping[str, int]:
        """GraphOptimizationLevel name -> value: ORT_DISABLE_ALL=0 ... ORT_ENABLE_ALL=99."""
        return self._level_values

    def level(self, name: str) -> OptimizationLevel | None:
        return self.graph_optimization_levels.get(name)


ORT_FACTS: OrtFacts = build(OrtFacts, read_json(ORT_FACTS_JSON), ORT_FACTS_JSON.name)
