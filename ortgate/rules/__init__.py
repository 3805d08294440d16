"""The rule catalog. Each module is one family; importing it registers its rules.

The family modules are imported on first use of the registry, not with this package: `ortgate rules` and
`ortgate explain` read the generated catalog (`ortgate.rules.catalog`) and never need the graph layer.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from ortgate.rules.catalog import closest_name, lookup
from ortgate.rules.redirects import RENAMED, SPLIT_FROM

if TYPE_CHECKING:
    from ortgate.rules.base import Rule


def __getattr__(name: str) -> Any:
    # `Rule` on first use: the registry (ortgate.rules.base, dataclasses, the findings) is not what `ortgate rules`
    # and `explain` need, and they import this package.
    if name == "Rule":
        from ortgate.rules.base import Rule

        return Rule
    raise AttributeError(f"module 'ortgate.rules' has no attribute {name!r}")


@cache
def _register() -> None:
    # Families, in code order. Importing registers.
    from ortgate.rules import (  # noqa: F401
        contracts,
        drift,
        fusion,
        inventory,
        model,
        norms,
        placement,
        projections,
        provider,
        release,
        reported,
        rotary,
        runtime,
        session,
        throughput,
        waivers,
    )


def all_rules() -> list[Rule]:
    from ortgate.rules.base import registered_rules

    _register()
    return registered_rules()


def find_rule(key: str) -> Rule | None:
    """A rule by code (OGF001, case-insensitive) or name (moe-not-fused); a renamed code or name finds its rule."""
    key = key.strip()
    for candidate in (key, RENAMED.get(key.upper()), RENAMED.get(key.lower())):
        if not candidate:
            continue
        found = lookup(all_rules(), candidate)
        if found is not None:
            return found
    return None


def split_from(code: str) -> list[Rule]:
    """The rules split off `code`: a reference to `code` covers their findings too (not transitively: a code split
    off a split-off code took findings `code` never had)."""
    children = {child for child, parents in SPLIT_FROM.items() if code in parents}
    return [r for r in all_rules() if r.code in children]


def resolve_rule(reference: str) -> list[Rule]:
    """What a rule reference (code or name, old or new) covers: its rule and the rules split off it."""
    exact = find_rule(reference)
    if exact is None:
        return []
    return [exact, *split_from(exact.code)]


def match_rules(selector: str) -> list[Rule]:
    """Rules matched by a name, a code (with the codes split off it), or a code prefix (OGF, OGF0)."""
    resolved = resolve_rule(selector)
    if resolved:
        return resolved
    prefix = selector.strip().upper()
    if prefix.startswith("OG") and prefix.isalnum():
        return [r for r in all_rules() if r.code.startswith(prefix)]
    return []


def suggest_rule(selector: str) -> str | None:
    return closest_name(all_rules(), selector)


__all__ = ["Rule", "all_rules", "find_rule", "match_rules", "resolve_rule", "split_from", "suggest_rule"]
