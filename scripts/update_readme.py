"""Regenerate what is generated: the README's and docs/compare.md's command-output blocks (every
`<!-- EXAMPLE-OUTPUT: ... -->` block is the command run from the repository root), the README's rules table, and the
rule catalog `ortgate rules` / `ortgate explain` read (ortgate/rules/catalog.json).

    python scripts/update_readme.py              # rewrite README.md and ortgate/rules/catalog.json
    python scripts/update_readme.py --remeasure  # ... and the measured blocks (`ortgate run`) with new timings
    python scripts/update_readme.py --check      # exit 1 if either is stale (the tests check both)
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

# Pages beside the README whose command-output blocks are generated the same way.
DOCS = ("docs/compare.md",)
EXAMPLE_COMMAND = "ortgate lint examples/qwen3-moe-tiny-unfused --policy policies/tiny-moe-cpu.yaml"
# A command-output block of the README: `<!-- EXAMPLE-OUTPUT: COMMAND -->` (its output exactly), or
# `<!-- EXAMPLE-OUTPUT measured: COMMAND -->` (a measurement: timings, the machine's CPU and memory differ from run
# to run, so a block is stale only when its output differs in more than those; see `normalized`).
MARKER = re.compile(r"<!-- EXAMPLE-OUTPUT( measured)?: (.*?) -->\n```text\n.*?```\n", re.S)


def run_example(command: str) -> tuple[int, str]:
    """`command` (an `ortgate ...` line) run from the repository root: its exit code and stdout. What it would write
    (`-o` / `--output`) goes to a fresh temporary folder instead, shown under the name the command gives, so that
    neither a folder a reader's run of the example left nor this run touches anything outside the repository."""
    import tempfile

    from ortgate.cli import main

    out = io.StringIO()
    cwd = os.getcwd()
    args = shlex.split(command)[1:]
    with tempfile.TemporaryDirectory(prefix="ortgate-readme-") as scratch:
        shown: dict[str, str] = {}
        for i, arg in enumerate(args[:-1]):
            if arg in ("-o", "--output"):
                parent = Path(scratch) / str(len(shown))
                parent.mkdir()
                stand_in = str(parent / Path(args[i + 1]).name)
                shown[stand_in] = args[i + 1]
                args[i + 1] = stand_in
        os.chdir(REPO)
        try:
            with contextlib.redirect_stdout(out):
                code = main(args)
        finally:
            os.chdir(cwd)
    text = out.getvalue()
    for stand_in, name in shown.items():
        text = text.replace(stand_in, name)
    return code, text


def example_block(command: str = EXAMPLE_COMMAND, measured: bool = False) -> str:
    code, out = run_example(command)
    exit_line = f"$ echo $?\n{code}\n"
    return (f"<!-- EXAMPLE-OUTPUT{' measured' if measured else ''}: {command} -->\n```text\n$ {command}\n{out}"
            f"{exit_line}```\n")


def normalized(block: str) -> str:
    """A measured block without what changes between runs and machines: every number, the CPU's name, ORT's log
    lines, and whether a ratio was within noise."""
    block = re.sub(r"on cpu: [^:\n]*:", "on cpu: CPU:", block)
    block = re.sub(r"^ort said .*\n(?:           .*\n)*", "", block, flags=re.M)
    block = block.replace("; within noise", "")
    return re.sub(r"\d[\d,.]*", "N", block)


def render(text: str, keep_measured: bool = True) -> str:
    """`text` with every example block regenerated; a measured block whose normalized output is unchanged is kept
    as it is (`keep_measured`), so --check does not call every timing stale."""

    def block(m: re.Match) -> str:
        fresh = example_block(m.group(2), bool(m.group(1)))
        if m.group(1) and keep_measured and normalized(fresh) == normalized(m.group(0)):
            return m.group(0)
        return fresh

    text = MARKER.sub(block, text)
    text = re.sub(r"<!-- RULES-TABLE -->\n(?:.*?<!-- /RULES-TABLE -->\n)?", lambda _m: rules_block(), text,
                  count=1, flags=re.S)
    return text


def rules_block() -> str:
    from ortgate.rules import all_rules

    rows = ["<!-- RULES-TABLE -->", "| code | name | severity | needs | `ortgate fix` | priced | what it reports |",
            "|---|---|---|---|---|---|---|"]
    for r in all_rules():
        needs = ", ".join(r.needs) + (" (policy alone)" if r.policy_only else "")
        rows.append(f"| {r.code} | `{r.name}` | {r.severity.label} | {needs} | {r.fix or ''} | {r.price or ''} | "
                    f"{r.summary.replace('|', '/')} |")
    return "\n".join(rows) + "\n<!-- /RULES-TABLE -->\n"


def catalog_text() -> str:
    from ortgate.rules import all_rules
    from ortgate.rules.catalog import catalog_text

    return catalog_text(all_rules())


def main() -> int:
    from ortgate.rules.catalog import CATALOG_PATH

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--remeasure", action="store_true", help="rewrite the measured blocks too")
    args = parser.parse_args()
    readme = REPO / "README.md"
    outputs = [(readme, render(readme.read_text(), keep_measured=not args.remeasure)), (CATALOG_PATH, catalog_text())]
    outputs += [(REPO / doc, render((REPO / doc).read_text(), keep_measured=not args.remeasure)) for doc in DOCS]
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
