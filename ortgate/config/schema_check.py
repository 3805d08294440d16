"""A quick yes for the common case: is a document valid under policy.schema.json, without importing jsonschema?

`verdict(schema, instance)` decides the JSON Schema (draft 2020-12) keywords ortgate's own schema uses, each
exactly as jsonschema decides it (its keyword functions, type checker and "date" format checker), and answers
True (valid: jsonschema would yield no error), False (invalid: it would yield at least one) or None (a keyword,
format, value type or enum it does not decide). Only True is acted on: a policy that is not plainly valid is
validated by jsonschema, which says what is wrong, so every message stays jsonschema's.

    if verdict(policy_schema(), data) is True:
        return []            # else: jsonschema.Draft202012Validator(...).iter_errors(data)
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable
from typing import Any

Verdict = bool | None

# Keywords that never fail a document (annotations, and the identifiers of a schema without references).
_ANNOTATIONS = frozenset(("description", "title", "$schema", "$id", "$comment", "default", "examples"))
# The value types YAML's safe loader and JSON give that jsonschema's type checker is decided for here; anything
# else (a date YAML read unquoted, bytes, a set) is left to jsonschema.
_PLAIN = frozenset((dict, list, str, int, float, bool, type(None)))
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)  # jsonschema's own "date" pattern


def verdict(schema: Any, instance: Any) -> Verdict:
    """True, False or None (undecided): see the module docstring."""
    if schema is True:
        return True
    if schema is False:
        return False
    if type(schema) is not dict or type(instance) not in _PLAIN:
        return None
    for keyword, value in schema.items():
        check = _KEYWORDS.get(keyword)
        if check is None:
            if keyword in _ANNOTATIONS:
                continue
            return None
        found = check(value, instance, schema)
        if found is not True:
            return found
    return True


def _all(results) -> Verdict:
    """True when every result is, False at the first False, None at the first undecided."""
    for r in results:
        if r is not True:
            return r
    return True


def _is_number(instance: Any) -> bool:
    return type(instance) is int or type(instance) is float


def _is_type(name: Any, instance: Any) -> Verdict:
    kind = type(instance)
    if name == "object":
        return kind is dict
    if name == "array":
        return kind is list
    if name == "string":
        return kind is str
    if name == "boolean":
        return kind is bool
    if name == "null":
        return instance is None
    if name == "number":
        return kind is int or kind is float
    if name == "integer":  # draft 6 and later: 3.0 is an integer
        return kind is int or (kind is float and instance.is_integer())
    return None


def _type(types: Any, instance: Any, schema: dict) -> Verdict:
    names = types if type(types) is list else [types]
    undecided = False
    for name in names:
        found = _is_type(name, instance)
        if found is True:
            return True
        undecided = undecided or found is None
    return None if undecided else False


def _enum(values: Any, instance: Any, schema: dict) -> Verdict:
    # jsonschema's equal() compares a string with anything by ==: a list of strings is decided here, nothing else.
    if type(values) is not list or not all(type(v) is str for v in values):
        return None
    return type(instance) is str and instance in values


def _minimum(limit: Any, instance: Any, schema: dict) -> Verdict:
    return not _is_number(instance) or not instance < limit


def _maximum(limit: Any, instance: Any, schema: dict) -> Verdict:
    return not _is_number(instance) or not instance > limit


def _exclusive_minimum(limit: Any, instance: Any, schema: dict) -> Verdict:
    return not _is_number(instance) or not instance <= limit


def _min_length(limit: Any, instance: Any, schema: dict) -> Verdict:
    return type(instance) is not str or not len(instance) < limit


def _min_items(limit: Any, instance: Any, schema: dict) -> Verdict:
    return type(instance) is not list or not len(instance) < limit


def _min_properties(limit: Any, instance: Any, schema: dict) -> Verdict:
    return type(instance) is not dict or not len(instance) < limit


def _pattern(pattern: Any, instance: Any, schema: dict) -> Verdict:
    return type(instance) is not str or re.search(pattern, instance) is not None


def _format(name: Any, instance: Any, schema: dict) -> Verdict:
    if name != "date":
        return None
    if type(instance) is not str:
        return True
    try:
        return bool(_DATE.fullmatch(instance) and _dt.date.fromisoformat(instance))
    except ValueError:
        return False


def _required(names: Any, instance: Any, schema: dict) -> Verdict:
    return type(instance) is not dict or all(name in instance for name in names)


def _properties(properties: Any, instance: Any, schema: dict) -> Verdict:
    if type(instance) is not dict:
        return True
    if any(type(key) is not str for key in instance):
        return None
    return _all(verdict(sub, instance[name]) for name, sub in properties.items() if name in instance)


def _additional_properties(allowed: Any, instance: Any, schema: dict) -> Verdict:
    if type(instance) is not dict:
        return True
    if "patternProperties" in schema or any(type(key) is not str for key in instance):
        return None
    known = schema.get("properties", {})
    extras = [key for key in instance if key not in known]
    if type(allowed) is dict:
        return _all(verdict(allowed, instance[key]) for key in extras)
    return bool(allowed) or not extras


def _items(items: Any, instance: Any, schema: dict) -> Verdict:
    if type(instance) is not list:
        return True
    if "prefixItems" in schema:
        return None
    return _all(verdict(items, item) for item in instance)


def _one_of(options: Any, instance: Any, schema: dict) -> Verdict:
    found = [verdict(option, instance) for option in options]
    if None in found:
        return None
    return found.count(True) == 1


_KEYWORDS: dict[str, Callable[[Any, Any, dict], Verdict]] = {
    "type": _type,
    "enum": _enum,
    "minimum": _minimum,
    "maximum": _maximum,
    "exclusiveMinimum": _exclusive_minimum,
    "minLength": _min_length,
    "minItems": _min_items,
    "minProperties": _min_properties,
    "pattern": _pattern,
    "format": _format,
    "required": _required,
    "properties": _properties,
    "additionalProperties": _additional_properties,
    "items": _items,
    "oneOf": _one_of,
}
