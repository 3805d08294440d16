"""`ortgate rules` and `ortgate explain`: the rule catalog and each rule's documentation."""

from __future__ import annotations

import argparse
import json
import sys

from ortgate.cli.output import EXIT_PASS
from ortgate.errors import InputError

FORMATS = ("text", "json")


def add_parsers(sub) -> None:
    rules = sub.add_parser("rules", help="list every rule")
    rules.add_argument("--format", choices=FORMATS, default="text")
    explain = sub.add_parser("explain", help="show a rule's documentation")
    explain.add_argument("rule", metavar="CODE|NAME")


def cmd_rules(args: argparse.Namespace) -> int:
    from ortgate.rules.catalog import catalog

    rules = catalog()
    if args.format == "json":
        payload = [{"code": r.code, "name": r.name, "severity": r.severity_label, "family": r.family,
                    "summary": r.summary, "needs": list(r.needs), "fix": r.fix, "price": r.price,
                    "policy_only": r.policy_only, "preview": r.preview} for r in rules]
        print(json.dumps(payload, allow_nan=False, indent=2))
        return EXIT_PASS
    width = max(len(r.name) for r in rules)
    for r in rules:
        print(f"{r.code}  {r.name:<{width}}  {r.severity_label:<7}  {r.summary}{' (preview)' if r.preview else ''}")
    return EXIT_PASS


def metadata_text(r) -> str:
    """What the rule's `@rule` declares, in words: needs, fix, price, policy alone."""
    needs = f"needs {', '.join(r.needs)}" if r.needs else "no declared needs"
    fix = f"fixed by `ortgate fix` ({r.fix} repair)" if r.fix else "no automatic fix"
    price = f"priced by the cost model ({r.price} repair)" if r.price else "not priced"
    alone = "; judged on the policy alone (`ortgate policy validate` runs it)" if r.policy_only else ""
    preview = ("; in preview: runs only under --preview, the policy's `rules: {preview: true}`, or when selected "
               "by its code or name") if r.preview else ""
    return f"{needs}; {fix}; {price}{alone}{preview}."


def cmd_explain(args: argparse.Namespace) -> int:
    from ortgate.rules.catalog import catalog, closest_name, lookup
    from ortgate.rules.redirects import RENAMED

    key = args.rule.strip()
    r = lookup(catalog(), key) or lookup(catalog(), RENAMED.get(key.upper()) or RENAMED.get(key.lower()) or "")
    if r is None:
        hint = closest_name(catalog(), args.rule)
        raise InputError(f"unknown rule {args.rule!r}"
                         + (f"; did you mean {hint!r}?" if hint else "; `ortgate rules` lists them"))
    text = f"# {r.code} {r.name} (default severity: {r.severity_label})\n\n{metadata_text(r)}\n\n{r.shown_doc}\n"
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))
    else:
        sys.stdout.write(text)
    return EXIT_PASS
