"""Loading a deployment policy: YAML -> schema check -> `extends` chain -> `Policy`.

A child policy overrides its base key by key: mappings merge, lists and scalars replace, and `null` removes the
key it names (inherited or not). Every problem of every file in the chain is collected (PolicyErrors, in file and
line order); `ortgate lint` reports the first, `ortgate policy validate` all of them."""

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

from ortgate.config.schema_check import verdict
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
    """One entry of a policy's `waivers:`: the rule (and node or layers) it accepts, why, and until when."""

    rule: str
    reason: str
    node: str | None
    expires: _dt.date | None
    location: Location
    layers: frozenset[int] | None = None  # the decoder layers it covers (None: every finding of its rule)


class PolicyErrors(InputError):
    """Every problem found in a policy and its `extends` chain; reads as the first one."""

    def __init__(self, problems: list[InputError]):
        self.problems = problems
        first = problems[0]
        super().__init__(first.problem, first.path, line=first.line)


@dataclass
class Policy:
    """A merged, schema-checked policy. `data` is the plain merged mapping; `where` locates any key path."""

    name: str
    path: Path
    data: dict[str, Any]
    sources: dict[KeyPath, Location] = field(default_factory=dict)
    chain: tuple[Path, ...] = ()
    removed: dict[KeyPath, Location] = field(default_factory=dict)  # keys a `null` removed, and where
    extends_lines: dict[str, int] = field(default_factory=dict)  # file of the chain -> the line of its `extends`

    def get(self, *key_path: str, default: Any = None) -> Any:
        node: Any = self.data
        for key in key_path:
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        return node

    def where(self, *key_path: str | int) -> Location:
        """Where a finding about this key points: the file and line that set it (after `extends` merging), or its
        nearest ancestor's. A value inherited from a built-in base points at the user's `extends` line that brought
        it in: the installed package is not a file to edit (`origin` tells where the value really is)."""
        loc = self.origin(*key_path)
        if is_builtin(loc.file):
            user = [str(p) for p in self.chain if not is_builtin(str(p))]
            if user and user[-1] in self.extends_lines:
                return Location(user[-1], self.extends_lines[user[-1]], loc.key_path)
        return loc

    def origin(self, *key_path: str | int) -> Location:
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
            if not isinstance(w, dict) or not isinstance(w.get("rule"), str):
                continue  # a malformed waiver is a schema problem, reported as such
            try:
                expires = _dt.date.fromisoformat(str(w["expires"])) if w.get("expires") else None
            except ValueError:
                expires = None  # reported by the date check
            out.append(Waiver(w["rule"], str(w.get("reason", "")), w.get("node"), expires, self.where("waivers", i),
                              _layers(w.get("layers"))))
        return out


def _layers(value: Any) -> frozenset[int] | None:
    """A waiver's `layers:` ([0, "2-5"]) as a set of layer numbers; None when it has none (or the schema refused it)."""
    if not isinstance(value, list):
        return None
    out: set[int] = set()
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            out.add(item)
        elif isinstance(item, str) and re.fullmatch(r"\d{1,6}-\d{1,6}", item):
            low, high = (int(x) for x in item.split("-"))
            out.update(range(low, high + 1))
    return frozenset(out)


def load_policy(path: str | Path) -> Policy:
    """The merged policy; PolicyErrors (an InputError) holding every problem of the chain when there is one."""
    policy, problems = check_policy_file(path)
    if problems or policy is None:
        raise PolicyErrors(problems)
    return policy


def check_policy_file(path: str | Path) -> tuple[Policy | None, list[InputError]]:
    """Load `path` and its `extends` chain, collecting every problem instead of stopping at the first: each
    file's schema violations, the chain's, the merged policy's, the waivers'. Problems are in chain order (the
    file given first), then line order. The policy is None when the chain could not be read; with problems it is
    merged as far as it goes (for checks that look at the rest of it), and must not be used otherwise."""
    path = Path(path)
    chain: list[LocatedDocument] = []
    problems: list[list[InputError]] = []  # per file of the chain
    seen: list[Path] = []
    current: Path | None = path
    complete = False
    while current is not None:
        resolved = current.resolve()
        here: list[InputError] = []
        problems.append(here)
        if resolved in seen:
            cycle = " -> ".join(p.name for p in seen + [resolved])
            here.append(InputError(f"extends cycle: {cycle}", path))
            break
        if len(seen) >= MAX_EXTENDS_DEPTH:
            here.append(InputError(f"extends chain deeper than {MAX_EXTENDS_DEPTH} files", path))
            break
        seen.append(resolved)
        try:
            doc = load_yaml(current)
        except InputError as exc:
            here.append(exc)
            break
        here += _schema_problems(doc)
        if not isinstance(doc.data, dict):
            break
        chain.append(doc)
        parent = doc.data.get("extends")
        if parent is not None and not isinstance(parent, str):
            break  # the schema said what is wrong with it
        try:
            current = _resolve_extends(parent, doc) if parent else None
        except InputError as exc:
            here.append(exc)
            break
    else:
        complete = True
    flat = [p for file_problems in problems for p in sorted(file_problems, key=lambda e: e.line or 0)]
    if not complete:
        return None, flat  # the chain could not be read to its end

    merged: dict[str, Any] = {}
    sources: dict[KeyPath, Location] = {}
    removed: dict[KeyPath, Location] = {}
    for doc in reversed(chain):  # base first, then each child overrides
        _merge(merged, doc.data, (), doc, sources, removed)
    merged.pop("extends", None)
    extends_lines = {str(d.path): line for d in chain if (line := d.line_of(("extends",))) and "extends" in d.data}
    policy = Policy(merged.get("name", ""), path, merged, sources, tuple(d.path for d in chain), removed,
                    extends_lines)
    more = (_merged_problems(policy) if not flat else []) + _waiver_problems(policy)
    unique = {(e.path, e.line, e.problem): e for e in flat + more}  # the schema and the waiver check may agree
    return policy, sorted(unique.values(), key=lambda e: (_chain_index(policy, e.path), e.line or 0))


