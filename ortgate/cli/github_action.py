"""The lint step of the GitHub Action (action.yml): `python -m ortgate.cli.github_action`.

Reads the action's inputs from ORTGATE_* variables, runs `ortgate lint` with workflow annotations on stdout,
then, whatever the verdict, appends the markdown job summary to $GITHUB_STEP_SUMMARY and writes the step
outputs (exit-code, errors, warnings, infos, suppressed, passed, sarif-file) to $GITHUB_OUTPUT. Only then
does it exit with lint's exit code, so a failing gate fails the step after the summary and outputs exist.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ortgate.cli.main import main as ortgate_main
from ortgate.cli.output import EXIT_INPUT
from ortgate.report.github import escape_data


def lint_argv(env: Mapping[str, str], markdown: Path, report: Path) -> list[str]:
    """`ortgate lint` for the action's inputs. `model` holds one path or several, separated by spaces or new
    lines (quote a path with spaces), and globs (`models/*/model.onnx`), expanded by ortgate itself."""
    argv = ["lint", *shlex.split(env.get("ORTGATE_MODEL", "")), "--format", "github",
            "--markdown", str(markdown), "--json", str(report)]
    for option, name in (("--policy", "ORTGATE_POLICY"), ("--optimized", "ORTGATE_OPTIMIZED"),
                         ("--config", "ORTGATE_CONFIG"), ("--fail-on", "ORTGATE_FAIL_ON"),
                         ("--sarif", "ORTGATE_SARIF")):
        value = env.get(name, "").strip()
        if value:
            argv += [option, value]
    return argv + shlex.split(env.get("ORTGATE_ARGS", ""))


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    if env.get("RUNNER_TEMP"):
        return _main(env, Path(env["RUNNER_TEMP"]))
    with tempfile.TemporaryDirectory(prefix="ortgate-") as work:
        return _main(env, Path(work))


def _main(env: Mapping[str, str], work: Path) -> int:
    markdown, report = work / "ortgate-summary.md", work / "ortgate-report.json"
    for stale in (markdown, report):
        stale.unlink(missing_ok=True)
    sarif = env.get("ORTGATE_SARIF", "").strip()
    if sarif:
        Path(sarif).unlink(missing_ok=True)  # never hand on the SARIF of an earlier run
        Path(sarif).parent.mkdir(parents=True, exist_ok=True)

    if not env.get("ORTGATE_MODEL", "").strip():
        code, errors = EXIT_INPUT, "ortgate: error: the action's `model` input is required"
    else:
        try:
            argv = lint_argv(env, markdown, report)
        except ValueError as exc:  # unbalanced quotes in `model` or `args`
            code, errors = EXIT_INPUT, f"ortgate: error: the action's `model` or `args` input: {exc}"
        else:
            captured = io.StringIO()
            with contextlib.redirect_stderr(captured):
                code = ortgate_main(argv)
            errors = captured.getvalue().strip()
    if errors:
        sys.stderr.write(errors + "\n")
    if code >= EXIT_INPUT and errors:
        first = errors.splitlines()[0].removeprefix("ortgate: error: ")
        print(f"::error title=ortgate::{escape_data(first)}")
    sys.stdout.flush()

    summary = markdown.read_text(encoding="utf-8") if markdown.is_file() else _error_summary(code, errors)
    _append(env.get("GITHUB_STEP_SUMMARY"), summary)
    _write_outputs(env.get("GITHUB_OUTPUT"), _outputs(code, report, sarif))
    return code


def _error_summary(code: int, errors: str) -> str:
    return (f"## ❌ ortgate: could not lint (exit code {code})\n\n"
            f"```\n{errors or 'no message'}\n```\n")


def _outputs(code: int, report: Path, sarif: str) -> dict[str, str]:
    out = {"exit-code": str(code), "errors": "", "warnings": "", "infos": "", "suppressed": "", "passed": "",
           "sarif-file": sarif if sarif and Path(sarif).is_file() else ""}
    if report.is_file():
        verdict = json.loads(report.read_text(encoding="utf-8"))["verdict"]
        out.update(errors=str(verdict["counts"]["error"]), warnings=str(verdict["counts"]["warning"]),
                   infos=str(verdict["counts"]["info"]), suppressed=str(verdict["suppressed"]),
                   passed=str(verdict["passed"]).lower())
    return out


def _append(path: str | None, text: str) -> None:
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text if text.endswith("\n") else text + "\n")


def _write_outputs(path: str | None, outputs: dict[str, str]) -> None:
    """GitHub's multi-line-safe `name<<DELIMITER` form, so no value can forge another output."""
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        for name, value in outputs.items():
            delimiter = f"ghadelimiter_{secrets.token_hex(8)}"
            fh.write(f"{name}<<{delimiter}\n{value}\n{delimiter}\n")


if __name__ == "__main__":
    sys.exit(main())
