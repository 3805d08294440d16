"""ONNX Runtime's own graph fusions and attribute defaults, as data (ort_fusions.json).

Rules use it to say whether a decomposed pattern in the exported model is repaired by ORT at session creation
(then only an optimized dump can prove it was) or runs as it is, and what value an omitted attribute takes.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from ortgate.knowledge.providers import graph_optimization_levels

FUSIONS_JSON = Path(__file__).with_name("ort_fusions.json")


@functools.cache
def ort_fusions() -> dict[str, Any]:
    with open(FUSIONS_JSON, encoding="utf-8") as f:
        data = json.load(f)
    if data.get("schema") != 1:
        raise ValueError(f"unsupported ort_fusions.json schema {data.get('schema')!r}")
    return data


def fusions_version() -> str:
    return str(ort_fusions()["ort_version"])


def optimizer_pass(name: str) -> dict[str, Any]:
    return ort_fusions()["optimizer_passes"][name]


def pass_applies(name: str, provider: str | None, level: str | None) -> bool:
    """Whether ORT runs optimizer pass `name` for nodes on `provider` at optimization `level` (None: ORT's default,
    ORT_ENABLE_ALL; provider None: CPU, ORT's fallback)."""
    info = optimizer_pass(name)
    if not info.get("level"):
        return False
    levels = graph_optimization_levels()
    have = levels.get(level or "ORT_ENABLE_ALL")
    need = levels.get(info["level"])
    if have is None or need is None or have < need:
        return False
    return (provider or "CPUExecutionProvider") in info.get("providers", ())


def rmsnorm_form_fused(form: str, provider: str | None, level: str | None) -> bool:
    """Whether SimplifiedLayerNormFusion turns this decomposed RMSNorm form into SimplifiedLayerNormalization."""
    if not pass_applies("SimplifiedLayerNormFusion", provider, level):
        return False
    forms = optimizer_pass("SimplifiedLayerNormFusion")["rmsnorm_forms"]
    entry = forms.get(form)
    return entry is not None and (provider or "CPUExecutionProvider") in entry.get("fused_by", ())


def rmsnorm_form_providers(form: str) -> list[str]:
    """The providers for which SimplifiedLayerNormFusion fuses this decomposed RMSNorm form (at EXTENDED+)."""
    entry = optimizer_pass("SimplifiedLayerNormFusion")["rmsnorm_forms"].get(form)
    return list(entry.get("fused_by", ())) if entry else []


def attribute_default(domain: str, op_type: str, attribute: str) -> Any:
    """The value ORT uses when a node omits `attribute` (None when the table does not know)."""
    key = op_type if domain in ("", "ai.onnx") else f"{domain}.{op_type}"
    return ort_fusions()["attribute_defaults"].get(key, {}).get(attribute)
