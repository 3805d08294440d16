"""The rule catalog as data: each rule's code, name, default severity, family, documentation and what its `@rule`
declares (needs, price, fix, policy_only), generated from the rules themselves into catalog.json by
`python scripts/update_readme.py`.

`ortgate rules` and `ortgate explain` read it instead of importing the rule modules (and the graph and config
layers under them), so they answer in about the time a bare Python start takes. tests/test_cli.py fails when it
no longer matches the registered rules.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import NamedTuple, Protocol, TypeVar

CATALOG_PATH = Path(__file__).with_name("catalog.json")


class Named(Protocol):
    @property
    def code(self) -> str: ...

    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=Named)


class RuleEntry(NamedTuple):
    """A rule as the catalog holds it (plain data: reading it imports neither the registry nor the findings)."""

    code: str
    name: str
    severity_label: str  # "error" | "warning" | "info"
    family: str
    doc: str
    needs: tuple[str, ...] = ()  # what it needs to find anything (ortgate.rules.needs.NEEDS)
    price: str | None = None  # the cost model's repair kind that prices its findings
    fix: str | None = None  # the repair `ortgate fix` makes for its findings
    policy_only: bool = False  # it judges the policy alone (`ortgate policy validate` runs it)

    @property
    def summary(self) -> str:
        return self.doc.strip().splitlines()[0].strip()


@cache
def catalog() -> tuple[RuleEntry, ...]:
    data = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    return tuple(RuleEntry(r["code"], r["name"], r["severity"], r["family"], r["doc"], tuple(r["needs"]), r["price"],
                           r["fix"], r["policy_only"]) for r in data["rules"])


def catalog_text(rules: Iterable) -> str:
    """catalog.json for these rules (anything with code, name, severity, family, doc, needs, price, fix and
    policy_only), deterministic."""
    entries = [{"code": r.code, "name": r.name, "severity": r.severity.label, "family": r.family,
                "needs": list(r.needs), "price": r.price, "fix": r.fix, "policy_only": r.policy_only, "doc": r.doc}
               for r in sorted(rules, key=lambda r: r.code)]
    return json.dumps({"rules": entries}, allow_nan=False, indent=1, ensure_ascii=False) + "\n"


def lookup(items: Iterable[N], key: str) -> N | None:
    """A rule by code (OGF001, case-insensitive) or name (moe-not-fused)."""
    key = key.strip()
    for item in items:
        if item.code == key.upper() or item.name == key.lower():
            return item
    return None


def closest_name(items: Iterable[Named], key: str) -> str | None:
    import difflib

    hint = difflib.get_close_matches(key.lower(), [item.name for item in items], n=1)
    return hint[0] if hint else None
