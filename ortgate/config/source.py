"""Reading YAML (and JSON) documents safely while remembering the line of every key.

Only `yaml.SafeLoader` (libyaml's CSafeLoader when installed) is used, and it never constructs anything but
plain scalars: ortgate builds the mappings and lists itself. Aliases are refused outright (a policy has no
use for them, and they are how "billion laughs" documents explode), so are tags other than YAML's plain
scalar/mapping/sequence ones (`!!python/object`, `!!binary`, ...), merge keys and nesting deeper than
MAX_NESTING; duplicate keys are an error instead of silently taking the last. Files are read only when they
are regular files of at most MAX_DOCUMENT_BYTES, so a FIFO or a device can not hang a CI job.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ortgate.errors import LFS_POINTER_PROBLEM, InputError, is_lfs_pointer

KeyPath = tuple  # of str | int

MAX_DOCUMENT_BYTES = 1024 * 1024  # policies and genai_config.json files are a few kilobytes
MAX_NESTING = 64  # policies nest 4 levels deep; pure-Python YAML scanning is quadratic in flow nesting
# Every number an ortgate file holds (targets, dims, figures, timeouts) lies well inside these bounds; a value
# outside them is a typo or an attack, and would overflow a float or divide by zero downstream.
MAX_NUMBER = 1e15
MIN_NONZERO_NUMBER = 1e-9

# libyaml when present: linear time and memory on hostile documents (the Python scanner is not).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null", "map", "seq"))
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"


def format_key_path(path: KeyPath) -> str:
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "<document>"


@dataclass
class LocatedDocument:
    """A parsed document plus the line (1-based) of each key path."""

    path: Path
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)

    def line_of(self, key_path: KeyPath) -> int | None:
        """The line of this key, or of its nearest ancestor that has one."""
        path = tuple(key_path)
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get((), None)


def _read_text(path: Path) -> str:
    try:
        if not path.exists():
            raise InputError("no such file", path)
        if path.is_dir():
            raise InputError("is a directory, expected a file", path)
        if not path.is_file():
            raise InputError("not a regular file (a device, FIFO or socket is never read)", path)
        size = path.stat().st_size
        too_big = f"configuration files over {MAX_DOCUMENT_BYTES} bytes are refused"
        if size > MAX_DOCUMENT_BYTES:
            raise InputError(f"file is {size} bytes; {too_big}", path)
        with open(path, "rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)  # the file may grow between stat and read
        if len(data) > MAX_DOCUMENT_BYTES:
            raise InputError(too_big, path)
        if is_lfs_pointer(data[:64]):
            raise InputError(LFS_POINTER_PROBLEM, path)
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None


def load_yaml(path: Path) -> LocatedDocument:
    text = _read_text(path)
    try:
        _check_events(text, path)
        root = yaml.compose(text, Loader=_LOADER)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise InputError(f"invalid YAML: {exc.problem or exc.context}", path, line=line) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", path) from None
    except RecursionError:
        raise InputError("YAML nesting is too deep", path) from None
    doc = LocatedDocument(path, None)
    if root is None:
        return doc
    try:
        doc.data = _construct(root, (), doc)
    except RecursionError:
        raise InputError("YAML nesting is too deep", path) from None
    return doc


def _check_events(text: str, path: Path) -> None:
    """Refuse aliases, tags and deep nesting while streaming the parse events, before anything is built."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.AliasEvent):
            raise InputError("YAML aliases (*name) are not allowed in ortgate files", path, line=line)
        tag = getattr(event, "tag", None)
        if tag is not None and tag != "!" and tag not in _PLAIN_TAGS:
            shown = tag.replace("tag:yaml.org,2002:", "!!")
            raise InputError(f"YAML tag {shown} is not allowed in ortgate files", path, line=line)
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_NESTING:
                raise InputError(f"YAML nesting is too deep (more than {MAX_NESTING} levels)", path, line=line)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON value")


