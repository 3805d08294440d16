"""Regenerate what is generated: the command-output blocks of README.md and of the pages under docs/ (every
`<!-- EXAMPLE-OUTPUT: ... -->` block is the command run from the repository root), the rules table, the rule
catalog `ortgate rules` / `ortgate explain` read (ortgate/rules/catalog.json) with what each rule reports on its
documented Bad example (by running it), and the rule pages docs/rules/.

    python scripts/update_readme.py              # rewrite README.md, docs/, docs/rules/ and the rule catalog
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


def render(text: str, keep_measured: bool = True, rules_folder: str = "docs/rules/") -> str:
    """`text` with every example block regenerated; a measured block whose normalized output is unchanged is kept
    as it is (`keep_measured`), so --check does not call every timing stale. The rules table links each code to its
    page in `rules_folder` (relative to the file)."""

    def block(m: re.Match) -> str:
        fresh = example_block(m.group(2), bool(m.group(1)))
        if m.group(1) and keep_measured and normalized(fresh) == normalized(m.group(0)):
            return m.group(0)
        return fresh

    text = MARKER.sub(block, text)
    text = re.sub(r"<!-- RULES-TABLE -->\n(?:.*?<!-- /RULES-TABLE -->\n)?", lambda _m: rules_block(rules_folder),
                  text, count=1, flags=re.S)
    return text


def rules_block(rules_folder: str = "docs/rules/") -> str:
    from ortgate.rules import all_rules

    rows = ["<!-- RULES-TABLE -->", "| code | name | severity | needs | `ortgate fix` | priced | what it reports |",
            "|---|---|---|---|---|---|---|"]
    for r in all_rules():
        needs = ", ".join(r.needs) + (" (policy alone)" if r.policy_only else "")
        rows.append(f"| [{r.code}]({rules_folder}{r.code}.md) | `{r.name}` | {r.severity.label} | {needs} | {r.fix or ''} | {r.price or ''} | "
                    f"{r.summary.replace('|', '/')}{' (preview)' if r.preview else ''} |")
    return "\n".join(rows) + "\n<!-- /RULES-TABLE -->\n"


def example_outputs() -> dict[str, str]:
    """Code -> what the rule reports on its documented Bad example, by running it (in a temporary folder)."""
    import tempfile

    from ortgate.rules import all_rules
    from tests.rule_inputs import example_output

    outputs = {}
    with tempfile.TemporaryDirectory(prefix="ortgate-examples-") as tmp:
        for r in all_rules():
            outputs[r.code] = example_output(r, Path(tmp) / r.code)
    return outputs


def catalog_text() -> str:
    from ortgate.rules import all_rules
    from ortgate.rules.catalog import catalog_text

    return catalog_text(all_rules(), example_outputs())


RULE_PAGES = REPO / "docs" / "rules"
RULES_INTRO = """\
Every rule, each with its page: what it checks, why it costs throughput, a Bad and a Good example with what ortgate
reports on the Bad one (generated by running it), the fix, and what it rests on. `ortgate rules` lists them and
`ortgate explain CODE` prints a page. Families by code prefix: `OGF` fusion, `OGM` model structure, `OGS` session,
`OGP` provider options, `OGK` kernel placement, `OGC` config drift, `OGR` runtime evidence, `OGW` waivers, `OGT`
throughput targets against the decode cost model, `OGX` operator contracts.

Each rule declares what it needs to find anything (`needs`: a declared `session`, a `provider`, a `policy`,
`genai_config`, the `optimized` dump, run `evidence`, a `throughput` block, a priced `device`, an `moe` layer, an
`attention` or a `kv_cache` in the graph; policy alone: `ortgate policy validate` runs it), the repair `ortgate fix`
makes for it, and the cost model's repair that prices it; `ortgate rules --format json` and `ortgate explain` show
the same. A rule in preview (new, not yet promoted) runs only under `--preview`, the policy's `rules: {preview:
true}`, or when selected by its code or name.
"""
PAGE_HEAD = ("<!-- Generated by scripts/update_readme.py from the rule's own documentation (its docstring) and what "
             "it reports on its Bad example: edit the rule, not this page. -->\n")


def documents() -> list[Path]:
    """The files whose command-output blocks and rules table are generated: README.md and the pages under docs/
    (the rule pages, which are generated whole, aside)."""
    return [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if RULE_PAGES not in p.parents)]


# The pages beside the README whose command-output blocks are generated (relative to the repository).
DOCS = tuple(str(p.relative_to(REPO)) for p in documents()[1:])


def rule_pages(catalog_json: str) -> dict[Path, str]:
    """docs/rules/<CODE>.md for every rule of the catalog: what `ortgate explain CODE` prints, with its Bad
    example's output; and docs/rules/README.md, the table of them all."""
    import json

    from ortgate.cli.rules import metadata_text
    from ortgate.rules.catalog import RuleEntry, doc_with_output

    pages: dict[Path, str] = {}
    for r in json.loads(catalog_json)["rules"]:
        entry = RuleEntry(r["code"], r["name"], r["severity"], r["family"], r["doc"], tuple(r["needs"]), r["price"],
                          r["fix"], r["policy_only"], r["example_output"], r["preview"])
        pages[RULE_PAGES / f"{entry.code}.md"] = (
            f"{PAGE_HEAD}# {entry.code} {entry.name} (default severity: {entry.severity_label})\n\n"
            f"{metadata_text(entry)}\n\n{doc_with_output(entry.doc, entry.example_output)}\n")
    pages[RULE_PAGES / "README.md"] = f"{PAGE_HEAD}# Rules\n\n{RULES_INTRO}\n" + rules_block("")
    return pages


def main() -> int:
    from ortgate.rules.catalog import CATALOG_PATH

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--remeasure", action="store_true", help="rewrite the measured blocks too")
    args = parser.parse_args()
    catalog = catalog_text()
    outputs = {path: render(path.read_text(encoding="utf-8"), keep_measured=not args.remeasure,
                            rules_folder=os.path.relpath(RULE_PAGES, path.parent) + "/")
               for path in documents()}
    outputs[CATALOG_PATH] = catalog
    outputs.update(rule_pages(catalog))
    stale = [path for path, fresh in outputs.items()
             if not path.is_file() or path.read_text(encoding="utf-8") != fresh]
    extra = [p for p in RULE_PAGES.glob("*.md") if p not in outputs] if RULE_PAGES.is_dir() else []
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO)} is stale: run python scripts/update_readme.py", file=sys.stderr)
        for path in extra:
            print(f"{path.relative_to(REPO)} is no rule's page: run python scripts/update_readme.py", file=sys.stderr)
        return 1 if stale or extra else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(outputs[path], encoding="utf-8")
    for path in extra:
        path.unlink()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
