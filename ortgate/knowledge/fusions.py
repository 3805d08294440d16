"""ONNX Runtime's own graph fusions and attribute defaults, as data (ort_fusions.json), loaded and checked at import.

Rules use it to say whether a decomposed pattern in the exported model is repaired by ORT at session creation
(then only an optimized dump can prove it was) or runs as it is, and what value an omitted attribute takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ortgate.knowledge.facts import ORT_FACTS
from ortgate.knowledge.kernels import op_key
from ortgate.knowledge.loader import build, read_json
from ortgate.knowledge.provider_names import CPU

FUSIONS_JSON = Path(__file__).with_name("ort_fusions.json")


@dataclass(frozen=True)
class RmsnormForm:
    """ort_fusions.json: an RMSNorm form and the pass that fuses it."""

    fused_by: tuple[str, ...]  # providers for which SimplifiedLayerNormFusion fuses this form
    seen: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class OptimizerPass:
    """ort_fusions.json: one ORT optimizer pass: its level, providers and what it produces."""

    level: str | None  # the lowest GraphOptimizationLevel that runs it; None: ORT has no such pass
    providers: tuple[str, ...]
    produces: str | None
    matches: str
    rmsnorm_forms: Mapping[str, RmsnormForm] | None = None
    seen: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class OrtFusions:
    """ort_fusions.json."""

    schema: Literal[1]
    ort_version: str
    about: str
    optimizer_passes: Mapping[str, OptimizerPass]
    attribute_defaults: Mapping[str, Mapping[str, Any]]  # [domain.]op_type -> attribute -> the value ORT uses

    def __post_init__(self) -> None:
        for name, info in self.optimizer_passes.items():
            if info.level is not None and ORT_FACTS.level(info.level) is None:
                raise ValueError(f"optimizer_passes.{name}.level {info.level!r} is not a graph optimization level")
            if (info.level is None) != (not info.providers):
                raise ValueError(f"optimizer_passes.{name}: a pass with a level runs for some providers, and only then")


ORT_FUSIONS: OrtFusions = build(OrtFusions, read_json(FUSIONS_JSON), FUSIONS_JSON.name)


def ort_fusions() -> OrtFusions:
    return ORT_FUSIONS


def fusions_version() -> str:
    return ORT_FUSIONS.ort_version


def optimizer_pass(name: str) -> OptimizerPass:
    """The pass `name` (KeyError for a name the table does not have: a bug in the calling rule)."""
    return ORT_FUSIONS.optimizer_passes[name]


def pass_applies(name: str, provider: str | None, level: str | None) -> bool:
    """Whether ORT runs optimizer pass `name` for nodes on `provider` at optimization `level` (None: ORT's default,
    ORT_ENABLE_ALL; provider None: CPU, ORT's fallback)."""
    info = optimizer_pass(name)
    if not info.level:
        return False
    levels = ORT_FACTS.level_values
    have = levels.get(level or ORT_FACTS.graph_optimization_level_default)
    need = levels.get(info.level)
    if have is None or need is None or have < need:
        return False
    return (provider or CPU) in info.providers


def _rmsnorm_form(form: str) -> RmsnormForm | None:
    forms = optimizer_pass("SimplifiedLayerNormFusion").rmsnorm_forms
    return forms.get(form) if forms else None


def rmsnorm_form_fused(form: str, provider: str | None, level: str | None) -> bool:
    """Whether SimplifiedLayerNormFusion turns this decomposed RMSNorm form into SimplifiedLayerNormalization."""
    if not pass_applies("SimplifiedLayerNormFusion", provider, level):
        return False
    entry = _rmsnorm_form(form)
    return entry is not None and (provider or CPU) in entry.fused_by


def rmsnorm_form_providers(form: str) -> list[str]:
    """The providers for which SimplifiedLayerNormFusion fuses this decomposed RMSNorm form (at EXTENDED+)."""
    entry = _rmsnorm_form(form)
    return list(entry.fused_by) if entry else []


def attribute_default(domain: str, op_type: str, attribute: str) -> Any:
    """The value ORT uses when a node omits `attribute` (None when the table does not know)."""
    return ORT_FUSIONS.attribute_defaults.get(op_key(domain, op_type), {}).get(attribute)
