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
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = _Plan(cls)
    known = plan.known
    for key in data:
        if key not in known:
            hint = difflib.get_close_matches(key, sorted(known), n=1)
            raise KnowledgeError(f"{where}: unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    values: dict[str, Any] = {}
    for name, key, to_value, required in plan.fields:
        if key in data:
            values[name] = to_value(data[key], _join(where, key))
        elif required:
            raise KnowledgeError(f"{where}: missing key {key!r}")
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:  # __post_init__ checks of cross-field invariants
        raise KnowledgeError(f"{where}: {exc}") from exc


def convert(tp: Any, value: Any, where: str) -> Any:
    """`value` checked against (and shaped as) the annotation `tp`."""
    return _converter(tp)(value, where)


class _Plan:
    """What `build` needs of a dataclass, worked out once per class: its keys and a converter per field."""

    __slots__ = ("fields", "known")

    def __init__(self, cls: type) -> None:
        hints = typing.get_type_hints(cls)
        fields = [f for f in dataclasses.fields(cls) if f.init]
        self.known = frozenset(json_key(f) for f in fields)
        self.fields = tuple((f.name, json_key(f), _converter(hints[f.name]),
                             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                            for f in fields)


_PLANS: dict[type, _Plan] = {}
_Converter = typing.Callable[[Any, str], Any]
_CONVERTERS: dict[Any, _Converter] = {}


def _converter(tp: Any) -> _Converter:
    """The function that checks and shapes a value of annotation `tp`, made once per annotation."""
    try:
        found = _CONVERTERS.get(tp)
    except TypeError:  # an unhashable annotation: made each time
        return _make_converter(tp)
    if found is None:
        found = _CONVERTERS[tp] = _make_converter(tp)
    return found


def _make_converter(tp: Any) -> _Converter:
    if tp is Any:
        return lambda value, where: value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        nullable = type(None) in args
        options = [_converter(a) for a in args if a is not type(None)]

        def union(value: Any, where: str) -> Any:
            if value is None and nullable:
                return None
            errors = []
            for option in options:
                try:
                    return option(value, where)
                except KnowledgeError as exc:
                    errors.append(str(exc))
            raise KnowledgeError(errors[0] if len(errors) == 1 else f"{where}: {_kind(value)} matches none of {tp}")
        return union
    if origin is typing.Literal:
        def literal(value: Any, where: str) -> Any:
            if not any(value == a and type(value) is type(a) for a in args):
                raise KnowledgeError(f"{where}: expected one of {', '.join(map(repr, args))}, got {value!r}")
            return value
        return literal
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            item = _converter(args[0])

            def tuple_of(value: Any, where: str) -> Any:
                if not isinstance(value, list):
                    raise KnowledgeError(f"{where}: expected a list, got {_kind(value)}")
                return tuple(item(v, f"{where}[{i}]") for i, v in enumerate(value))
            return tuple_of
        items = [_converter(a) for a in args]

        def fixed_tuple(value: Any, where: str) -> Any:
            if not isinstance(value, list):
                raise KnowledgeError(f"{where}: expected a list, got {_kind(value)}")
            if len(value) != len(items):
                raise KnowledgeError(f"{where}: expected a list of {len(items)}, got {len(value)} items")
            return tuple(c(v, f"{where}[{i}]") for i, (c, v) in enumerate(zip(items, value)))
        return fixed_tuple
    if origin in (Mapping, dict, typing.Mapping):
        key_type, value_type = args or (str, Any)
        key_of, value_of = _converter(key_type), _converter(value_type)

        def mapping(value: Any, where: str) -> Any:
            if not isinstance(value, dict):
                raise KnowledgeError(f"{where}: expected an object, got {_kind(value)}")
            out = {key_of(k, where): value_of(v, _join(where, k)) for k, v in value.items()}
            return types.MappingProxyType(out)
        return mapping
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return lambda value, where: build(tp, value, where)
    if tp is bool:
        def boolean(value: Any, where: str) -> Any:
            if not isinstance(value, bool):
                raise KnowledgeError(f"{where}: expected true or false, got {_kind(value)}")
            return value
        return boolean
    if tp is int:
        def integer(value: Any, where: str) -> Any:
            if not isinstance(value, int) or isinstance(value, bool):
                raise KnowledgeError(f"{where}: expected an integer, got {_kind(value)}")
            return value
        return integer
    if tp is float:
        def number(value: Any, where: str) -> Any:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise KnowledgeError(f"{where}: expected a number, got {_kind(value)}")
            return float(value)
        return number
    if tp is str:
        def string(value: Any, where: str) -> Any:
            if not isinstance(value, str):
                raise KnowledgeError(f"{where}: expected a string, got {_kind(value)}")
            return value
        return string

    def unreadable(value: Any, where: str) -> Any:  # pragma: no cover - schema bug
        raise KnowledgeError(f"{where}: ortgate cannot read a value of type {tp!r}")
    return unreadable


def _join(where: str, key: str) -> str:
    return f"{where}: {key}" if where.endswith(".json") else f"{where}.{key}"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)
