"""The tools that write ONNX models (producers.json): how each records itself, and which of its releases write a
fused form a finding asks for.

    from ortgate.knowledge.producers import producer_of
    tool = producer_of("onnxruntime-genai")            # ModelProto.producer_name
    tool.advice("qkv_packed", "")                       # a sentence for the finding's fix
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ortgate.knowledge.loader import KnowledgeError, build, read_json

PRODUCERS_JSON = Path(__file__).with_name("producers.json")


def release(text: str) -> tuple[int, ...] | None:
    """A release number as a comparable tuple ("0.18.0+00d66ef" -> (0, 18, 0)), or None when there is none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


@dataclass(frozen=True)
class ProducedForm:
    """A form a producer writes, since which release and for which providers."""

    writes: str  # what the tool writes, in a phrase ("one packed qkv_proj MatMul for GroupQueryAttention")
    since: str | None  # the first release that writes it; None: every checked release does
    applies_to: str  # which models or builds it holds for
    turned_off_by: str  # what makes a release that writes it not write it
    source: str
    providers: tuple[str, ...] = ()  # the ORT providers it is written for when built for them (empty: every one)


@dataclass(frozen=True)
class FusesNone:
    """A tool that writes none of the fused forms a finding asks for (ORT's quantizers, its transformers optimizer on
    a decoder): what it does, and what writes the fused forms instead."""

    what: str
    instead: str
    source: str


@dataclass(frozen=True)
class Producer:
    """A tool that writes models (producers.json): its producer names and the fused forms it writes."""

    name: str
    label: str  # how messages name it
    producer_names: tuple[str, ...]  # ModelProto.producer_name values it writes
    mentions: tuple[str, ...]  # how fix texts name it when they recommend it
    checked: tuple[str, ...]  # the releases whose code the forms were read from
    version_recorded_since: str | None  # the first release that records producer_version; None: all do
    version_source: str
    forms: Mapping[str, ProducedForm] = field(default_factory=dict)
    fuses_none: FusesNone | None = None
    command: str | None = None  # how to run it ("python -m onnxruntime_genai.models.builder -i HF_DIR -o OUT")
    builds: Mapping[str, str] = field(default_factory=dict)  # model family (model_families.json key) -> label
    execution_providers: Mapping[str, str] = field(default_factory=dict)  # ORT provider -> the tool's flags for it
    refuses: Mapping[str, str] = field(default_factory=dict)  # families seen refused (builds_source) -> label

    def builds_family(self, family: str) -> bool:
        return family in self.builds

    def command_for(self, provider: str | None) -> str | None:
        """The command line that builds for `provider` (an ORT provider name), or None when the tool has no build
        for it or no command is known; with no provider, the build for the first provider listed, and the flags of
        the second after it ("`... -p fp32 -e cpu` (`-p fp16 -e cuda` for CUDAExecutionProvider)")."""
        if self.command is None:
            return None
        if provider is None:
            listed = list(self.execution_providers.items())
            if not listed:
                return f"`{self.command}`"
            first = f"`{self.command} {listed[0][1]}`"
            return first + (f" (`{listed[1][1]}` for {listed[1][0]})" if len(listed) > 1 else "")
        flag = self.execution_providers.get(provider)
        return f"`{self.command} {flag}`" if flag else None

    def mentioned_in(self, text: str) -> bool:
        low = text.lower()
        return any(m.lower() in low for m in self.mentions)

    def advice(self, form: str, version: str) -> str | None:
        """What to say about `form` on a model this tool made with release `version` ('' when not recorded), or
        None when the data knows nothing of that form."""
        entry = self.forms.get(form)
        if entry is None:
            if self.fuses_none is None:
                return None
            return (f"This model was written by {self.label}, which fuses none of the reported ops: "
                    f"{self.fuses_none.what}; {self.fuses_none.instead}.")
        made = release(version)
        checked = f"{self.checked[0]} to {self.checked[-1]}" if len(self.checked) > 1 else self.checked[0]
        if made is not None:
            who = f"This model was made by {self.label} {version}"
        else:
            who = f"This model was made by {self.label}, which recorded no release number"
            if self.version_recorded_since:
                who += f" (releases before {self.version_recorded_since} record none)"
        what = f"{entry.writes} {entry.applies_to}"
        since = release(entry.since) if entry.since else None
        if since is None:
            return (f"{who}; every release checked ({checked}) writes {what}: this model was built with "
                    f"{entry.turned_off_by}.")
        if made is not None and made >= since:
            return f"{who}, which writes {what}: this model was built with {entry.turned_off_by}."
        advice = f"{who}; from {entry.since} on it writes {what}: re-export with {self.name} {entry.since} or later"
        if made is None:  # an unrecorded release may be recent enough, built with the form turned off
            advice += f", without {entry.turned_off_by}"
        return advice + "."


@dataclass(frozen=True)
class _ProducerEntry:
    """producers.json: one producer."""

    label: str
    producer_names: tuple[str, ...]
    mentions: tuple[str, ...]
    checked: tuple[str, ...]
    version_recorded_since: str | None
    version_source: str
    forms: Mapping[str, ProducedForm] = field(default_factory=dict)
    fuses_none: FusesNone | None = None
    command: str | None = None
    builds: Mapping[str, str] = field(default_factory=dict)
    builds_source: str = ""
    refuses: Mapping[str, str] = field(default_factory=dict)
    execution_providers: Mapping[str, str] = field(default_factory=dict)
    execution_providers_source: str = ""


@dataclass(frozen=True)
class _ProducersFile:
    """producers.json."""

    schema: Literal[1]
    about: str
    reflects: Mapping[str, str]
    producers: Mapping[str, _ProducerEntry]


def _load() -> dict[str, Producer]:
    data = build(_ProducersFile, read_json(PRODUCERS_JSON), PRODUCERS_JSON.name)
    out: dict[str, Producer] = {}
    for name, entry in data.producers.items():
        for version in (*entry.checked, entry.version_recorded_since, *(f.since for f in entry.forms.values())):
            if version is not None and release(version) is None:
                raise KnowledgeError(f"{PRODUCERS_JSON.name}: producers.{name}: {version!r} is not a release number")
        producer = Producer(name, entry.label, entry.producer_names, entry.mentions, entry.checked,
                            entry.version_recorded_since, entry.version_source, dict(entry.forms), entry.fuses_none,
                            entry.command, dict(entry.builds), dict(entry.execution_providers), dict(entry.refuses))
        for spelled in entry.producer_names:
            out[spelled.lower()] = producer
    return out


_PRODUCERS = _load()


def known_producers() -> list[Producer]:
    """Every tool producers.json knows, once each."""
    return list({id(p): p for p in _PRODUCERS.values()}.values())


def producer_of(producer_name: str) -> Producer | None:
    """The tool a model's producer_name names, when producers.json knows it."""
    return _PRODUCERS.get((producer_name or "").strip().lower())