def load_json(path: Path) -> LocatedDocument:
    """JSON with key lines (JSON is valid YAML flow syntax, so the YAML composer finds the lines)."""
    text = _read_text(path).removeprefix("\ufeff")  # a UTF-8 byte order mark, as YAML (and RFC 8259) allow
    try:
        data = json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (column {exc.colno})", path, line=exc.lineno) from None
    except RecursionError:
        raise InputError("JSON nesting is too deep", path) from None
    except ValueError as exc:  # NaN/Infinity, integers of more than 4300 digits
        raise InputError(f"not valid JSON: {exc}", path) from None
    doc = LocatedDocument(path, data)
    try:
        root = yaml.compose(text, Loader=_LOADER)
        if root is not None:
            _collect_lines(root, (), doc.lines)
    except (yaml.YAMLError, RecursionError):  # line numbers are a nicety for JSON; the data came from json.loads
        pass
    return doc


_SCALAR_CONSTRUCTOR = yaml.SafeLoader("")


def _construct(node: yaml.Node, path: KeyPath, doc: LocatedDocument) -> Any:
    doc.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise InputError("mapping keys must be plain scalars", doc.path, line=key_node.start_mark.line + 1)
            if key_node.tag == _MERGE_TAG:
                raise InputError("YAML merge keys (<<) are not allowed in ortgate files", doc.path,
                                 line=key_node.start_mark.line + 1)
            key = _scalar(key_node, doc, path)
            key = key if isinstance(key, str) else str(key)
            if key in out:
                raise InputError(
                    f"duplicate key {format_key_path(path + (key,))}", doc.path, line=key_node.start_mark.line + 1
                )
            doc.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, path + (key,), doc)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, path + (i,), doc) for i, item in enumerate(node.value)]
    value = _scalar(node, doc, path)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        problem = number_problem(value)
        if problem is not None:
            raise InputError(f"{format_key_path(path)}: {problem}", doc.path, line=node.start_mark.line + 1)
    return value


def number_problem(value: int | float) -> str | None:
    """Why a number is refused in an ortgate file (None: it is fine): NaN and the infinities are not numbers JSON
    can carry, and magnitudes beyond MAX_NUMBER or below MIN_NONZERO_NUMBER mean nothing a policy can ask for."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number (NaN and infinities are refused)"
    if isinstance(value, int) and value.bit_length() > 64 or abs(value) > MAX_NUMBER:
        digits = len(str(abs(value))) if isinstance(value, int) and value.bit_length() <= 4000 else None
        shown = f"a number of {digits} digits" if digits and digits > 20 else f"{value!r}"
        return f"{shown} is out of range (numbers in ortgate files lie within +-{MAX_NUMBER:g})"
    if value != 0 and abs(value) < MIN_NONZERO_NUMBER:
        return f"{value!r} is out of range (a number other than 0 is at least {MIN_NONZERO_NUMBER:g} in magnitude)"
    return None


def _scalar(node: yaml.Node, doc: LocatedDocument, path: KeyPath = ()) -> Any:
    try:
        value = _SCALAR_CONSTRUCTOR.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        where = f"{format_key_path(path)}: " if path else ""
        shown = node.value if len(node.value) <= 80 else f"{node.value[:60]}... ({len(node.value)} characters)"
        if node.tag == _TIMESTAMP_TAG:
            # Kept as the text written: where a date is expected the schema says it is not one, with every other
            # problem of the document (`ortgate policy validate` lists them all).
            return node.value
        else:
            problem = f"invalid value {shown!r}: {' '.join(str(exc).split())}"
        raise InputError(f"{where}{problem}", doc.path, line=node.start_mark.line + 1) from None
    finally:
        _SCALAR_CONSTRUCTOR.constructed_objects.clear()  # it caches every node it built: keep nothing
    if isinstance(value, (_dt.date, _dt.datetime)):
        return value.isoformat()  # the schema checks dates as strings; keep the text the user wrote
    if isinstance(value, bytes):
        raise InputError("binary values are not allowed", doc.path, line=node.start_mark.line + 1)
    return value


def _collect_lines(node: yaml.Node, path: KeyPath, lines: dict[KeyPath, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = str(key_node.value)
            lines[path + (key,)] = key_node.start_mark.line + 1
            _collect_lines(value_node, path + (key,), lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _collect_lines(item, path + (i,), lines)
