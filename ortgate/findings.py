"""Findings: what a rule reports. Rules create them; the gate decides; reporters format them."""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

# The property a rule sets on a finding whose fact makes ORT refuse to create the session (a model that never loads).
SESSION_FAILS = "session_fails"


class Severity(enum.IntEnum):
    """Ordered so that `a >= b` means "a is at least as severe as b"."""

    INFO = 1
    WARNING = 2
    ERROR = 3

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (expected error, warning or info)") from None

    @property
    def label(self) -> str:
        return self.name.lower()


class Kind(enum.Enum):
    """What a finding says. Only a violation carries its rule's severity and can be re-levelled by a policy."""

    VIOLATION = "violation"  # the rule's fact holds on this input
    UNDECIDED = "undecided"  # the rule could not decide on this input (always info)
    INTERNAL_ERROR = "internal-error"  # the rule failed on this input (always info)


def _one_line(text: str | None) -> str | None:
    """Text that came from the user (a policy key, a waiver reason, a node or file name) on one printable line:
    a newline or a terminal escape in it is shown escaped, so no reporter can print a line the input forged."""
    if text is None or text.isprintable():
        return text
    from ortgate.errors import printable

    return printable(text)


def _clean(obj: object, *fields: str) -> None:
    for name in fields:
        value = getattr(obj, name)
        if isinstance(value, str) and not value.isprintable():
            object.__setattr__(obj, name, _one_line(value))


@dataclass(frozen=True)
class Location:
    """Where a finding points: a model file (+ graph node) or a config file (+ key path and line)."""

    file: str
    line: int | None = None
    key_path: str | None = None  # "execution_provider.options.enable_cuda_graph"
    # What to call `file` when the finding is not about the file as it is: "optimized graph of MODEL" (ORT's
    # optimized graph of MODEL, from a dump that was not kept).
    label: str | None = None

    def __post_init__(self) -> None:
        _clean(self, "file", "key_path", "label")


@dataclass(frozen=True)
class Suppression:
    kind: str  # "waiver" | "baseline"
    justification: str
    location: Location | None = None  # the waiver (policy file and line) or the baseline file

    def __post_init__(self) -> None:
        _clean(self, "kind", "justification")


@dataclass(frozen=True)
class Price:
    """What fixing a finding would save on one decode step: an estimate for a device, never a measurement."""

    ms_per_token: float  # each sequence's time per output token (the step time) saved
    share: float  # of the step as exported
    device: str

    def to_dict(self) -> dict[str, Any]:
        return {"ms_per_token": round(self.ms_per_token, 4), "share_of_step": round(self.share, 4),
                "device": self.device, "estimate": True}


