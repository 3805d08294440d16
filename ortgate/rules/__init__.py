"""The rule catalog. Each module is one family; importing it registers its rules."""

from __future__ import annotations

import difflib

# Families, in code order. Importing registers.
from ortgate.rules import (  # noqa: F401  # noqa: E402,F401
    drift,
    fusion,
    inventory,
    model,
    norms,
    placement,
    projections,
    provider,
    rotary,
    runtime,
    session,
    waivers,
)
from ortgate.rules.base import Rule, registered_rules


def all_rules() -> list[Rule]:
    return registered_rules()


def find_rule(key: str) -> Rule | None:
    """A rule by code (OGF001, case-insensitive) or name (moe-not-fused)."""
    key = key.strip()
    for r in registered_rules():
        if r.code == key.upper() or r.name == key.lower():
            return r
    return None


def match_rules(selector: str) -> list[Rule]:
    """Rules matched by a name, a code, or a code prefix (OGF, OGF0)."""
    exact = find_rule(selector)
    if exact is not None:
        return [exact]
    prefix = selector.strip().upper()
    if prefix.startswith("OG") and prefix.isalnum():
        return [r for r in registered_rules() if r.code.startswith(prefix)]
    return []


def suggest_rule(selector: str) -> str | None:
    names = [r.name for r in registered_rules()]
    hint = difflib.get_close_matches(selector.lower(), names, n=1)
    return hint[0] if hint else None


__all__ = ["Rule", "all_rules", "find_rule", "match_rules", "suggest_rule"]
