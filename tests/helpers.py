"""Running the linter in-process the way the CLI does, for tests that look at findings."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from ortgate.cli import main
from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import LintRequest, lint, load_inputs
from ortgate.findings import Finding


def lint_findings(model, policy=None, optimized=None, config=None, select: list[str] | None = None) -> list[Finding]:
    """The gated findings of `ortgate lint`, through the one pipeline (load, select, run, gate)."""
    request = LintRequest(str(model), str(policy) if policy else None, str(optimized) if optimized else None,
                          str(config) if config else None)
    inputs = load_inputs(request)
    return lint(inputs, gate_config_from(inputs.policy, cli_select=select, cli_ignore=None, fail_on=None)).findings


def by_rule(findings: list[Finding], rule: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule]


def run_cli(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, out.getvalue(), err.getvalue()


def run_cli_json(*args: str | Path) -> tuple[int, dict]:
    code, out, err = run_cli(*args, "--format", "json")
    assert not err, err
    return code, json.loads(out)


def rule_findings(model, rule: str, policy=None, optimized=None, config=None) -> list[Finding]:
    """One rule's findings in layer order, the ones outside the decoder layers last."""
    found = by_rule(lint_findings(model, policy, optimized=optimized, config=config, select=[rule]), rule)
    return sorted(found, key=lambda f: (f.layer is None, f.layer or 0))
