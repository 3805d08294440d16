"""Reported deployment failures as data (deployment_facts.json): what goes wrong, its source, and the releases of
the package it applies to. Rules read them through `deployment_fact`; a version check is `applies(version)`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ortgate.knowledge.loader import build, read_json

DEPLOYMENT_FACTS_JSON = Path(__file__).with_name("deployment_facts.json")


def release(text: str | None) -> tuple[int, ...] | None:
    """'1.30.1' -> (1, 30, 1); a suffix ('1.31.0+cu12', '0.14.0rc1') is ignored; None when not a release."""
    if not text:
        return None
    parts: list[int] = []
    for piece in str(text).strip().split(".")[:3]:
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts) if len(parts) >= 2 else None


@dataclass(frozen=True)
class Applies:
    """The package releases a deployment fact applies to."""

    package: Literal["onnxruntime", "onnxruntime-genai"]
    from_: str = field(metadata={"key": "from"})
    until: str | None

    def __contains__(self, version: str | None) -> bool:
        v = release(version)
        low = release(self.from_)
        if v is None or low is None:
            return False
        high = release(self.until)
        return _pad(v) >= _pad(low) and (high is None or _pad(v) < _pad(high))

    @property
    def span(self) -> str:
        return f"{self.package} {self.from_}" + (f" to before {self.until}" if self.until else " and later")


def _pad(v: tuple[int, ...]) -> tuple[int, ...]:
    return (v + (0, 0, 0))[:3]


@dataclass(frozen=True)
class DeploymentFact:
    """One fact about a deployment package (deployment_facts.json), with its source."""

    what: str
    source: str
    applies_to: Applies
    values: tuple[float, ...] = ()


@dataclass(frozen=True)
class AddedKeys:
    """Session config keys a release after the catalog's introduced (by prefix)."""

    prefix: str
    since: str
    source: str


@dataclass(frozen=True)
class _FactsFile:
    """deployment_facts.json."""

    schema: Literal[1]
    about: str
    reflects: str
    facts: Mapping[str, DeploymentFact]
    session_keys_added: tuple[AddedKeys, ...] = ()


_FACTS = build(_FactsFile, read_json(DEPLOYMENT_FACTS_JSON), DEPLOYMENT_FACTS_JSON.name)


def deployment_fact(key: str) -> DeploymentFact:
    return _FACTS.facts[key]


def session_key_added(key: str) -> AddedKeys | None:
    """The release that introduced a session config key the catalog (ort_facts.json) does not know, or None."""
    return next((a for a in _FACTS.session_keys_added if key.startswith(a.prefix)), None)


def at_least(version: str | None, since: str) -> bool:
    v, s = release(version), release(since)
    return v is not None and s is not None and _pad(v) >= _pad(s)
