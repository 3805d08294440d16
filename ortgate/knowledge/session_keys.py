"""Session config keys ONNX Runtime checks when a session is created (ort_session_keys.json): the prefixes whose
every key must be one the release knows (`session.moe.offload.*` from 1.32.0), prefixes a release refuses
(`moe.cpu_offload.*`), the values a key accepts, and the MoE expert offload's preconditions. Each CPU claim is
re-proved on the installed release by tests/test_ort_release_claims.py."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from ortgate.knowledge.deployment_facts import at_least
from ortgate.knowledge.loader import build, read_json

ORT_SESSION_KEYS_JSON = Path(__file__).with_name("ort_session_keys.json")


@dataclass(frozen=True)
class StrictPrefix:
    """From `since`, a key under `prefix` that is not one of `keys` fails session creation."""

    prefix: str
    since: str
    keys: tuple[str, ...]
    message: str
    source: str


@dataclass(frozen=True)
class RemovedPrefix:
    prefix: str
    since: str
    replacement: str
    message: str
    source: str


@dataclass(frozen=True)
class KeyValues:
    """The values a key accepts from `since`: `enum` (one of `allowed`) or `count` (a non-negative integer, or one of
    `allowed`)."""

    key: str
    since: str
    allowed: tuple[str, ...]
    kind: Literal["enum", "count"]
    case_sensitive: bool
    source: str

    def accepts(self, value: str) -> bool:
        if value in self.allowed or (not self.case_sensitive and value.lower() in self.allowed):
            return True
        return self.kind == "count" and value.isdigit()


@dataclass(frozen=True)
class IntForm:
    bits: int
    weights_prepacked: int
    block_sizes: tuple[int, ...]


@dataclass(frozen=True)
class Offload:
    """The MoE expert offload (session.moe.offload.*) and what it needs."""

    mode_key: str
    off: tuple[str, ...]
    provider: str
    min_compute_capability: float
    activation_dtypes: tuple[str, ...]
    int_forms: tuple[IntForm, ...]
    source: str


@dataclass(frozen=True)
class _SessionKeysFile:
    schema: Literal[1]
    reflects: str
    about: str
    strict_prefixes: tuple[StrictPrefix, ...]
    removed_prefixes: tuple[RemovedPrefix, ...]
    values: tuple[KeyValues, ...]
    offload: Offload


@cache
def session_keys() -> _SessionKeysFile:
    return build(_SessionKeysFile, read_json(ORT_SESSION_KEYS_JSON), ORT_SESSION_KEYS_JSON.name)


def refused_key(key: str, value: str, version: str) -> tuple[str, str] | None:
    """Why `version` refuses the config entry `key` = `value` at session creation, and the source; None: it does
    not (as far as ortgate knows)."""
    data = session_keys()
    for strict in data.strict_prefixes:
        if key.startswith(strict.prefix) and at_least(version, strict.since) and key not in strict.keys:
            return f"'{strict.message}: {key}'", strict.source
    for removed in data.removed_prefixes:
        if key.startswith(removed.prefix) and at_least(version, removed.since):
            return (f"{removed.prefix}* keys are discarded from onnxruntime {removed.since} ('{removed.message}')",
                    removed.source)
    for values in data.values:
        if values.key == key and at_least(version, values.since) and not values.accepts(value):
            what = f"one of {', '.join(repr(a) for a in values.allowed)}" if values.kind == "enum" else (
                "a non-negative integer" + (f" or {', '.join(repr(a) for a in values.allowed)}" if values.allowed
                                            else ""))
            return f"{key} takes {what}, not {value!r}", values.source
    return None


def offload() -> Offload:
    return session_keys().offload
