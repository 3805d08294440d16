"""What adds a KV cache to a decoder export, per exporter (cache_exports.json).

    from ortgate.knowledge.cache_exports import cache_export
    cache_export("pytorch", has_dynamo_metadata=True).adds_cache   # the export call with a cache
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ortgate.knowledge.loader import build, read_json

CACHE_EXPORTS_JSON = Path(__file__).with_name("cache_exports.json")


@dataclass(frozen=True)
class CacheExport:
    """An exporter's way of adding a KV cache to a decoder export (cache_exports.json)."""

    label: str  # how messages name the exporter
    producer_names: tuple[str, ...]  # ModelProto.producer_name values it records
    # A node metadata key prefix only this exporter writes (None: it writes none; told apart by its absence)
    node_metadata_prefix: str | None
    adds_cache: str  # what to run for an export with the cache
    source: str


@dataclass(frozen=True)
class _CacheExportsFile:
    """cache_exports.json."""

    schema: Literal[1]
    about: str
    reflects: Mapping[str, str]
    exporters: Mapping[str, CacheExport]
    otherwise: str  # for a model no entry names


_DATA = build(_CacheExportsFile, read_json(CACHE_EXPORTS_JSON), CACHE_EXPORTS_JSON.name)


def cache_export(producer_name: str, metadata_keys: frozenset[str] | set[str]) -> CacheExport | None:
    """The exporter that wrote a model recording `producer_name`, whose nodes carry `metadata_keys`; None when the
    data names none (say `cache_export_otherwise()`)."""
    name = (producer_name or "").strip().lower()
    candidates = [e for e in _DATA.exporters.values() if name in (p.lower() for p in e.producer_names)]
    for entry in candidates:  # an exporter known by the metadata it writes first, then the one that writes none
        prefix = entry.node_metadata_prefix
        if prefix is not None and any(k.startswith(prefix) for k in metadata_keys):
            return entry
    return next((e for e in candidates if e.node_metadata_prefix is None), None)


def cache_export_otherwise() -> str:
    return _DATA.otherwise
