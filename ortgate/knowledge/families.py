"""Model-family defaults (model_families.json): what a Qwen3-MoE, Qwen3.5-MoE, GPT-OSS, ... MoE layer must compute,
in the terms of ORT's MoE / QMoE attributes.

    from ortgate.knowledge.families import model_family
    family = model_family("qwen3_5_moe_text")      # genai_config.json's model.type
    family.norm_topk_prob, family.rms_norm_eps     # True, 1e-06
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FAMILIES_JSON = Path(__file__).with_name("model_families.json")


@dataclass(frozen=True)
class ModelFamily:
    name: str
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


@functools.cache
def _load() -> tuple[dict[str, ModelFamily], dict[str, str]]:
    with open(FAMILIES_JSON, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("schema") != 1:
        raise ValueError(f"unsupported model_families.json schema {data.get('schema')!r}")
    families: dict[str, ModelFamily] = {}
    aliases: dict[str, str] = {}
    for name, entry in data["families"].items():
        family = ModelFamily(
            name=name,
            aliases=tuple(entry.get("aliases", ())),
            moe_activation=entry.get("moe_activation"),
            norm_topk_prob=entry.get("norm_topk_prob"),
            use_sparse_mixer=int(entry.get("use_sparse_mixer", 0)),
            rms_norm_eps=entry.get("rms_norm_eps"),
            swiglu_alpha=entry.get("swiglu_alpha"),
            swiglu_beta=entry.get("swiglu_beta"),
            swiglu_limit=entry.get("swiglu_limit"),
            routing=entry.get("routing", ""),
            sources=dict(entry.get("sources", {})),
        )
        families[name] = family
        for alias in (name, *family.aliases):
            aliases.setdefault(_key(alias), name)
    return families, aliases


def model_families() -> dict[str, ModelFamily]:
    return dict(_load()[0])


def model_family(name: Any) -> ModelFamily | None:
    """The family a policy's model.family, a Hugging Face model_type/architecture or genai's model.type names."""
    if not isinstance(name, str) or not name.strip():
        return None
    families, aliases = _load()
    key = _key(name)
    canonical = aliases.get(key)
    if canonical is None:
        # genai writes the architecture minus "For..."; HF architectures end in ForCausalLM / ForConditionalGeneration.
        trimmed = re.sub(r"(forcausallm|forconditionalgeneration|text)$", "", key)
        canonical = aliases.get(trimmed)
    return families.get(canonical) if canonical else None


def family_names() -> list[str]:
    return sorted(_load()[0])
