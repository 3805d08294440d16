"""Which IR and opset versions each ONNX Runtime release loads (model_format.json, measured per release).

    refusal = model_format_refusal(10, {"ai.onnx": 0}, {"ai.onnx"}, "1.32.0")   # "opset ai.onnx 0: ..."
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ortgate.knowledge.loader import build, read_json

MODEL_FORMAT_JSON = Path(__file__).with_name("model_format.json")
# Opsets above the release that a rule reports instead (OGX010 op-unknown-to-release, on the deployment's release).
DOMAINS_JUDGED_BY_RULES = frozenset({"ai.onnx"})


@dataclass(frozen=True)
class _Release:
    """model_format.json: what one release loads."""

    max_ir_version: int
    max_opset: Mapping[str, int]


@dataclass(frozen=True)
class _ModelFormatFile:
    about: str
    reflects: str
    source: str
    min_opset: Mapping[str, int]
    releases: Mapping[str, _Release]


@functools.cache
def model_format() -> _ModelFormatFile:
    return build(_ModelFormatFile, read_json(MODEL_FORMAT_JSON), "model_format.json")


def _version_key(text: str) -> tuple[int, ...]:
    parts = []
    for part in str(text).split("."):
        digits = "".join(c for c in part if c.isascii() and c.isdigit())
        parts.append(int(digits[:6]) if digits else 0)
    return tuple(parts)


def model_format_refusal(ir_version: int, opsets: Mapping[str, int], used_domains: set[str],
                         release: str | None) -> str | None:
    """Why ONNX Runtime refuses to create a session of a model with this IR version and these opset imports
    (canonical domains: "ai.onnx" for the default one), or None. `used_domains`: the domains the graph's nodes use.

    `release` is the deployment's ORT release. A release loads no newer IR or opset than a later one, so it is
    judged against the oldest release measured at or after it: what that one refuses, `release` refuses too. A
    release newer than any measured, or none named, is judged against the newest measured, and the message says so.
    """
    facts = model_format()
    for domain, lowest in facts.min_opset.items():
        version = opsets.get(domain)
        if version is not None and version < lowest and domain in used_domains:
            return (f"opset_import {domain} {version}: no ONNX Runtime release registers an op below version "
                    f"{lowest}, so the session will fail (\"No Op registered\") on every one")
    known = sorted(facts.releases, key=_version_key)
    later = [r for r in known if release is not None and _version_key(r) >= _version_key(release)]
    judged = later[0] if later else known[-1]
    if release is not None and later and later[0] == release:
        which, hint = f"onnxruntime {judged} loads", ""
    elif later:
        which, hint = f"onnxruntime {judged}, the nearest release measured from {release} on, loads", ""
    else:
        which = f"onnxruntime {judged}, the newest release ortgate has measured, loads"
        hint = ("; if the deployment runs a newer release, name it as the policy's "
                "execution_provider.onnxruntime_version")
    bounds = facts.releases[judged]
    if ir_version > bounds.max_ir_version:
        return (f"ir_version {ir_version}: the session will fail ({which} IR versions up to "
                f"{bounds.max_ir_version}){hint}")
    for domain, highest in bounds.max_opset.items():
        if domain in DOMAINS_JUDGED_BY_RULES:
            continue  # ai.onnx above the release is op-unknown-to-release's finding (OGX010), judged as every rule is
        version = opsets.get(domain)
        if version is not None and version > highest:
            return (f"opset_import {domain} {version}: the session will fail ({which} {domain} opsets up to "
                    f"{highest}){hint}")
    return None
