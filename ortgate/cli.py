"""The `ortgate` command line. Exit codes: 0 the gate passes, 1 it fails, 2 usage or input error."""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ortgate import __version__
from ortgate.errors import InputError

EXIT_PASS, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3
FORMATS = ("text", "json")
LINT_FORMATS = ("text", "json", "sarif", "github", "markdown")


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors are one line in ortgate's error format."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise InputError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ortgate", description="Graph diagnostics linter and CI gate for LLMs on ONNX Runtime.")
    parser.add_argument("--version", action="store_true", help="print versions (ortgate, onnxruntime, kernel table)")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    lint = sub.add_parser("lint", help="lint a model (and its deployment policy) and apply the gate")
    lint.add_argument("model", help="an .onnx file, or a folder holding model.onnx (and genai_config.json)")
    lint.add_argument("--policy", help="deployment policy YAML")
    lint.add_argument("--optimized", metavar="DUMP", help="ORT's optimized model dump (optimized_model_filepath)")
    lint.add_argument("--config", help="onnxruntime-genai genai_config.json (default: the one beside the model)")
    lint.add_argument("--format", choices=LINT_FORMATS, default="text",
                      help="report format on stdout (or --output): text, json, sarif, github (workflow "
                           "annotations), markdown (job summary)")
    lint.add_argument("--output", metavar="FILE", help="write the report to FILE instead of stdout")
    lint.add_argument("--sarif", metavar="FILE", help="also write a SARIF 2.1.0 report to FILE")
    lint.add_argument("--markdown", metavar="FILE", help="also write the markdown job summary to FILE")
    lint.add_argument("--json", metavar="FILE", dest="json_output", help="also write the JSON report to FILE")
    lint.add_argument("--baseline", metavar="FILE",
                      help="an ortgate baseline: findings listed in it are reported as suppressed")
    lint.add_argument("--write-baseline", metavar="FILE",
                      help="write every current finding (not covered by a waiver) to FILE as the new baseline, "
                           "then judge against it")
    lint.add_argument("--fail-on", choices=("error", "warning", "info"),
                      help="lowest severity that fails the gate (default: the policy's rules.fail_on, else error)")
    lint.add_argument("--select", metavar="RULES", help="comma-separated rule names, codes or code prefixes to run")
    lint.add_argument("--ignore", metavar="RULES", help="comma-separated rule names, codes or code prefixes to skip")
    lint.add_argument("--exit-zero", action="store_true", help="exit 0 even when the gate fails")

    from ortgate.runner.cli import add_run_parser

    add_run_parser(sub)

    rules = sub.add_parser("rules", help="list every rule")
    rules.add_argument("--format", choices=FORMATS, default="text")

    explain = sub.add_parser("explain", help="show a rule's documentation")
    explain.add_argument("rule", metavar="CODE|NAME")

    policy = sub.add_parser("policy", help="policy files")
    policy_sub = policy.add_subparsers(dest="policy_command", parser_class=_Parser)
    validate = policy_sub.add_parser("validate", help="check a policy against the schema (and its extends chain)")
    validate.add_argument("file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _dispatch(build_parser(), list(sys.argv[1:] if argv is None else argv))
    except InputError as exc:
        _error(exc.one_line())
        return EXIT_INPUT
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except MemoryError:
        _error("out of memory")
        return EXIT_INPUT
    except BrokenPipeError:
        return EXIT_PASS
    except Exception as exc:  # never a traceback in CI logs; ORTGATE_STRICT=1 shows it
        if os.environ.get("ORTGATE_STRICT") == "1":
            raise
        _error(f"internal error: {type(exc).__name__}: {' '.join(str(exc).split())} (please report this)")
        return EXIT_INTERNAL


def _error(message: str) -> None:
    print(f"ortgate: error: {message}", file=sys.stderr)


def _dispatch(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    args = parser.parse_args(argv)
    if args.version:
        print(version_text())
        return EXIT_PASS
    if args.command == "lint":
        from ortgate.lint.graph import gc_paused

        # One short-lived pass that allocates a large, acyclic index: the cyclic collector would only rescan it.
        with gc_paused():
            return cmd_lint(args)
    if args.command == "run":
        from ortgate.runner.cli import cmd_run

        return cmd_run(args)
    if args.command == "rules":
        return cmd_rules(args)
    if args.command == "explain":
        return cmd_explain(args)
    if args.command == "policy" and args.policy_command == "validate":
        return cmd_policy_validate(args)
    if args.command == "policy":
        raise InputError("policy: a subcommand is required: validate (see `ortgate policy --help`)")
    raise InputError("a command is required: lint, run, rules, explain or policy (see `ortgate --help`)")


def version_text() -> str:
    from ortgate.knowledge import kernel_table

    try:
        import onnxruntime

        ort = onnxruntime.__version__
    except ImportError:
        ort = "not installed"
    import onnx

    table = kernel_table()
    return (f"ortgate {__version__}\nonnxruntime {ort} (installed)\nonnx {onnx.__version__}\n"
            f"kernel table: {table.ort_version} (commit {table.commit[:12]})")


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def _check_output_path(output: str | None, inputs: list[str | None]) -> None:
    """Never write over something the user gave us."""
    if output is None:
        return
    out = Path(output)
    for given in inputs:
        if given and out.exists() and Path(given).exists() and out.resolve() == Path(given).resolve():
            raise InputError("refusing to write the report over an input file", output)
    if out.exists() and out.is_dir():
        raise InputError("is a directory", output)
    if not out.parent.exists():
        raise InputError("its folder does not exist", output)


def _write(text: str, output: str | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", output) from None


# A lint that ends sooner than this shows no spinner at all (no flicker on small models).
PROGRESS_DELAY_S = 0.4


def _progress_wanted() -> bool:
    """Progress goes to stderr only when stderr is an interactive terminal (never in CI logs or pipes)."""
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


@contextmanager
def _progress(enabled: bool, delay: float | None = None) -> Iterator:
    """A transient spinner on stderr saying what is being loaded or analysed, once the work has taken longer
    than `delay` seconds (default PROGRESS_DELAY_S). Yields `note(message)`; does nothing when not enabled."""
    if not enabled:
        yield lambda _msg: None
        return
    import threading

    from rich.console import Console

    status = Console(stderr=True).status("ortgate: starting")
    lock = threading.Lock()
    state = {"shown": False, "over": False}

    def show() -> None:
        with lock:
            if not state["over"]:
                status.start()
                state["shown"] = True

    delay = PROGRESS_DELAY_S if delay is None else delay
    timer = threading.Timer(delay, show)
    timer.daemon = True
    if delay > 0:
        timer.start()
    else:
        show()
    try:
        yield lambda msg: status.update(f"ortgate: {msg}")
    finally:
        timer.cancel()
        with lock:
            state["over"] = True
            if state["shown"]:
                status.stop()


def cmd_lint(args: argparse.Namespace) -> int:
    from ortgate.lint.engine import LintRequest, LintResult, load_inputs, run_rules, summarize
    from ortgate.lint.gate import apply_gate, baseline_text, decide, gate_config_from, load_baseline, selected_rules
    from ortgate.report import render

    given = [args.model, args.policy, args.optimized, args.config, args.baseline]
    reports = [(args.format, args.output)] + [(fmt, path) for fmt, path in (
        ("sarif", args.sarif), ("markdown", args.markdown), ("json", args.json_output)) if path]
    _check_distinct_outputs([path for _fmt, path in reports] + [args.write_baseline])
    for _fmt, path in reports:
        _check_output_path(path, given)
    _check_output_path(args.write_baseline, [])  # inputs are checked once loaded (_check_baseline_target)
    baseline = load_baseline(args.baseline) if args.baseline else None
    request = LintRequest(args.model, args.policy, args.optimized, args.config)
    with _progress(_progress_wanted()) as note:
        inputs = load_inputs(request, note)
        config = gate_config_from(inputs.policy, cli_select=_split(args.select), cli_ignore=_split(args.ignore),
                                  fail_on=args.fail_on, baseline=baseline, baseline_path=args.baseline)
        rules = selected_rules(config)
        raw = run_rules(inputs, rules, note)
        findings = apply_gate(raw, config)
    if args.write_baseline:
        _check_baseline_target(args.write_baseline, inputs, args.baseline)
        text = baseline_text(findings)
        _write(text, args.write_baseline)
        config.baseline, config.baseline_path = load_baseline(args.write_baseline), args.write_baseline
        findings = apply_gate(raw, config)
    verdict = decide(findings, config.fail_on)
    result = LintResult(findings, verdict, summarize(inputs), rules)
    for fmt, path in reports:
        _write(render(fmt, result), path)
    if args.exit_zero:
        return EXIT_PASS
    return verdict.exit_code


def _check_distinct_outputs(paths: list[str | None]) -> None:
    seen: dict[Path, str] = {}
    for p in paths:
        if p is None:
            continue
        key = Path(p).resolve()
        if key in seen:
            raise InputError("two outputs would be written to the same file", p)
        seen[key] = p


def _check_baseline_target(path: str, inputs, baseline_in: str | None) -> None:
    """--write-baseline may rewrite the --baseline it read, never another input or a file that is not a baseline."""
    from ortgate.lint.gate import is_baseline_file

    target = Path(path).resolve()
    inputs_read = [inputs.model.path, inputs.optimized.path if inputs.optimized else None,
                   inputs.genai.path if inputs.genai else None, *(inputs.policy.chain if inputs.policy else ())]
    if any(p is not None and Path(p).resolve() == target for p in inputs_read):
        raise InputError("refusing to write the baseline over an input file", path)
    if target.exists() and not (baseline_in and Path(baseline_in).resolve() == target) and not is_baseline_file(target):
        raise InputError("refusing to overwrite: the file exists and is not an ortgate baseline", path)


def cmd_rules(args: argparse.Namespace) -> int:
    from ortgate.rules import all_rules

    rules = all_rules()
    if args.format == "json":
        payload = [{"code": r.code, "name": r.name, "severity": r.severity.label, "family": r.family,
                    "summary": r.summary} for r in rules]
        print(json.dumps(payload, indent=2))
        return EXIT_PASS
    width = max(len(r.name) for r in rules)
    for r in rules:
        print(f"{r.code}  {r.name:<{width}}  {r.severity.label:<7}  {r.summary}")
    return EXIT_PASS


def cmd_explain(args: argparse.Namespace) -> int:
    from ortgate.rules import find_rule, suggest_rule

    r = find_rule(args.rule)
    if r is None:
        hint = suggest_rule(args.rule)
        raise InputError(f"unknown rule {args.rule!r}" + (f"; did you mean {hint!r}?" if hint else "; `ortgate rules` lists them"))
    text = f"# {r.code} {r.name} (default severity: {r.severity.label})\n\n{r.doc}\n"
    if sys.stdout.isatty():
        from rich.console import Console
        from rich.markdown import Markdown

        Console().print(Markdown(text))
    else:
        sys.stdout.write(text)
    return EXIT_PASS


def cmd_policy_validate(args: argparse.Namespace) -> int:
    from ortgate.policies.loader import load_policy

    from ortgate.lint.gate import gate_config_from

    policy = load_policy(args.file)
    gate_config_from(policy, cli_select=None, cli_ignore=None, fail_on=None)  # rule names in rules: and waivers:
    chain = " <- ".join(str(p) for p in policy.chain[1:])
    print(f"{args.file}: valid policy {policy.name!r}" + (f" (extends {chain})" if chain else ""))
    return EXIT_PASS
