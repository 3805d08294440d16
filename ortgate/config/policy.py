"""Loading a deployment policy: YAML -> schema check -> `extends` chain -> `Policy`."""

from __future__ import annotations

import datetime as _dt
import difflib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ortgate.config.source import KeyPath, LocatedDocument, format_key_path, load_yaml
from ortgate.errors import InputError
from ortgate.findings import Location

if TYPE_CHECKING:  # imported when a policy is validated: listing rules never needs it
    import jsonschema

SCHEMA_PATH = Path(__file__).with_name("policy.schema.json")
BUILTIN_DIR = Path(__file__).with_name("builtin")
MAX_EXTENDS_DEPTH = 16
_BUILTIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # a file name in builtin/, never a path


@cache
def policy_schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@dataclass(frozen=True)
class Waiver:
    rule: str
    reason: str
    node: str | None
    expires: _dt.date | None
    location: Location


@dataclass
class Policy:
    """A merged, schema-checked policy. `data` is the plain merged mapping; `where` locates any key path."""

    name: str
    path: Path
    data: dict[str, Any]
    sources: dict[KeyPath, Location] = field(default_factory=dict)
    chain: tuple[Path, ...] = ()

    def get(self, *key_path: str, default: Any = None) -> Any:
        node: Any = self.data
        for key in key_path:
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    def where(self, *key_path: str | int) -> Location:
        """The file and line that set this key (after `extends` merging), or its nearest ancestor."""
        path = tuple(key_path)
        while path:
            if path in self.sources:
                loc = self.sources[path]
                return Location(loc.file, loc.line, format_key_path(tuple(key_path)))
            path = path[:-1]
        return Location(str(self.path), None, format_key_path(tuple(key_path)) if key_path else None)

    @property
    def waivers(self) -> list[Waiver]:
        out = []
        for i, w in enumerate(self.get("waivers", default=[]) or []):
            expires = _dt.date.fromisoformat(w["expires"]) if w.get("expires") else None
            out.append(Waiver(w["rule"], w["reason"], w.get("node"), expires, self.where("waivers", i)))
        return out


def load_policy(path: str | Path) -> Policy:
    path = Path(path)
    chain: list[LocatedDocument] = []
    seen: list[Path] = []
    current: Path | None = path
    while current is not None:
        resolved = current.resolve()
        if resolved in seen:
            cycle = " -> ".join(p.name for p in seen + [resolved])
            raise InputError(f"extends cycle: {cycle}", path)
        if len(seen) >= MAX_EXTENDS_DEPTH:
            raise InputError(f"extends chain deeper than {MAX_EXTENDS_DEPTH} files", path)
        seen.append(resolved)
        doc = load_yaml(current)
        _validate(doc)
        chain.append(doc)
        parent = doc.data.get("extends")
        current = _resolve_extends(parent, doc) if parent else None

    merged: dict[str, Any] = {}
    sources: dict[KeyPath, Location] = {}
    for doc in reversed(chain):  # base first, then each child overrides
        _merge(merged, doc.data, (), doc, sources)
    merged.pop("extends", None)
    policy = Policy(merged["name"], path, merged, sources, tuple(d.path for d in chain))
    _check_waiver_dates(policy)
    return policy


def _resolve_extends(target: str, doc: LocatedDocument) -> Path:
    line = doc.line_of(("extends",))
    if target.startswith("builtin:"):
        name = target.split(":", 1)[1]
        candidate = BUILTIN_DIR / f"{name}.yaml"
        if not _BUILTIN_NAME.fullmatch(name) or not candidate.is_file():
            available = ", ".join(sorted(p.stem for p in BUILTIN_DIR.glob("*.yaml")))
            raise InputError(f"extends: no built-in policy {name!r} (available: {available})", doc.path, line=line)
        return candidate
    candidate = Path(os.path.normpath(doc.path.parent / target))  # "a/../b.yaml" shown as "b.yaml"
    if candidate.is_dir() or (candidate.exists() and not candidate.is_file()):
        what = "a directory" if candidate.is_dir() else "not a regular file"
        raise InputError(f"extends: {target!r} is {what}, expected a policy file", doc.path, line=line)
    if not candidate.is_file():
        raise InputError(f"extends: {target!r} does not exist (resolved to {candidate})", doc.path, line=line)
    return candidate


