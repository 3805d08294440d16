"""Knowledge files into frozen dataclasses, checked key by key when the module that owns them is imported.

The dataclass IS the schema of its JSON object: each field is a key (its name, or `field(metadata={"key": ...})`),
a field without a default is required, and its annotation says what the value must be (str, int, float, bool,
tuple[X, ...], Mapping[str, X], X | None, Literal[...], Any, or another dataclass). A missing key, an unknown key
(a typo) or a value of the wrong type raises KnowledgeError naming the file and the path to the value, so a broken
knowledge file stops ortgate at import instead of surfacing as a KeyError in a user's CI.

    facts = build(OrtFacts, read_json(ORT_FACTS_JSON), "ort_facts.json")
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


class KnowledgeError(Exception):
    """A knowledge file ortgate ships does not match its schema: a bug in ortgate, not in the user's input."""


def read_json(path: Path) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def build(cls: type[T], data: Any, where: str) -> T:
    """An instance of dataclass `cls` from the JSON object `data`; `where` names it in errors ("file.json: a.b")."""
    if not isinstance(data, dict):
        raise KnowledgeError(f"{where}: expected an object, got {_kind(data)}")
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
    known = {json_key(f) for f in fields}
    unknown = [k for k in data if k not in known]
    if unknown:
        key = unknown[0]
        hint = difflib.get_close_matches(key, sorted(known), n=1)
        raise KnowledgeError(f"{where}: unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    values: dict[str, Any] = {}
    for f in fields:
        key = json_key(f)
        if key in data:
            values[f.name] = convert(hints[f.name], data[key], _join(where, key))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise KnowledgeError(f"{where}: missing key {key!r}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # __post_init__ checks of cross-field invariants
        raise KnowledgeError(f"{where}: {exc}") from exc


def convert(tp: Any, value: Any, where: str) -> Any:
    """`value` checked against (and shaped as) the annotation `tp`."""
    if tp is Any:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return convert(option, value, where)
            except KnowledgeError as exc:
                errors.append(str(exc))
        raise KnowledgeError(errors[0] if len(errors) == 1 else f"{where}: {_kind(value)} matches none of {tp}")
    if origin is typing.Literal:
        if not any(value == a and type(value) is type(a) for a in args):
            raise KnowledgeError(f"{where}: expected one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise KnowledgeError(f"{where}: expected a list, got {_kind(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise KnowledgeError(f"{where}: expected a list of {len(args)}, got {len(value)} items")
        return tuple(convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin in (Mapping, dict, typing.Mapping):
        if not isinstance(value, dict):
            raise KnowledgeError(f"{where}: expected an object, got {_kind(value)}")
        key_type, value_type = args or (str, Any)
        out = {convert(key_type, k, where): convert(value_type, v, _join(where, k)) for k, v in value.items()}
        return types.MappingProxyType(out)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build(tp, value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise KnowledgeError(f"{where}: expected true or false, got {_kind(value)}")
        return value
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise KnowledgeError(f"{where}: expected an integer, got {_kind(value)}")
        return value
    if tp is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise KnowledgeError(f"{where}: expected a number, got {_kind(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise KnowledgeError(f"{where}: expected a string, got {_kind(value)}")
        return value
    raise KnowledgeError(f"{where}: ortgate cannot read a value of type {tp!r}")  # pragma: no cover - schema bug


def _join(where: str, key: str) -> str:
    return f"{where}: {key}" if where.endswith(".json") else f"{where}.{key}"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)
