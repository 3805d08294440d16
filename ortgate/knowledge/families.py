"""Model-family defaults (model_families.json): what a Qwen3-MoE, Qwen3.5-MoE, GPT-OSS, ... MoE layer must compute,
in the terms of ORT's MoE / QMoE attributes.

    from ortgate.knowledge.families import model_family
    family = model_family("qwen3_5_moe_text")      # genai_config.json's model.type
    family.norm_topk_prob, family.rms_norm_eps     # True, 1e-06
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ortgate.knowledge.loader import KnowledgeError, build, read_json

FAMILIES_JSON = Path(__file__).with_name("model_families.json")


@dataclass(frozen=True)
class ModelFamily:
    """An MoE model family's defaults (model_families.json)."""

    name: str
    label: str  # how messages name it ("Qwen3-MoE")
    aliases: tuple[str, ...]
    moe_activation: str | None
    norm_topk_prob: bool | None  # None: the family's routing does not renormalise the top-k (sparse mixer)
    use_sparse_mixer: int
    rms_norm_eps: float | None
    swiglu_alpha: float | None
    swiglu_beta: float | None
    swiglu_limit: float | None
    routing: str
    sources: dict[str, str] = field(default_factory=dict)

    def source(self, key: str) -> str:
        """Where the default of `key` comes from (for finding messages)."""
        return self.sources.get(key, "model_families.json")


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass(frozen=True)
class _FamilyEntry:
    """model_families.json: one family."""

    label: str
    aliases: tuple[str, ...]
    moe_activation: Literal["swiglu", "silu", "gelu", "relu", "identity"] | None
    norm_topk_prob: bool | None
    use_sparse_mixer: Literal[0, 1]
    rms_norm_eps: float | None
    swiglu_alpha: float | None
    swiglu_beta: float | None
    routing: str
    swiglu_limit: float | None = None
    sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _FamiliesFile:
    """model_families.json."""

    schema: Literal[1]
    about: str
    reflects: Mapping[str, str]  # the library versions whose code and builders the defaults were read from
    moe_activation_meaning: Mapping[str, str]
    families: Mapping[str, _FamilyEntry]


def _load() -> tuple[dict[str, ModelFamily], dict[str, str]]:
    data = build(_FamiliesFile, read_json(FAMILIES_JSON), FAMILIES_JSON.name)
    families: dict[str, ModelFamily] = {}
    aliases: dict[str, str] = {}
    for name, entry in data.families.items():
        if entry.moe_activation is not None and entry.moe_activation not in data.moe_activation_meaning:
            raise KnowledgeError(f"{FAMILIES_JSON.name}: families.{name}.moe_activation {entry.moe_activation!r} "
                                 "is not described in moe_activation_meaning")
        family = ModelFamily(
            name=name,
            label=entry.label,
            aliases=entry.aliases,
            moe_activation=entry.moe_activation,
            norm_topk_prob=entry.norm_topk_prob,
            use_sparse_mixer=entry.use_sparse_mixer,
            rms_norm_eps=entry.rms_norm_eps,
            swiglu_alpha=entry.swiglu_alpha,
            swiglu_beta=entry.swiglu_beta,
            swiglu_limit=entry.swiglu_limit,
            routing=entry.routing,
            sources=dict(entry.sources),
        )
        families[name] = family
        for alias in (name, *family.aliases):
            aliases.setdefault(_key(alias), name)
    return families, aliases


_FAMILIES, _ALIASES = _load()


def model_families() -> dict[str, ModelFamily]:
    return dict(_FAMILIES)


def model_family(name: Any) -> ModelFamily | None:
    """The family a policy's model.family, a Hugging Face model_type/architecture or genai's model.type names."""
    if not isinstance(name, str) or not name.strip():
        return None
    families, aliases = _FAMILIES, _ALIASES
    key = _key(name)
    canonical = aliases.get(key)
    if canonical is None:
        # genai writes the architecture minus "For..."; HF architectures end in ForCausalLM / ForConditionalGeneration.
        trimmed = re.sub(r"(forcausallm|forconditionalgeneration|text)$", "", key)
        canonical = aliases.get(trimmed)
    return families.get(canonical) if canonical else None


def _number(value: float | None) -> str:
    return "none" if value is None else f"{value:g}" if value != int(value) else f"{value:.1f}"


def swiglu_parameters_text() -> str:
    """activation_alpha / activation_beta / swiglu_limit per group of SwiGLU families, for messages:
    "1.0 / 0.0 / none for Qwen3-MoE, ...; 1.702 / 1.0 / 7.0 for GPT-OSS"."""
    groups: dict[tuple[float | None, float | None, float | None], list[str]] = {}
    for family in _FAMILIES.values():
        if family.moe_activation == "swiglu":
            key = (family.swiglu_alpha, family.swiglu_beta, family.swiglu_limit)
            groups.setdefault(key, []).append(family.label)
    return "; ".join(f"{' / '.join(_number(v) for v in key)} for {', '.join(labels)}" for key, labels in groups.items())


def family_labels(predicate: Callable[[ModelFamily], bool]) -> list[str]:
    """The labels of the families `predicate` holds for, in model_families.json's order."""
    return [family.label for family in _FAMILIES.values() if predicate(family)]


def family_names() -> list[str]:
    return sorted(_FAMILIES)
