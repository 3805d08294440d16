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
import shutil
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ortgate.cli.main import main as ortgate_main
from ortgate.cli.output import EXIT_INPUT
from ortgate.errors import is_lfs_pointer
from ortgate.report.github import escape_data

BASE_FOLDER = "ortgate-base"  # where the step writes the base's model files, under the runner's temp folder
# The files of a model folder the linter reads (never the weights: external data stays in git).
_BASE_SUFFIXES = (".onnx", ".json")


@dataclass
class BaseModel:
    """The model as it is at compare-ref, read with git into a temp folder; or why there is no comparison."""

    path: Path | None = None  # the base's copy to pass to --compare
    label: str = ""  # "main:models/qwen" for the reports
    why_not: str | None = None  # "no comparison: ..." (None: a comparison, or none asked for)


def base_model(env: Mapping[str, str], work: Path) -> BaseModel:
    """The base to compare with: the model's path at the `compare-ref` input, read with `git cat-file` (no checkout,
    nothing written into the repository). A missing ref, or a model the ref does not hold (a new model), is no
    comparison, said in the summary; an empty `compare-ref` (a push, not a pull request) asks for none."""
    ref = env.get("ORTGATE_COMPARE_REF", "").strip()
    if not ref:
        return BaseModel()
    if ref.startswith("-") or not ref.isprintable():
        return BaseModel(why_not=f"no comparison: compare-ref {ref!r} is not a git ref")
    models = shlex.split(env.get("ORTGATE_MODEL", ""))
    if len(models) != 1 or any(c in models[0] for c in "*?["):
        return BaseModel(why_not=f"no comparison: compare-ref compares one model, and `model` names "
                                 f"{'a glob' if len(models) == 1 else f'{len(models)} paths'}")
    model = Path(models[0])
    top = _git(["rev-parse", "--show-toplevel"], Path.cwd())
    if top is None:
        return BaseModel(why_not="no comparison: the workspace is not a git repository")
    root = Path(top.decode().strip())
    try:
        inside = (Path.cwd() / model).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return BaseModel(why_not=f"no comparison: {model} is not inside the repository")
    commit = _commit(ref, root)
    if commit is None:
        return BaseModel(why_not=f"no comparison: compare-ref {ref!r} names no commit, branch or tag of this "
                                 "repository (nor of its origin remote)")
    listed = _git(["ls-tree", "-r", "--name-only", commit, "--", inside], root)
    names = [n for n in (listed or b"").decode("utf-8", "surrogateescape").splitlines() if n]
    label = f"{ref}:{inside}"
    if not names:
        return BaseModel(label=label, why_not=f"no comparison: {inside} does not exist at {ref} (a new model)")
    folder = len(names) > 1 or names[0] != inside
    wanted = [n for n in names if not folder or ("/" not in n[len(inside) + 1:] and n.endswith(_BASE_SUFFIXES))]
    if not folder:  # a model file: the genai_config.json beside it is read with it, as beside the model
        beside = f"{inside.rpartition('/')[0]}/genai_config.json".lstrip("/")
        if _git(["cat-file", "-e", f"{commit}:{beside}"], root) is not None:
            wanted.append(beside)
    if not wanted:
        return BaseModel(label=label, why_not=f"no comparison: {inside} at {ref} holds no model (no .onnx file)")
    base_root = work / BASE_FOLDER
    shutil.rmtree(base_root, ignore_errors=True)
    for name in wanted:
        blob = _git(["cat-file", "blob", f"{commit}:{name}"], root)
        if blob is None:
            return BaseModel(label=label, why_not=f"no comparison: git cannot read {name} at {ref}")
        if is_lfs_pointer(blob[:100]):  # a graph stored with Git LFS: its object, as a checkout would smudge it
            blob = _git(["lfs", "smudge", "--", name], root, stdin=blob) or blob
        target = base_root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(blob)
    return BaseModel(base_root / inside, label)


