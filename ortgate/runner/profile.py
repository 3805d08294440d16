"""ORT's profiling JSON (Chrome trace, `enable_profiling`) summed into tables: where the time of a step goes.

Node events are `{"cat": "Node", "name": "<node>_kernel_time", "dur": us, "args": {"op_name", "provider", ...}}`;
each `model_run` Session event is one run. Runs replayed from a CUDA graph record no node events, so under CUDA
graph the tables describe the warm-up runs before capture.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from ortgate.errors import InputError
from ortgate.evidence import ProfileSummary
from ortgate.knowledge import memcpy_ops

KERNEL_SUFFIX = "_kernel_time"
MEMCPY_OPS = frozenset(memcpy_ops())


def load_profile(path: str | Path) -> list[dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            events = json.load(f)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read ORT's profile: {exc}", path) from None
    if isinstance(events, dict):  # {"traceEvents": [...]} form
        events = events.get("traceEvents", [])
    if not isinstance(events, list):
        raise InputError("not an ORT profile (expected a list of trace events)", path)
    return [e for e in events if isinstance(e, dict)]


def summarize_profile(events: list[dict[str, Any]], *, file: str | None = None, top: int = 25) -> ProfileSummary:
    runs = sum(1 for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    by_op: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    by_provider: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    nodes_by_provider: dict[str, set[str]] = defaultdict(set)
    memcpy_nodes: set[str] = set()
    memcpy_calls = 0
    arena_peak: int | None = None
    total = 0.0
    for event in events:
        name = str(event.get("name", ""))
        if event.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        args = event.get("args") or {}
        op = str(args.get("op_name") or "?")
        provider = str(args.get("provider") or "?")
        duration = float(event.get("dur") or 0.0)
        node = name[: -len(KERNEL_SUFFIX)]
        entry = by_op[(op, provider)]
        entry[0] += 1
        entry[1] += duration
        by_provider[provider][0] += 1
        by_provider[provider][1] += duration
        nodes_by_provider[provider].add(node)
        total += duration
        if op in MEMCPY_OPS:
            memcpy_nodes.add(node)
            memcpy_calls += 1
        peak = args.get("mem_in_use_peak")
        if peak is not None:
            try:
                arena_peak = max(arena_peak or 0, int(peak))
            except (TypeError, ValueError):
                pass
    per_run = max(runs, 1)
    op_rows: list[dict[str, Any]] = [{"op_type": op, "provider": provider, "calls": int(calls), "total_us": round(us, 1),
                "avg_us_per_run": round(us / per_run, 1), "share": round(us / total, 4) if total else 0.0}
               for (op, provider), (calls, us) in by_op.items()]
    op_rows.sort(key=lambda r: (-r["total_us"], r["op_type"]))
    provider_rows: list[dict[str, Any]] = [{"provider": p, "nodes": len(nodes_by_provider[p]), "calls": int(calls),
                      "total_us": round(us, 1), "share": round(us / total, 4) if total else 0.0}
                     for p, (calls, us) in by_provider.items()]
    provider_rows.sort(key=lambda r: (-r["total_us"], r["provider"]))
    note = None
    if runs and not op_rows:
        note = "no node events: runs replayed from a CUDA graph are not profiled per node"
    return ProfileSummary(file, runs, op_rows[:top], provider_rows, len(memcpy_nodes), memcpy_calls, arena_peak, note)
