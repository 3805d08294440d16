"""Regenerate what is generated from the rules: the README's example lint output and rules table, and the rule
catalog `ortgate rules` / `ortgate explain` read (ortgate/rules/catalog.json).

    python scripts/update_readme.py          # rewrite README.md and ortgate/rules/catalog.json
    python scripts/update_readme.py --check  # exit 1 if either is stale (the tests check both)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXAMPLE_COMMAND = "ortgate lint examples/qwen3-moe-tiny-unfused --policy policies/tiny-moe-cpu.yaml"


def example_block() -> str:
    from ortgate.cli import main

    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(out):
            main(shlex.split(EXAMPLE_COMMAND)[1:])
    finally:
        os.chdir(cwd)
    return f"<!-- EXAMPLE-OUTPUT: {EXAMPLE_COMMAND} -->\n```text\n{out.getvalue()}```\n"


def rules_block() -> str:
    from ortgate.rules import all_rules

    rows = ["<!-- RULES-TABLE -->", "| code | name | severity | what it reports |", "|---|---|---|---|"]
    for r in all_rules():
        rows.append(f"| {r.code} | `{r.name}` | {r.severity.label} | {r.summary.replace('|', '/')} |")
    return "\n".join(rows) + "\n<!-- /RULES-TABLE -->\n"


def render(text: str) -> str:
    text = re.sub(r"<!-- EXAMPLE-OUTPUT(?::.*?-->\n```text\n.*?```\n| -->\n)", lambda _m: example_block(), text,
                  count=1, flags=re.S)
    text = re.sub(r"<!-- RULES-TABLE -->\n(?:.*?<!-- /RULES-TABLE -->\n)?", lambda _m: rules_block(), text,
                  count=1, flags=re.S)
    return text


def catalog_text() -> str:
    from ortgate.rules import all_rules
    from ortgate.rules.catalog import catalog_text

    return catalog_text(all_rules())


def main() -> int:
    from ortgate.rules.catalog import CATALOG_PATH

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    readme = REPO / "README.md"
    outputs = [(readme, render(readme.read_text())), (CATALOG_PATH, catalog_text())]
    stale = [path for path, fresh in outputs if not path.is_file() or path.read_text(encoding="utf-8") != fresh]
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is stale: run python scripts/update_readme.py", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.write_text(dict(outputs)[path], encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
