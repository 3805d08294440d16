"""The com.microsoft.MoE contract and the ORT releases whose MoE kernels miscompute it (ort_moe.json)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ortgate.knowledge.contracts import op_contract
from ortgate.knowledge.loader import KnowledgeError, build, read_json
from ortgate.knowledge.moe import formal_inputs

ORT_MOE_JSON = Path(__file__).with_name("ort_moe.json")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """'1.27.1' -> (1, 27, 1); '1.28.0.dev20260601' -> (1, 28, 0); None when it is not a version."""
    match = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


@dataclass(frozen=True)
class SwigluGate:
    """The ORT release that fixed com.microsoft.MoE's SwiGLU, and what the defect does before it."""

    issue: str
    fixed_by: str
    first_fixed_release: str
    effect: str
    sources: tuple[str, ...]

    def affects(self, version: str) -> bool | None:
        """Whether ORT `version` computes SwiGLU with GPT-OSS constants whatever the attributes say (None: not a
        version)."""
        parsed, fixed = parse_version(version), parse_version(self.first_fixed_release)
        if parsed is None or fixed is None:
            return None
        return parsed < fixed


@dataclass(frozen=True)
class InplaceTrigger:
    """What makes ORT's CPU MoE kernel take over its input's buffer."""

    normalize_routing_weights: int  # the attribute value under which the kernel reads its input after zeroing output
    input: str
    output: str
    shapes: str


@dataclass(frozen=True)
class InplaceWorkaround:
    """A graph form that avoids the in-place defect."""

    form: str
    what: str
    seen: str


@dataclass(frozen=True)
class InplaceDefect:
    """ORT's CPU com.microsoft.MoE computing wrong values when its output takes over its input's buffer."""

    effect: str
    provider: str
    releases_seen_affected: tuple[str, ...]
    releases_not_tried: tuple[str, ...]
    first_seen_fixed: str
    trigger: InplaceTrigger
    mechanism: str
    not_affected_seen: str
    workaround: InplaceWorkaround
    cuda: str
    sources: tuple[str, ...]

    def status(self, version: str | None) -> Literal["affected", "presumed affected", "fixed", "unknown"]:
        """What is known of ORT `version`: seen affected; between two releases seen affected, or between the last
        seen affected and the first seen fixed, and not tried ("presumed affected"); at or after the first release
        seen fixed; or "unknown" (not a version, or older than any release tried)."""
        parsed = parse_version(version) if version else None
        if parsed is None:
            return "unknown"
        seen = [v for v in (parse_version(r) for r in self.releases_seen_affected) if v is not None]
        fixed = parse_version(self.first_seen_fixed)
        if fixed is not None and parsed >= fixed:
            return "fixed"
        if parsed in seen:
            return "affected"
        if seen and min(seen) <= parsed:
            return "presumed affected"
        return "unknown"

    def affects(self, version: str | None) -> bool:
        return self.status(version) in ("affected", "presumed affected")

    def triggered_by(self, normalize_routing_weights: int | None) -> bool:
        """Whether a node with this attribute value (None: absent, ORT's default 0) can hit the defect."""
        return (normalize_routing_weights or 0) == self.trigger.normalize_routing_weights


@dataclass(frozen=True)
class SparseMixer:
    """use_sparse_mixer (PhiMoE's sparsemixer routing) as ORT's kernels compute it."""

    k: int
    cpu_implemented: bool
    cpu_routes_as: str
    cpu_seen: str
    cuda_jitter_eps: float
    cuda_experts: tuple[int, ...]


@dataclass(frozen=True)
class MoeOpFacts:
    """ort_moe.json, checked: com.microsoft.MoE's inputs, layouts and known defects."""

    ort_version: str
    inputs: tuple[str, ...]
    min_inputs: int
    min_inputs_since: str
    cpu_swiglu_fusion: int
    square_layout: str  # what the reference release reads a square fc1/fc2 as: "new" ([E, N, K])
    square_seen: str
    swiglu_gate: SwigluGate
    sparse_mixer: SparseMixer
    inplace_defect: InplaceDefect

    def input_position(self, name: str) -> int:
        return self.inputs.index(name)

    def square_layout_note(self, hidden: int | None, intermediate: int | None) -> str:
        which = "fc2 [E, H, I] is square" if hidden == intermediate else "fc1 [E, 2I, H] is square"
        return (f"hidden {hidden} and intermediate {intermediate}: {which}, which older ORT releases could read as "
                f"the legacy transposed layout; written as [E, N, K], which ORT {self.ort_version} reads as such "
                f"({self.square_seen}); the verification run is what confirms it")


# ---- ort_moe.json, as its schema ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SourcedCount:
    """ort_moe.json: a count with the version it holds since and its source."""

    value: int
    since: str
    source: str


