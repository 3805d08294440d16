"""Baselines: the identities of findings a team has accepted, so that adopting ortgate on an existing model
fails only on what is new."""

from __future__ import annotations

import json
from pathlib import Path, PurePath

from ortgate.config.source import MAX_DOCUMENT_BYTES, format_key_path, load_json
from ortgate.errors import InputError
from ortgate.findings import Finding

GATE_FAMILY = "OGW"  # findings the gate itself raises about the policy's waivers


# Baselines ---------------------------------------------------------------------------------------------------
# A baseline lists the identities of findings a team has accepted (rule + model-relative node or config key,
# never a line), so that adopting ortgate on an existing model fails only on what is new.

BASELINE_FORMAT = "ortgate-baseline"
BASELINE_VERSION = 1


def baselineable(finding: Finding) -> bool:
    """Waiver findings stay out of baselines: a baseline must not silence an expired waiver."""
    return not finding.code.startswith(GATE_FAMILY)


def baseline_text(findings: list[Finding]) -> str:
    """The baseline accepting every finding not covered by a waiver (deterministic: sorted, no timestamps)."""
    entries: dict[str, dict] = {}
    for f in findings:
        if not baselineable(f) or (f.suppressed is not None and f.suppressed.kind != "baseline"):
            continue
        entries[f.identity()] = {
            "identity": f.identity(),
            "code": f.code,
            "rule": f.rule,
            "file": PurePath(f.location.file).name,
            "target": f.node or f.location.key_path,
        }
    doc = {"format": BASELINE_FORMAT, "version": BASELINE_VERSION,
           "findings": [entries[k] for k in sorted(entries)]}
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def is_baseline_file(path: str | Path) -> bool:
    try:
        if not Path(path).is_file() or Path(path).stat().st_size > MAX_DOCUMENT_BYTES:
            return False  # a model or a device is never read
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == BASELINE_FORMAT


def load_baseline(path: str | Path) -> set[str]:
    """The identities in an ortgate baseline file; anything else is an InputError naming the file and key."""
    hint = "not an ortgate baseline (write one with `ortgate lint --write-baseline FILE`)"
    try:
        doc = load_json(Path(path))
    except InputError as exc:
        if exc.problem.startswith("not valid JSON"):
            raise InputError(f"{exc.problem}; {hint}", path, line=exc.line) from None
        raise
    data = doc.data

    def fail(problem: str, *key: str | int) -> InputError:
        return InputError(f"{format_key_path(key) + ': ' if key else ''}{problem}", path, line=doc.line_of(key))

    if not isinstance(data, dict):
        raise fail(f"expected an object, got {type(data).__name__}; {hint}")
    if data.get("format") != BASELINE_FORMAT:
        raise fail(f"expected {BASELINE_FORMAT!r}, got {data.get('format')!r}; {hint}", "format")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= BASELINE_VERSION:
        raise fail(f"{version!r} is not a baseline version this ortgate reads (1..{BASELINE_VERSION})", "version")
    entries = data.get("findings")
    if not isinstance(entries, list):
        raise fail(f"expected a list, got {type(entries).__name__}", "findings")
    identities: set[str] = set()
    for i, entry in enumerate(entries):
        identity = entry.get("identity") if isinstance(entry, dict) else None
        if not isinstance(identity, str) or not identity:
            raise fail("expected a non-empty string", "findings", i, "identity")
        identities.add(identity)
    return identities