def is_builtin(file: str | Path) -> bool:
    """Whether `file` is one of the policies shipped in the package (builtin:NAME)."""
    try:
        return Path(file).resolve().parent == BUILTIN_DIR.resolve()
    except (OSError, RuntimeError):
        return False


def display_source(file: str | Path) -> str:
    """How to name a policy file to the user: builtin:NAME for a shipped base, else the path."""
    return f"builtin:{Path(file).stem}" if is_builtin(file) else str(file)


def _chain_index(policy: Policy, file: str | None) -> int:
    names = [str(p) for p in policy.chain]
    return names.index(file) if file in names else len(names)


def _resolve_extends(target: str, doc: LocatedDocument) -> Path:
    line = doc.line_of(("extends",))
    if "\0" in target:  # no file system path holds one: os calls raise ValueError on it
        raise InputError(f"extends: {target!r} holds a NUL byte, which no file name can", doc.path, line=line)
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
    confine(candidate, doc.path, f"extends: {target!r}", line, "a base")
    if not candidate.is_file():
        raise InputError(f"extends: {target!r} does not exist (resolved to {candidate})", doc.path, line=line)
    return candidate


# Pseudo-file systems and devices: never a policy, and reading them can block (/dev/stdin) or leak (/proc/self/environ).
_SYSTEM_TREES = frozenset({"proc", "sys", "dev"})


def confine(candidate: Path, policy: Path, key: str, line: int | None, what: str) -> Path:
    """The one rule for a file a policy names (`extends:`, `throughput.calibration`): once every symlink is
    followed (in the file's name and in the folders that lead to it) it is inside the working directory, the
    policy's folder or the repository that holds the policy, and never under /proc, /sys or /dev. Returns the
    resolved path; InputError (at `policy`'s `line`) otherwise."""
    try:
        real = candidate.resolve(strict=False)
    except (OSError, RuntimeError):
        raise InputError(f"{key} cannot be resolved (a loop of symbolic links?)", policy, line=line) from None
    system = next((p.parts[1] for p in (candidate.absolute(), real) if p.parts[1:2] and p.parts[1] in _SYSTEM_TREES),
                  None)
    if system is not None:
        raise InputError(f"{key} is in /{system}, not a policy's file; ortgate does not read it", policy, line=line)
    roots = _extends_roots(policy)
    if not any(real.is_relative_to(root) for root in roots):
        raise InputError(f"{key} ({real}) is outside the working directory and the repository of {policy.name}; "
                         f"ortgate reads {what} there only when it is given on the command line itself (copy it "
                         "next to the policy, or run from a folder that holds it)", policy, line=line)
    return real


def _extends_roots(policy: Path) -> list[Path]:
    """Where a policy's `extends` (or calibration file) may lead (after symlinks): the working directory and the
    repository that holds the policy (the nearest folder above it with a .git), or the policy's own folder when it
    is in none. The policy named on the command line may be anywhere; what it pulls in may not. The policy's folder
    is the one that holds the file as named: a policy that is itself a symbolic link opens no door to the folder
    it points into."""
    try:
        here = Path(os.path.abspath(policy.parent)).resolve()
    except (OSError, RuntimeError):
        here = Path(os.path.abspath(policy.parent))
    roots = [Path.cwd().resolve(), here]
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            roots.append(folder)
            break
    return roots


