"""Regenerate the README's generated blocks: the example lint output and the rules table.

    python scripts/update_readme.py          # rewrite README.md
    python scripts/update_readme.py --check  # exit 1 if README.md is stale (tests/test_readme.py does this)
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    readme = REPO / "README.md"
    current = readme.read_text()
    fresh = render(current)
    if args.check:
        if fresh != current:
            print("README.md is stale: run python scripts/update_readme.py", file=sys.stderr)
            return 1
        return 0
    readme.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
