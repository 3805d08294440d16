"""com.microsoft.MoEGroupRouter (ort_group_router.json): the release that adds it and the defaults `fix` writes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ortgate.knowledge.loader import KnowledgeError, build, read_json
from ortgate.knowledge.moe_op import parse_version

ORT_GROUP_ROUTER_JSON = Path(__file__).with_name("ort_group_router.json")


@dataclass(frozen=True)
class _Defaults:
    """ort_group_router.json: the schema's attribute defaults."""

    router_sentinel: float
    group_topk: int
    topk_group: int
    n_group: int


@dataclass(frozen=True)
class _Op:
    """ort_group_router.json: the op."""

    domain: str
    op_type: str
    first_release: str
    first_release_source: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    expert_bias_type: str
    defaults: _Defaults
    cpu_types: tuple[str, ...]
    cpu_types_seen: str


@dataclass(frozen=True)
class _GroupRouterFile:
    """ort_group_router.json."""

    schema: Literal[1]
    ort_version: str
    about: str
    op: _Op
    computes: str
    with_moe: str
    with_moe_seen: str


@dataclass(frozen=True)
class GroupRouterFacts:
    domain: str
    op_type: str
    first_release: str
    source: str
    sentinel: float
    cpu_types: tuple[str, ...]
    expert_bias_type: str

    def available(self, release: str | None) -> bool:
        """Whether onnxruntime `release` has the op (False for None or a string that is not a version)."""
        parsed, first = parse_version(release) if release else None, parse_version(self.first_release)
        return parsed is not None and first is not None and parsed >= first


def _load() -> GroupRouterFacts:
    data = build(_GroupRouterFile, read_json(ORT_GROUP_ROUTER_JSON), ORT_GROUP_ROUTER_JSON.name)
    if parse_version(data.op.first_release) is None:
        raise KnowledgeError(f"{ORT_GROUP_ROUTER_JSON.name}: op.first_release is not a version")
    op = data.op
    return GroupRouterFacts(op.domain, op.op_type, op.first_release, op.first_release_source,
                            op.defaults.router_sentinel, op.cpu_types, op.expert_bias_type)


_FACTS = _load()


def group_router_facts() -> GroupRouterFacts:
    """ort_group_router.json, loaded and checked at import."""
    return _FACTS
