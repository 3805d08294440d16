"""Baselines: the findings a team has accepted, so that adopting ortgate on an existing model fails only on what
is new.

An entry names a finding by its fingerprint (`Finding.identity`): rule, the file's path relative to the working
directory, decoder layer and the structural signature of the match (the anchor node's op and its occurrence among
the rule's findings in that layer), or the config key. Never a line number and never a node name: a re-export that
renames every node (torch dynamo does) keeps the baseline. Every entry also names the model it was written for
(`model`, its path relative to the working directory): a finding about a shared file (the policy's
`model.moe_layers`) is about one model, and its entry accepts it in that model only. Entries about the policy
alone (rules that judge the policy without a model) name none and accept their finding whatever the model.

Version-3 files named no model (an entry about the policy accepted its finding in every model linted with it),
version-2 files named the file by its name alone (one entry accepted the finding in every model of that name) and
version-1 files named findings by node name; all still load, their entries match by their own identity, lint says
so, and `--prune-baseline` rewrites them as version 4.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Any

from ortgate.config.source import MAX_DOCUMENT_BYTES, format_key_path, load_json
from ortgate.errors import InputError
from ortgate.findings import Finding, model_key

GATE_FAMILY = "OGW"  # findings the gate itself raises about the policy's waivers and the baseline

BASELINE_FORMAT = "ortgate-baseline"
BASELINE_VERSION = 4
V3_VERSION = 3  # fingerprints as now, without the model an entry was written for
V2_VERSION = 2  # fingerprints keyed on the file's name alone
LEGACY_VERSION = 1  # entries keyed by "identity": rule | file | subgraph | node name | properties
# An entry kept from an older file in a rewritten one says which identity its fingerprint is.
ENTRY_SCHEME_KEY = "fingerprint_version"


def _identity_of(finding: Finding, scheme: int) -> str:
    """The fingerprint an entry of `scheme` names a finding by (version 4 is version 3's, plus the entry's model)."""
    if scheme == LEGACY_VERSION:
        return finding.legacy_identity()
    return finding.v2_identity() if scheme == V2_VERSION else finding.identity()


@dataclass
class BaselineEntry:
    """One finding a baseline file lists: its identity key (and which scheme), rule, file and line."""

    key: str  # the fingerprint (version 4, 3 or 2) or the node-name identity (version 1)
    scheme: int  # which identity `key` is: BASELINE_VERSION (or V3_VERSION: the same), V2_VERSION or LEGACY_VERSION
    rule: str | None
    file: str | None  # the file the finding was in (a path relative to the working directory; version 2 and 1:
    # its name), when the entry says
    line: int | None  # where the entry is in the baseline file
    data: dict = field(default_factory=dict)  # the entry as written, to write back when pruning
    model: str | None = None  # the model it was written for (model_key); None: any (about the policy, or older)

    def accepts_model(self, finding: Finding) -> bool:
        return self.model is None or any(model_key(m) == self.model for m in finding.models)


@dataclass
class Baseline:
    """A loaded baseline: its entries. Which of them a run's findings match is the gate's result
    (ortgate.engine.gate.gate), never written into the baseline."""

    path: str | None
    version: int
    entries: list[BaselineEntry]

    def __post_init__(self) -> None:
        self._index: dict[tuple[int, str], list[int]] = {}
        for i, entry in enumerate(self.entries):
            self._index.setdefault((entry.scheme, entry.key), []).append(i)
        self._schemes = sorted({e.scheme for e in self.entries})

    @property
    def modelless(self) -> int:
        """How many entries of a version-3 file (or kept from one) name no model although their finding is in a file
        several models share (the policy, genai_config.json: not an .onnx file, which names its model itself)."""
        return sum(1 for e in self.entries if e.scheme == V3_VERSION and e.model is None
                   and not (e.file or "").endswith(".onnx"))

    @property
    def older_schemes(self) -> list[int]:
        """The older identities some of its entries use (a version-2 or -1 file, or entries kept from one)."""
        return [s for s in self._schemes if s != BASELINE_VERSION]

    def matches(self, finding: Finding) -> list[int]:
        """The indexes of the entries that accept `finding` (none: it is not in the baseline)."""
        return [i for scheme in self._schemes for i in self._index.get((scheme, _identity_of(finding, scheme)), [])
                if self.entries[i].accepts_model(finding)]

    def stale(self, files: Iterable[str], rules: Iterable[str], matched: AbstractSet[int]) -> list[int]:
        """Indexes of the entries that matched nothing (`matched`: the entries a run's findings matched) although
        their file was linted and their rule ran: what they accepted is gone (fixed, or a version-1 entry whose
        node was renamed)."""
        linted = [f for f in files if f]
        names = {PurePath(f).name for f in linted} | {model_key(f) for f in linted}
        ran = set(rules)
        return [i for i, e in enumerate(self.entries) if i not in matched
                and (e.file is None or e.file in names) and (e.rule is None or e.rule in ran)
                and (e.model is None or e.model in names)]  # an entry for a model not linted here is not judged


def baselineable(finding: Finding) -> bool:
    """Gate findings stay out of baselines: a baseline must not silence an expired waiver or its own stale entries."""
    return not finding.code.startswith(GATE_FAMILY)


def entries_for(finding: Finding) -> list[dict]:
    """The baseline entries for `finding`: one per model it was found in (one naming no model for a finding about
    the policy alone)."""
    entry = entry_for(finding)
    return [{**entry, "model": model_key(m)} for m in dict.fromkeys(finding.models)] or [entry]


def entry_for(finding: Finding) -> dict:
    """A baseline entry for `finding`, naming no model: its fingerprint, and what a reader needs to recognise it."""
    entry: dict[str, Any] = {"fingerprint": finding.identity(), "code": finding.code, "rule": finding.rule,
                             "file": model_key(finding.location.file)}
    if finding.layer is not None:
        entry["layer"] = finding.layer
    if finding.node:
        entry["node"] = finding.node  # for the reader: the fingerprint does not depend on it
    if finding.location.key_path:
        entry["key_path"] = finding.location.key_path
    return entry


def _document(entries: Iterable[dict]) -> str:
    unique: dict[Any, dict] = {}
    for entry in entries:
        unique.setdefault((entry.get("fingerprint") or entry.get("identity"), entry.get("model") or ""), entry)
    doc = {"format": BASELINE_FORMAT, "version": BASELINE_VERSION, "findings": [unique[k] for k in sorted(unique)]}
    return json.dumps(doc, allow_nan=False, indent=2, sort_keys=True) + "\n"


def baseline_text(findings: list[Finding]) -> str:
    """The baseline accepting every finding not covered by a waiver (deterministic: sorted, no timestamps)."""
    return _document(e for f in findings
                     if baselineable(f) and (f.suppressed is None or f.suppressed.kind == "baseline")
                     for e in entries_for(f))


def pruned_text(baseline: Baseline, findings: list[Finding], files: Iterable[str], rules: Iterable[str],
                matched: AbstractSet[int]) -> str:
    """`baseline` without its stale entries (`findings`: the gated findings; `matched`: the entries they matched).
    Entries that matched are rewritten as the current version (from the findings they matched); entries this run
    could not judge (their rule did not run, their file was not linted) stay, an older one marked with the identity
    it uses."""
    stale = set(baseline.stale(files, rules, matched))
    kept = []
    for i, e in enumerate(baseline.entries):
        if i in matched or i in stale:
            continue
        kept.append({**e.data, ENTRY_SCHEME_KEY: e.scheme} if e.scheme in (V2_VERSION, V3_VERSION) else e.data)
    for f in findings:
        if baselineable(f) and f.suppressed is not None and f.suppressed.kind == "baseline":
            kept.extend(entries_for(f))
    return _document(kept)


def is_baseline_file(path: str | Path) -> bool:
    try:
        if not Path(path).is_file() or Path(path).stat().st_size > MAX_DOCUMENT_BYTES:
            return False  # a model or a device is never read
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("format") == BASELINE_FORMAT


def baseline_from_text(text: str, path: str) -> Baseline:
    """The Baseline `text` (a document baseline_text or pruned_text wrote, to be written to `path`) is, without
    reading it back: what a command that writes a baseline judges against. Its entries carry no line (every entry
    of a baseline just written matches, or was not judged, so none is reported at its line)."""
    data = json.loads(text)
    entries = []
    for item in data["findings"]:
        fingerprint = item.get("fingerprint")
        key = fingerprint if fingerprint is not None else item["identity"]
        scheme = item.get(ENTRY_SCHEME_KEY, data["version"]) if fingerprint is not None else LEGACY_VERSION
        entries.append(BaselineEntry(key, scheme, item.get("rule"), item.get("file"), None, item,
                                     item.get("model") if scheme == BASELINE_VERSION else None))
    return Baseline(path, data["version"], entries)


def load_baseline(path: str | Path) -> Baseline:
    """An ortgate baseline file (version 1, 2 or 3); anything else is an InputError naming the file and key."""
    hint = "not an ortgate baseline (write one with `ortgate lint --write-baseline FILE`)"
    if not Path(path).exists():
        # The first run of a CI step that passes --baseline before anyone wrote one: say the adoption step.
        raise InputError("no such file: create the baseline once with `ortgate lint MODEL... --policy POLICY "
                         f"--write-baseline {path}` and commit it, or drop --baseline to gate on every finding", path)
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
    if not isinstance(version, int) or isinstance(version, bool) or not LEGACY_VERSION <= version <= BASELINE_VERSION:
        newer = " (written by a newer ortgate: upgrade it)" if isinstance(version, int) and version > 0 else ""
        raise fail(f"{version!r} is not a baseline version this ortgate reads ({LEGACY_VERSION}..{BASELINE_VERSION})"
                   f"{newer}", "version")
    items = data.get("findings")
    if not isinstance(items, list):
        raise fail(f"expected a list, got {type(items).__name__}", "findings")
    entries: list[BaselineEntry] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise fail(f"expected an object, got {type(item).__name__}", "findings", i)
        # Version 3 and 2 entries carry a fingerprint (of their file's version, or the one they say); version-1
        # entries (in any version) an identity.
        fingerprint = item.get("fingerprint") if version >= 2 else None
        key = fingerprint if fingerprint is not None else item.get("identity")
        if not isinstance(key, str) or not key:
            field_name = "fingerprint" if version >= 2 and "identity" not in item else "identity"
            raise fail("expected a non-empty string", "findings", i, field_name)
        scheme = version if fingerprint is not None else LEGACY_VERSION
        if fingerprint is not None and ENTRY_SCHEME_KEY in item:
            scheme = item[ENTRY_SCHEME_KEY]
            if scheme not in (V2_VERSION, V3_VERSION, BASELINE_VERSION) or isinstance(scheme, bool):
                raise fail(f"{scheme!r} is not a fingerprint version ({V2_VERSION}, {V3_VERSION} or "
                           f"{BASELINE_VERSION})", "findings", i, ENTRY_SCHEME_KEY)
        model = item.get("model")
        if model is not None and (not isinstance(model, str) or not model):
            raise fail("expected a non-empty string (the model the entry was written for)", "findings", i, "model")
        rule, file = item.get("rule"), item.get("file")
        entries.append(BaselineEntry(key, scheme, rule if isinstance(rule, str) else None,
                                     file if isinstance(file, str) else None, doc.line_of(("findings", i)), item,
                                     model if scheme == BASELINE_VERSION else None))
    return Baseline(str(path), version, entries)
