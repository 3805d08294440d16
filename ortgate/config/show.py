"""The merged effective policy, each value with the file and line it came from (`ortgate policy show`).

The YAML form is itself a valid policy (the comments carry the origins); the JSON form is for tools. Generic over
every key: whatever the schema holds, a value's origin is where the `extends` merge took it from."""

from __future__ import annotations

import json
from typing import Any

import yaml

from ortgate.config.policy import Policy, display_source
from ortgate.config.source import KeyPath, format_key_path
from ortgate.errors import printable

COMMENT_COLUMN = 48


def _origin(policy: Policy, path: KeyPath) -> str:
    loc = policy.origin(*path)
    where = display_source(loc.file)
    return f"{where}:{loc.line}" if loc.line else where


def _flow(value: Any) -> str:
    """`value` as one line of YAML flow syntax (quoted where YAML needs it)."""
    return yaml.safe_dump([value], default_flow_style=True, width=10**9, sort_keys=False).strip()[1:-1]


def _line(text: str, origin: str) -> str:
    return f"{text.ljust(COMMENT_COLUMN - 2)}  # {printable(origin)}"


def effective_policy_yaml(policy: Policy) -> str:
    chain = " <- ".join(display_source(p) for p in policy.chain)
    out = [printable(f"# effective policy {policy.name!r}: {chain}")]
    _mapping(policy, policy.data, (), 0, out)
    for path, loc in sorted(policy.removed.items(), key=lambda item: format_key_path(item[0])):
        where = f"{display_source(loc.file)}:{loc.line}" if loc.line else display_source(loc.file)
        out.append(printable(f"# {format_key_path(path)}: removed (null) by {where}"))
    return "\n".join(out) + "\n"


def _mapping(policy: Policy, data: dict, prefix: KeyPath, depth: int, out: list[str]) -> None:
    indent = "  " * depth
    for key, value in data.items():
        path = prefix + (key,)
        head = f"{indent}{_flow(key)}:"
        if isinstance(value, dict) and value:
            out.append(head)
            _mapping(policy, value, path, depth + 1, out)
        elif isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
            out.append(head)
            for i, item in enumerate(value):
                out.append(_line(f"{indent}  - {_flow(item)}", _origin(policy, path + (i,))))
        else:
            out.append(_line(f"{head} {_flow(value)}", _origin(policy, path)))


def effective_policy_json(policy: Policy) -> str:
    sources: dict[str, dict] = {}

    def walk(value: Any, path: KeyPath) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, path + (k,))
            return
        if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
            for i, v in enumerate(value):
                walk(v, path + (i,))
            return
        loc = policy.origin(*path)
        sources[format_key_path(path)] = {"file": display_source(loc.file), "line": loc.line}

    walk(policy.data, ())
    removed = {format_key_path(p): {"file": display_source(loc.file), "line": loc.line}
               for p, loc in policy.removed.items()}
    doc = {"name": policy.name, "chain": [display_source(p) for p in policy.chain], "policy": policy.data,
           "sources": sources, "removed": removed}
    return json.dumps(doc, allow_nan=False, indent=2, default=str) + "\n"
