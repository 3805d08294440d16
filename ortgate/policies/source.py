"""Reading YAML (and JSON) documents safely while remembering the line of every key.

Only `yaml.SafeLoader` is used; aliases are refused outright (a policy has no use for them, and they are
how "billion laughs" documents explode); duplicate keys are an error instead of silently taking the last.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ortgate.errors import InputError

KeyPath = tuple  # of str | int

MAX_DOCUMENT_BYTES = 4 * 1024 * 1024


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
    if not path.exists():
        raise InputError("no such file", path)
    if path.is_dir():
        raise InputError("is a directory, expected a file", path)
    try:
        size = path.stat().st_size
        if size > MAX_DOCUMENT_BYTES:
            raise InputError(f"file is {size} bytes; configuration files over {MAX_DOCUMENT_BYTES} bytes are refused", path)
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise InputError("not a UTF-8 text file", path) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None


def load_yaml(path: Path) -> LocatedDocument:
    text = _read_text(path)
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1 if event.start_mark else None
                raise InputError("YAML aliases (*name) are not allowed in ortgate files", path, line=line)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
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


def load_json(path: Path) -> LocatedDocument:
    """JSON with key lines (JSON is valid YAML flow syntax, so the YAML composer finds the lines)."""
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", path) from None
    except RecursionError:
        raise InputError("JSON nesting is too deep", path) from None
    doc = LocatedDocument(path, data)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
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
            key = _scalar(key_node, doc)
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
    return _scalar(node, doc)


def _scalar(node: yaml.Node, doc: LocatedDocument) -> Any:
    try:
        value = _SCALAR_CONSTRUCTOR.construct_object(node, deep=True)
    except (yaml.YAMLError, ValueError, TypeError, OverflowError) as exc:
        raise InputError(f"invalid value {node.value!r}: {exc}", doc.path, line=node.start_mark.line + 1) from None
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