def _merge(into: dict, data: dict, prefix: KeyPath, doc: LocatedDocument, sources: dict[KeyPath, Location]) -> None:
    for key, value in data.items():
        path = prefix + (key,)
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            sources[path] = Location(str(doc.path), doc.line_of(path), format_key_path(path))
            _merge(into[key], value, path, doc, sources)
            continue
        old = into.get(key)
        into[key] = _copy(value)
        # Replacing a subtree forgets where the parent's children came from. Scalars (almost every key) take
        # the fast path: scanning every known key path per key would be quadratic in the policy's size.
        if isinstance(old, (dict, list)):
            for stale in [p for p in sources if p[: len(path)] == path]:
                del sources[stale]
        if isinstance(value, (dict, list)):
            for sub_path, line in doc.lines.items():
                if sub_path[: len(path)] == path:
                    sources[sub_path] = Location(str(doc.path), line, format_key_path(sub_path))
        elif path in doc.lines:
            sources[path] = Location(str(doc.path), doc.lines[path], format_key_path(path))
        else:
            sources.pop(path, None)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _validate(doc: LocatedDocument) -> None:
    if doc.data is None:
        raise InputError("empty policy (expected a mapping with at least `name`)", doc.path)
    if not isinstance(doc.data, dict):
        raise InputError(f"a policy must be a mapping, got {type(doc.data).__name__}", doc.path, line=1)
    import jsonschema

    validator = jsonschema.Draft202012Validator(policy_schema(), format_checker=jsonschema.FormatChecker())
    errors = sorted(validator.iter_errors(doc.data), key=lambda e: (list(map(str, e.absolute_path)), e.message))
    if not errors:
        return
    error = _most_useful(errors)
    key_path = tuple(error.absolute_path)
    message = _describe(error, key_path)
    if error.validator == "additionalProperties":
        unknown = _unknown_keys(error)
        if unknown:
            key_path = key_path + (unknown[0],)
    raise InputError(message, doc.path, line=doc.line_of(key_path))


def _most_useful(errors: list[jsonschema.ValidationError]) -> jsonschema.ValidationError:
    # Deepest first: "options.enable_cuda_graph: must be a string" beats "options: invalid".
    return max(errors, key=lambda e: (len(e.absolute_path), -errors.index(e)))


def _schema_of(error: jsonschema.ValidationError) -> Mapping[str, Any]:
    return error.schema if isinstance(error.schema, Mapping) else {}


def _unknown_keys(error: jsonschema.ValidationError) -> list[str]:
    allowed = set(_schema_of(error).get("properties", {}))
    instance = error.instance if isinstance(error.instance, dict) else {}
    return sorted(k for k in instance if k not in allowed)


def _describe(error: jsonschema.ValidationError, key_path: KeyPath) -> str:
    where = format_key_path(key_path)
    if error.validator == "additionalProperties":
        unknown = _unknown_keys(error)
        allowed = sorted(_schema_of(error).get("properties", {}))
        if unknown:
            key = unknown[0]
            full = format_key_path(key_path + (key,))
            hint = difflib.get_close_matches(key, allowed, n=1)
            suggestion = f"; did you mean {hint[0]!r}?" if hint else f"; allowed keys: {', '.join(allowed)}"
            return f"{full}: unknown key{suggestion}"
    if error.validator == "required":
        return f"{where}: {error.message}"
    if error.validator == "enum":
        choices = ", ".join(str(v) for v in error.validator_value)  # type: ignore[union-attr]  # enum: a list
        return f"{where}: {error.instance!r} is not one of: {choices}"
    if error.validator == "type":
        expected = error.validator_value
        expected = " or ".join(expected) if isinstance(expected, list) else expected
        return f"{where}: expected {expected}, got {type(error.instance).__name__} {error.instance!r}"
    if error.validator == "format" and error.validator_value == "date":
        return f"{where}: {error.instance!r} is not a date (expected YYYY-MM-DD)"
    return f"{where}: {error.message}"


def _check_waiver_dates(policy: Policy) -> None:
    for i, w in enumerate(policy.get("waivers", default=[]) or []):
        if not str(w.get("reason", "")).strip():
            loc = policy.where("waivers", i, "reason")
            raise InputError(f"waivers[{i}].reason: a waiver needs a reason (why the finding is acceptable, and until when)",
                             loc.file, line=loc.line)
        if w.get("expires"):
            try:
                _dt.date.fromisoformat(str(w["expires"]))
            except ValueError:
                loc = policy.where("waivers", i, "expires")
                raise InputError(
                    f"waivers[{i}].expires: {w['expires']!r} is not a date (expected YYYY-MM-DD)", loc.file, line=loc.line
                ) from None
