"""Run a handful of named mutations of ortgate against the tests that should catch them.

Each mutation replaces one exact piece of source text in a temporary copy of the repository (the working tree is never
touched) and runs its tests there; a mutation is *killed* when the tests fail and *survives* when they pass. A
surviving mutation is a behaviour no test holds. Each mutation's tests first run on the unmutated copy, where they
must pass.

    python scripts/mutation_check.py                 # every mutation; exit 1 if any survives
    python scripts/mutation_check.py --list          # the mutations' names and what they break
    python scripts/mutation_check.py NAME [NAME...]  # only these

A mutation whose text no longer occurs exactly once in its file is reported as stale (exit 2): update its text
with the code it guards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str  # the behaviour it breaks
    file: str  # relative to the repository root
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments that must fail under the mutation


MUTATIONS = (
    Mutation(
        "occurrences-reversed",
        "findings of one rule, layer and anchor numbered against graph order (baseline identities move)",
        "ortgate/findings.py",
        "for occurrence, i in enumerate(ordered):",
        "for occurrence, i in enumerate(reversed(ordered)):",
        ("tests/test_mutations_killed.py",),
    ),
    Mutation(
        "occurrences-by-name",
        "findings numbered in the rule's order instead of by their position in the graph",
        "ortgate/findings.py",
        "ordered = sorted(indexes, key=lambda i: (out[i].position is None, out[i].position or 0, i))",
        "ordered = list(indexes)",
        ("tests/test_mutations_killed.py",),
    ),
    Mutation(
        "moe-routing-form-unchecked",
        "the MoE anatomy no longer cross-checks the routing it reads against the form the block was found as",
        "ortgate/graph/patterns/moe_anatomy.py",
        "    if read is not block.routing_form:\n",
        "    if False:\n",
        ("tests/test_mutations_killed.py",),
    ),
    Mutation(
        "moe-expert-form-unchecked",
        "the MoE anatomy reads one weighted output as batched experts whatever form the block was found as",
        "ortgate/graph/patterns/moe_anatomy.py",
        "        if a.block.expert_form is not ExpertForm.BATCHED:\n",
        "        if False:\n",
        ("tests/test_mutations_killed.py",),
    ),
    Mutation(
        "moe-expert-pattern-unchecked",
        "the MoE anatomy no longer cross-checks how the experts read their input against the block's expert form",
        "ortgate/graph/patterns/moe_anatomy.py",
        "    if pattern != a.pattern:\n",
        "    if False:\n",
        ("tests/test_mutations_killed.py",),
    ),
    Mutation(
        "baseline-matches-forgotten",
        "the gate suppresses findings by the baseline but reports none of its entries matched (all stale)",
        "ortgate/engine/gate.py",
        "            matched.update(hits)\n",
        "            pass\n",
        ("tests/test_baselines.py",),
    ),
    Mutation(
        "preview-rules-always-run",
        "a rule in preview runs in every lint, so an update that adds one can fail a gate that passed",
        "ortgate/engine/gate.py",
        "            and (not r.preview or config.preview or r.code in named)]",
        "            and True]",
        ("tests/test_rule_preview.py",),
    ),
    Mutation(
        "verdict-ignores-errors",
        "the gate passes a run whose findings include an error",
        "ortgate/engine/gate.py",
        "def decide(findings: list[Finding], fail_on: Severity) -> Verdict:\n",
        "def decide(findings: list[Finding], fail_on: Severity) -> Verdict:\n    findings = []\n",
        ("tests/test_gate.py",),
    ),
    Mutation(
        "severity-order-flipped",
        "`a >= b` on severities means the opposite (info outranks error)",
        "ortgate/findings.py",
        "    INFO = 1\n    WARNING = 2\n    ERROR = 3\n",
        "    INFO = 3\n    WARNING = 2\n    ERROR = 1\n",
        ("tests/test_gate.py",),
    ),
    Mutation(
        "one-line-escaping-dropped",
        "a newline or terminal escape in user text reaches the reports unescaped",
        "ortgate/findings.py",
        "    if text is None or text.isprintable():\n        return text\n",
        "    return text\n",
        ("tests/test_report_forgery.py",),
    ),
)

# Copied into the temporary repository: everything but caches, virtual environments and git's own files.
_SKIP = shutil.ignore_patterns(".git", ".venv", ".ci-venv", "__pycache__", ".pytest_cache", ".mypy_cache",
                               ".ruff_cache", "*.egg-info", "build", "dist")


def _apply(root: Path, m: Mutation) -> str:
    """Apply `m` in the copy at `root`; returns the original text of the file, to restore it."""
    path = root / m.file
    text = path.read_text()
    count = text.count(m.old)
    if count != 1:
        raise LookupError(f"{m.name}: its text occurs {count} times in {m.file} (expected once): update the mutation")
    path.write_text(text.replace(m.old, m.new))
    return text


def _run_tests(root: Path, tests: tuple[str, ...]) -> int:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
                          cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args(argv)
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:32} {m.file}: {m.what}")
        return 0
    known = {m.name: m for m in MUTATIONS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown mutation(s): {', '.join(unknown)} (see --list)")
    chosen = [known[n] for n in args.names] if args.names else list(MUTATIONS)
    survived: list[str] = []
    stale = False
    with tempfile.TemporaryDirectory(prefix="ortgate-mutants-") as tmp:
        root = Path(tmp) / "repo"
        shutil.copytree(REPO, root, ignore=_SKIP, symlinks=True)
        # A mutation is killed only by tests that pass without it.
        for tests in dict.fromkeys(m.tests for m in chosen):
            code = _run_tests(root, tests)
            if code != 0:
                print(f"the unmutated code fails {' '.join(tests)} (pytest exit {code}): fix that first")
                return 2
        for m in chosen:
            try:
                original = _apply(root, m)
            except LookupError as e:
                print(f"stale     {e}")
                stale = True
                continue
            start = time.monotonic()
            try:
                code = _run_tests(root, m.tests)
            finally:
                (root / m.file).write_text(original)
            verdict = {0: "SURVIVED", 1: "killed"}.get(code, f"error (pytest exit {code})")
            if code == 0:
                survived.append(m.name)
            print(f"{verdict:9} {m.name} ({time.monotonic() - start:.1f} s: {' '.join(m.tests)})", flush=True)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} killed" + (f"; survived: {', '.join(survived)}"
                                                                      if survived else ""))
    if stale:
        return 2
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