def _merge(into: dict, data: dict, prefix: KeyPath, doc: LocatedDocument, sources: dict[KeyPath, Location],
           removed: dict[KeyPath, Location]) -> None:
    for key, value in data.items():
        path = prefix + (key,)
        if value is None:  # `key: null` removes the key, inherited or not
            into.pop(key, None)
            for stale in [p for p in sources if p[: len(path)] == path]:
                del sources[stale]
            removed[path] = Location(str(doc.path), doc.line_of(path), format_key_path(path))
            continue
        removed.pop(path, None)
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            sources[path] = Location(str(doc.path), doc.line_of(path), format_key_path(path))
            _merge(into[key], value, path, doc, sources, removed)
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
    if isinstance(value, dict):  # a `null` in a mapping that replaces (nothing inherited there) removes nothing
        return {k: _copy(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _without_nulls(value: Any) -> Any:
    """A document as the schema sees it: `key: null` (a removal) is not a value."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _schema_problems(doc: LocatedDocument) -> list[InputError]:
    if doc.data is None:
        return [InputError("empty policy (expected a mapping with at least `name`)", doc.path)]
    if not isinstance(doc.data, dict):
        return [InputError(f"a policy must be a mapping, got {type(doc.data).__name__}", doc.path, line=1)]
    problems = _violations(_without_nulls(doc.data), lambda key_path: (str(doc.path), doc.line_of(key_path)),
                           raw=doc.data, partial="extends" in doc.data)
    return problems


def _merged_problems(policy: Policy) -> list[InputError]:
    """What only the merged policy violates: a key another file needs, removed by a `null`."""

    def locate(key_path: KeyPath) -> tuple[str, int | None]:
        path = tuple(key_path)
        while path:
            if path in policy.removed:
                return policy.removed[path].file, policy.removed[path].line
            if path in policy.sources:
                return policy.sources[path].file, policy.sources[path].line
            path = path[:-1]
        return str(policy.path), None

    return _violations(policy.data, locate)


def _violations(data: dict, locate, raw: Any = None, partial: bool = False) -> list[InputError]:
    """Every schema violation of `data`, one problem each (one per unknown key), located by `locate(key_path)`.
    `raw` is the document with its nulls, to say so when a required key is missing because it was set to null.
    `partial`: a document that extends another may leave a nested required key (execution_provider.name) to its
    base; the merged policy is checked for it."""
    if verdict(policy_schema(), data) is True:  # plainly valid: no need to import and run jsonschema
        return []
    import jsonschema

    validator = jsonschema.Draft202012Validator(policy_schema(), format_checker=jsonschema.FormatChecker())
    out = []
    for error in validator.iter_errors(data):
        key_path = tuple(error.absolute_path)
        if partial and error.validator == "required" and key_path and _nulled_required(error, key_path, raw) is None:
            continue
        nulled = _nulled_required(error, key_path, raw)
        if nulled is not None:
            file, line = locate(key_path + (nulled,))
            expected = error.schema.get("properties", {}).get(nulled, {}).get("type", "a value")
            out.append(InputError(f"{format_key_path(key_path + (nulled,))}: expected {expected}, got null (a null "
                                  "removes a key, and this one is required)", file, line=line))
            continue
        unknown: list[str | None] = list(_unknown_keys(error)) if error.validator == "additionalProperties" else []
        for key in unknown or [None]:
            where = key_path + (key,) if key is not None else key_path
            file, line = locate(where)
            out.append(InputError(_describe(error, key_path, key), file, line=line))
    return out


def _nulled_required(error, key_path: KeyPath, raw: Any) -> str | None:
    """The required key that `raw` sets to null, when that is what this error is about."""
    if error.validator != "required" or raw is None:
        return None
    node = raw
    for key in key_path:
        node = node.get(key) if isinstance(node, dict) else None
    if not isinstance(node, dict):
        return None
    return next((k for k in error.validator_value if k in node and node[k] is None), None)


def _schema_of(error: jsonschema.ValidationError) -> Mapping[str, Any]:
    return error.schema if isinstance(error.schema, Mapping) else {}


def _unknown_keys(error: jsonschema.ValidationError) -> list[str]:
    allowed = set(_schema_of(error).get("properties", {}))
    instance = error.instance if isinstance(error.instance, dict) else {}
    return sorted(k for k in instance if k not in allowed)


def _describe(error: jsonschema.ValidationError, key_path: KeyPath, unknown_key: str | None = None) -> str:
    where = format_key_path(key_path)
    if error.validator == "additionalProperties":
        # The caller names the key: listing the unknown keys again per key would be quadratic in their number.
        key = unknown_key if unknown_key is not None else next(iter(_unknown_keys(error)), None)
        allowed = sorted(_schema_of(error).get("properties", {}))
        if key is not None:
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


def _waiver_problems(policy: Policy) -> list[InputError]:
    out = []
    for i, w in enumerate(policy.get("waivers", default=[]) or []):
        if not isinstance(w, dict):
            continue  # the schema said so already
        if "reason" in w and not str(w["reason"]).strip():  # a missing reason is the schema's
            loc = policy.where("waivers", i, "reason")
            out.append(InputError(f"waivers[{i}].reason: a waiver needs a reason (why the finding is acceptable, and "
                                  "until when)", loc.file, line=loc.line))
        if w.get("expires"):
            try:
                _dt.date.fromisoformat(str(w["expires"]))
            except ValueError:
                loc = policy.where("waivers", i, "expires")
                out.append(InputError(f"waivers[{i}].expires: {w['expires']!r} is not a date (expected YYYY-MM-DD)",
                                      loc.file, line=loc.line))
    return out
