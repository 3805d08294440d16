"""The rule catalog. Each module is one family; importing it registers its rules.

The family modules are imported on first use of the registry, not with this package: `ortgate rules` and
`ortgate explain` read the generated catalog (`ortgate.rules.catalog`) and never need the graph layer.
"""

from __future__ import annotations

from functools import cache

from ortgate.rules.base import Rule, registered_rules
from ortgate.rules.catalog import closest_name, lookup


@cache
def _register() -> None:
    # Families, in code order. Importing registers.
    from ortgate.rules import (  # noqa: F401
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


def all_rules() -> list[Rule]:
    _register()
    return registered_rules()


def find_rule(key: str) -> Rule | None:
    """A rule by code (OGF001, case-insensitive) or name (moe-not-fused)."""
    return lookup(all_rules(), key)


def match_rules(selector: str) -> list[Rule]:
    """Rules matched by a name, a code, or a code prefix (OGF, OGF0)."""
    exact = find_rule(selector)
    if exact is not None:
        return [exact]
    prefix = selector.strip().upper()
    if prefix.startswith("OG") and prefix.isalnum():
        return [r for r in all_rules() if r.code.startswith(prefix)]
    return []


def suggest_rule(selector: str) -> str | None:
    return closest_name(all_rules(), selector)


__all__ = ["Rule", "all_rules", "find_rule", "match_rules", "suggest_rule"]