def _commit(ref: str, root: Path) -> str | None:
    """The commit `ref` names here, else on the origin remote (a pull request's base branch; fetched shallow, its
    commit only, when the checkout does not have it)."""
    for name in (ref, f"origin/{ref}"):
        found = _git(["rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"], root)
        if found:
            return found.decode().strip()
    if _git(["fetch", "--no-tags", "--depth=1", "--quiet", "origin", "--", ref], root) is not None:
        found = _git(["rev-parse", "--verify", "--quiet", "FETCH_HEAD^{commit}"], root)
        if found:
            return found.decode().strip()
    return None


def _git(args: list[str], cwd: Path, stdin: bytes | None = None) -> bytes | None:
    """git's stdout, or None when it fails (or is not installed)."""
    import subprocess

    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=120, check=False, input=stdin,
                              env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


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

    why_not: str | None = None
    if not env.get("ORTGATE_MODEL", "").strip():
        code, errors = EXIT_INPUT, "ortgate: error: the action's `model` input is required"
    else:
        try:
            argv = lint_argv(env, markdown, report)
        except ValueError as exc:  # unbalanced quotes in `model` or `args`
            code, errors = EXIT_INPUT, f"ortgate: error: the action's `model` or `args` input: {exc}"
        else:
            base = base_model(env, work)
            compared = argv + ["--compare", str(base.path), "--compare-label", base.label] if base.path else argv
            code, errors = _lint(compared)
            if base.path is not None and code == EXIT_INPUT and str(work / BASE_FOLDER) in errors:
                # The base is no model lint can read (an LFS pointer, a file that is no ONNX model): no comparison,
                # and the lint runs as without one.
                ref = env.get("ORTGATE_COMPARE_REF", "").strip()
                first = errors.splitlines()[0].removeprefix("ortgate: error: ")
                first = first.replace(f"{work / BASE_FOLDER}/", f"{ref}:").replace("--compare: ", "")
                base = BaseModel(label=base.label, why_not=f"no comparison: the base cannot be read: {first}")
                code, errors = _lint(argv)
            shutil.rmtree(work / BASE_FOLDER, ignore_errors=True)
            why_not = base.why_not
            if base.path is not None and sarif:
                _drop_absent(Path(sarif))
    if errors:
        sys.stderr.write(errors + "\n")
    if code >= EXIT_INPUT and errors:
        first = errors.splitlines()[0].removeprefix("ortgate: error: ")
        print(f"::error title=ortgate::{escape_data(first)}")
    sys.stdout.flush()

    summary = markdown.read_text(encoding="utf-8") if markdown.is_file() else _error_summary(code, errors)
    if why_not:
        summary = _with_note(summary, why_not)
    _append(env.get("GITHUB_STEP_SUMMARY"), summary)
    _write_outputs(env.get("GITHUB_OUTPUT"), _outputs(code, report, sarif))
    return code


def _drop_absent(sarif: Path) -> None:
    """The step's SARIF without the base's findings the change fixed (results with baselineState absent): GitHub
    code scanning takes every result for an alert whatever its `kind`, so an absent result, which carries the fixed
    alert's fingerprint, would keep that alert open. The summary lists them; `ortgate lint --sarif` keeps them."""
    if not sarif.is_file():
        return
    log = json.loads(sarif.read_text(encoding="utf-8"))
    for run in log.get("runs", []):
        run["results"] = [r for r in run.get("results", []) if r.get("baselineState") != "absent"]
    sarif.write_text(json.dumps(log, allow_nan=False, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _lint(argv: list[str]) -> tuple[int, str]:
    captured = io.StringIO()
    with contextlib.redirect_stderr(captured):
        code = ortgate_main(argv)
    return code, captured.getvalue().strip()


def _with_note(summary: str, note: str) -> str:
    """The summary with a line saying why there is no comparison, after its heading."""
    from ortgate.report.markdown import _cell

    head, sep, rest = summary.partition("\n\n")
    return f"{head}{sep}**No comparison:** {_cell(note.removeprefix('no comparison: '))}\n\n{rest}"


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