@dataclass(frozen=True)
class _Op:
    """ort_moe.json: the op and its inputs."""

    domain: str
    op_type: str
    inputs: tuple[str, ...]
    min_inputs: _SourcedCount
    router_probs: str


@dataclass(frozen=True)
class _SquareSeen:
    """ort_moe.json: what a square expert weight was seen to mean."""

    value: Literal["new", "legacy"]
    what: str
    seen: str


@dataclass(frozen=True)
class _Layout:
    """ort_moe.json: the expert weight layouts."""

    fc1: str
    fc2: str
    since: str
    square_seen: _SquareSeen


@dataclass(frozen=True)
class _SourcedValue:
    """ort_moe.json: a value with its source."""

    value: int
    source: str


@dataclass(frozen=True)
class _SwigluReleaseGate:
    """ort_moe.json: the SwiGLU release gate."""

    issue: str
    fixed_by: str
    first_fixed_release: str
    effect: str
    providers: tuple[str, ...]
    sources: tuple[str, ...]
    seen_correct: str


@dataclass(frozen=True)
class _SparseMixer:
    """ort_moe.json: use_sparse_mixer."""

    attribute: str
    k: int
    k_source: str
    cpu_implemented: bool
    cpu_routes_as: str
    cpu_seen: str
    cuda_jitter_eps: float
    cuda_experts: tuple[int, ...]
    cuda_source: str


@dataclass(frozen=True)
class _InplaceDefect:
    """ort_moe.json: the CPU in-place defect."""

    effect: str
    provider: str
    releases_seen_affected: tuple[str, ...]
    releases_not_tried: tuple[str, ...]
    first_seen_fixed: str
    trigger: InplaceTrigger
    mechanism: str
    not_affected_seen: str
    workaround: InplaceWorkaround
    cuda: str
    sources: tuple[str, ...]


@dataclass(frozen=True)
class _OrtMoeFile:
    """ort_moe.json."""

    schema: Literal[1]
    ort_version: str
    about: str
    op: _Op
    layout: _Layout
    cpu_swiglu_fusion: _SourcedValue
    swiglu_release_gate: _SwigluReleaseGate
    sparse_mixer: _SparseMixer
    cpu_inplace_defect: _InplaceDefect


def _load() -> MoeOpFacts:
    data = build(_OrtMoeFile, read_json(ORT_MOE_JSON), ORT_MOE_JSON.name)
    formal = formal_inputs(data.op.domain, data.op.op_type)
    if data.op.inputs != formal:
        raise KnowledgeError(f"{ORT_MOE_JSON.name}: op.inputs {list(data.op.inputs)} differ from the kernel table's "
                             f"formal inputs of {data.op.domain}.{data.op.op_type} {list(formal)}")
    if parse_version(data.swiglu_release_gate.first_fixed_release) is None:
        raise KnowledgeError(f"{ORT_MOE_JSON.name}: swiglu_release_gate.first_fixed_release is not a version")
    defect = data.cpu_inplace_defect
    for release in (*defect.releases_seen_affected, defect.first_seen_fixed):
        if parse_version(release) is None:
            raise KnowledgeError(f"{ORT_MOE_JSON.name}: cpu_inplace_defect release {release!r} is not a version")
    gate = data.swiglu_release_gate
    mixer = data.sparse_mixer
    contract = op_contract(data.op.domain, data.op.op_type, None)
    if contract is None or mixer.attribute not in contract.attributes:
        raise KnowledgeError(f"{ORT_MOE_JSON.name}: sparse_mixer.attribute {mixer.attribute!r} is not an attribute of "
                             f"{data.op.domain}.{data.op.op_type}")
    return MoeOpFacts(
        ort_version=data.ort_version,
        inputs=data.op.inputs,
        min_inputs=data.op.min_inputs.value,
        min_inputs_since=data.op.min_inputs.since,
        cpu_swiglu_fusion=data.cpu_swiglu_fusion.value,
        square_layout=data.layout.square_seen.value,
        square_seen=data.layout.square_seen.seen,
        swiglu_gate=SwigluGate(gate.issue, gate.fixed_by, gate.first_fixed_release, gate.effect, gate.sources),
        sparse_mixer=SparseMixer(mixer.k, mixer.cpu_implemented, mixer.cpu_routes_as, mixer.cpu_seen,
                                 mixer.cuda_jitter_eps, mixer.cuda_experts),
        inplace_defect=InplaceDefect(**{f: getattr(defect, f) for f in InplaceDefect.__dataclass_fields__}),
    )


_FACTS = _load()


def moe_op_facts() -> MoeOpFacts:
    """ort_moe.json, loaded and checked at import (its input list against the kernel table's)."""
    return _FACTS