@dataclass(frozen=True)
class Finding:
    code: str
    rule: str
    severity: Severity
    message: str
    location: Location
    node: str | None = None
    op_type: str | None = None
    layer: int | None = None
    graph: str | None = None  # subgraph path, None for the main graph
    fix: str | None = None
    related_nodes: tuple[str, ...] = ()
    properties: tuple[tuple[str, Any], ...] = ()
    suppressed: Suppression | None = None
    kind: Kind = Kind.VIOLATION
    price: Price | None = None  # what fixing it saves per decode step on the policy's device (an estimate)
    # The structural signature of what a node finding is about: the graph's role and the anchor node's op
    # ("model:MatMul", "optimized:com.microsoft.MoE"), its position in its graph (to order findings), and which
    # occurrence it is among the rule's findings with the same signature in the same layer (set by the pipeline).
    # Node names are left out: a re-export (torch dynamo) renames every node.
    anchor: str | None = None
    position: int | None = None
    occurrence: int = 0
    # The models linted when the rule found it (set by the pipeline; none for a finding about the policy alone): a
    # finding about a shared file (the policy's `model.moe_layers`) is still about the models it was found in, and
    # a baseline entry written for it accepts it in those models only.
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _clean(self, "message", "node", "graph", "fix")
        if self.kind is not Kind.VIOLATION and self.severity is not Severity.INFO:
            raise ValueError(f"a {self.kind.value} finding is info, not {self.severity.label}")

    @property
    def file(self) -> str:
        return self.location.file

    @property
    def stops_session(self) -> bool:
        """Whether ORT refuses to create a session for the model this finding is about (its rule sets the
        `session_fails` property): no report may hide such a finding behind a cap."""
        return any(key == SESSION_FAILS and value is True for key, value in self.properties)

    @property
    def relevelable(self) -> bool:
        """Whether a policy's `rules.severity` may change this finding's severity: only a violation's."""
        return self.kind is Kind.VIOLATION

    def with_severity(self, severity: Severity) -> Finding:
        if not self.relevelable:
            raise ValueError(f"a {self.kind.value} finding keeps its info severity")
        return replace(self, severity=severity)

    def suppress(self, kind: str, justification: str, location: Location | None = None) -> Finding:
        return replace(self, suppressed=Suppression(kind, justification, location))

    def sort_key(self) -> tuple:
        return (
            self.location.file,
            -1 if self.layer is None else self.layer,
            self.location.line or 0,
            self.code,
            self.node or "",
            self.message,
        )

    def identity(self) -> str:
        """Stable identity for baselines and fingerprints: rule, the file's path relative to the working directory
        (model_key), decoder layer, and the structural signature of the match (anchor op and occurrence) or the
        config key path. Two models named model.onnx in two folders never share an identity.

        Never a line number or a node name: moving YAML around or re-exporting the model with new node names
        keeps the identity.
        """
        return self._identity(model_key(self.location.file))

    def v2_identity(self) -> str:
        """The identity of version-2 baselines and fingerprints: the file's name alone, so that one entry matched
        the finding in every model of that name; kept so that version-2 files still load."""
        from pathlib import PurePath

        return self._identity(PurePath(self.location.file).name)

    def _identity(self, file: str) -> str:
        layer = "-" if self.layer is None else str(self.layer)
        if self.anchor is not None:
            target = f"{self.anchor}#{self.occurrence}"
        elif self.location.key_path:
            target = f"key:{self.location.key_path}"
        else:
            target = f"props:{_properties_anchor(self)}"
        return f"{self.rule}|{file}|{layer}|{target}"

    def legacy_identity(self) -> str:
        """The identity of version-1 baselines: rule + file name + graph node (or key path). A re-export that renames
        nodes changes it; kept so that old baseline files still match."""
        from pathlib import PurePath

        anchor = self.node or self.location.key_path or ""
        message = "" if (self.node or self.location.key_path) else _properties_anchor(self)
        return f"{self.rule}|{PurePath(self.location.file).name}|{self.graph or ''}|{anchor}|{message}"


def model_key(file: str) -> str:
    """How a finding's file is named in its identity: its path relative to the working directory, with forward
    slashes ("models/a/model.onnx"), or the absolute path of a file outside it. The same file named two ways
    ("./a/model.onnx", "a/") gets one key; two files of one name in two folders get two."""
    import os
    from pathlib import Path

    if not file:
        return file
    try:
        absolute = Path(os.path.abspath(file))
        cwd = Path(os.path.abspath(os.getcwd()))
    except (OSError, ValueError):
        return Path(file).as_posix()
    try:
        return absolute.relative_to(cwd).as_posix()
    except ValueError:
        return absolute.as_posix()


def _properties_anchor(finding: Finding) -> str:
    # Findings without a node or key (counts, expectations) are distinguished by their properties.
    return ",".join(f"{k}={v}" for k, v in finding.properties)


def number_occurrences(findings: list[Finding]) -> list[Finding]:
    """Give each node finding its occurrence among the findings of its rule with the same file, layer and anchor,
    in graph order, so that identical matches in one layer keep distinct, name-free identities."""
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(findings):
        if f.anchor is not None:
            groups.setdefault((f.rule, f.location.file, f.layer, f.anchor), []).append(i)
    out = list(findings)
    for indexes in groups.values():
        if len(indexes) == 1 and out[indexes[0]].occurrence == 0:
            continue
        ordered = sorted(indexes, key=lambda i: (out[i].position is None, out[i].position or 0, i))
        for occurrence, i in enumerate(ordered):
            out[i] = replace(out[i], occurrence=occurrence)
    return out
