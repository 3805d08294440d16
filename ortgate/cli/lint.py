"""`ortgate lint`: lint a model and its deployment, gate, and write the reports."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from ortgate.cli.args import REPORT_FORMATS, GateArgs, GenaiConfigArgs, ReleaseArgs, ReportArgs
from ortgate.cli.output import (
    EXIT_PASS,
    Output,
    check_outputs,
    progress,
    progress_wanted,
    release_notice,
    terminal_options,
    write,
)
from ortgate.errors import InputError

if TYPE_CHECKING:
    from ortgate.engine.gate import GateConfig
    from ortgate.rules.context import LintInputs

LINT_FORMATS = REPORT_FORMATS
# --FLAG FILE: a report beside the main one (its format, the argparse dest, what an error calls it).
SIDE_REPORTS = (("sarif", "sarif", "SARIF report"), ("markdown", "markdown", "markdown report"),
                ("json", "json_output", "JSON report"), ("junit", "junit", "JUnit XML report"),
                ("codequality", "codequality", "Code Quality report"))
_GLOB_CHARS = frozenset("*?[")


def add_parser(sub) -> None:
    lint = sub.add_parser("lint", help="lint models (and their deployment policy) and apply the gate")
    lint.add_argument("model", nargs="+",
                      help="an .onnx file, or a folder holding model.onnx (and genai_config.json); several, or a "
                           "quoted glob (models/*/model.onnx, models/**/*.onnx), give one report and one exit code")
    lint.add_argument("--policy", help="deployment policy YAML")
    lint.add_argument("--optimized", metavar="DUMP", help="ORT's optimized model dump (optimized_model_filepath)")
    GenaiConfigArgs.add_to(lint)
    ReleaseArgs.add_to(lint)
    ReportArgs.add_to(lint)
    lint.add_argument("--sarif", metavar="FILE", help="also write a SARIF 2.1.0 report to FILE")
    lint.add_argument("--markdown", metavar="FILE", help="also write the markdown job summary to FILE")
    lint.add_argument("--json", metavar="FILE", dest="json_output", help="also write the JSON report to FILE")
    lint.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE (one test per rule)")
    lint.add_argument("--codequality", metavar="FILE",
                      help="also write a GitLab Code Quality report to FILE (artifacts:reports:codequality)")
    GateArgs.add_to(lint)
    lint.add_argument("--exit-zero", action="store_true", help="exit 0 even when the gate fails")
    add_compare_argument(lint)
    lint.add_argument("--expand", action="store_true",
                      help="text and markdown: list every finding on its own, in full, instead of one entry per "
                           "group of identical findings across layers")


# What each lint of the `ortgate` process leaves to the process's exit (a list there, see cli.main.console: the exit
# skips the interpreter's teardown, so the graph index is never freed object by object). None in-process: a library
# caller's lint frees what it built when it returns.
KEPT_UNTIL_EXIT: list | None = None


def cmd_lint(args: argparse.Namespace) -> int:
    from ortgate.engine.baseline import load_baseline
    from ortgate.engine.gate import gate_config_from, selected_rules
    from ortgate.engine.pipeline import LintRequest, collect, judge, load_inputs
    from ortgate.graph.index import gc_paused
    from ortgate.report import render

    gate = GateArgs.parse(args)
    release = ReleaseArgs.parse(args)
    models = expand_models(args.model)
    if len(models) > 1 and (args.optimized or args.config):
        flag = "--optimized" if args.optimized else "--config"
        raise InputError(f"{flag} belongs to one model; lint the {len(models)} models one at a time to use it")
    report = ReportArgs.parse(args)
    reports = [(report.format, report.output)] + [(fmt, getattr(args, dest)) for fmt, dest, _ in SIDE_REPORTS
                                                  if getattr(args, dest)]
    names = {fmt: what for fmt, _, what in SIDE_REPORTS}
    outputs = [Output(path, "report" if i == 0 else names[fmt]) for i, (fmt, path) in enumerate(reports)
               if path is not None]
    outputs += baseline_outputs(args)
    check_compare(args, models)
    given = [*models, args.policy, args.optimized, args.config, args.baseline, args.compare]
    check_outputs(outputs, given)  # before loading: a mistyped command fails at once
    baseline = load_baseline(args.baseline) if args.baseline else None
    # One short-lived pass that allocates a large, acyclic index: the cyclic collector would only rescan it.
    with gc_paused(), progress(progress_wanted()) as note:
        inputs: list[LintInputs] = []
        for model in models:
            one = load_inputs(LintRequest(model, args.policy, args.optimized, args.config,
                                          ort_version=release.ort_version), note)
            if all(Path(one.model.path).resolve() != Path(o.model.path).resolve() for o in inputs):
                inputs.append(one)  # a model named twice (its folder and its file, two globs) is linted once
        release_notice(inputs[0])
        base = None
        if args.compare:
            from dataclasses import replace

            from ortgate.engine.compare import load_base

            base = load_base(args.compare, inputs[0], args.policy, note)
            base.model.label = args.compare_label
            inputs[0] = replace(inputs[0], base=base)
        # every file read, now that all are known
        check_outputs(outputs, [*(p for one in inputs for p in one.files_read), args.baseline,
                                *(base.files_read if base is not None else ())])
        config = gate_config_from(inputs[0].policy, cli_select=gate.select, cli_ignore=gate.ignore,
                                  fail_on=gate.fail_on, baseline=baseline, baseline_path=gate.baseline,
                                  preview=gate.preview)
        rules = selected_rules(config)
        raw = collect(inputs, rules, note)
        # judged once: against the baseline this command writes, when it writes one
        config = rebaselined(args, raw, inputs, config)
        result = judge(raw, inputs, config, rules)
    if base is not None:
        from ortgate.engine.compare import compare, with_comparison

        result = with_comparison(result, compare(result, inputs[0], base, config))
    for fmt, path in reports:
        write(render(fmt, result, **terminal_options(path), expand=args.expand), path)
    if KEPT_UNTIL_EXIT is not None:
        KEPT_UNTIL_EXIT.append((inputs, result))
    if args.exit_zero:
        return EXIT_PASS
    return result.verdict.exit_code


def add_compare_argument(parser) -> None:
    parser.add_argument("--compare", metavar="BASE_MODEL",
                        help="compare with the model this one changes (an .onnx file or model folder, as MODEL): "
                             "findings that appeared and disappeared, the estimate's change; the policy's "
                             "throughput.max_regression gates on it")
    # What reports call the base (the Action: "main:models/qwen/model.onnx" for a base it read with git).
    parser.add_argument("--compare-label", help=argparse.SUPPRESS)


def check_compare(args: argparse.Namespace, models: list[str]) -> None:
    """--compare compares one model, as exported, with its base."""
    if not getattr(args, "compare", None):
        return
    if len(models) > 1:
        raise InputError(f"--compare compares one model with its base; lint the {len(models)} models one at a time "
                         "to compare each")
    if args.optimized:
        raise InputError("--compare compares two models as exported; drop --optimized to compare them")


def baseline_outputs(args: argparse.Namespace) -> list[Output]:
    """The baseline files this command may write (--write-baseline, --prune-baseline rewrites --baseline)."""
    if args.prune_baseline and not args.baseline:
        raise InputError("--prune-baseline rewrites the --baseline FILE: give --baseline")
    if args.prune_baseline and args.write_baseline:
        raise InputError("--prune-baseline and --write-baseline both write a baseline: use one")
    outputs = []
    if args.write_baseline:
        outputs.append(Output(args.write_baseline, "baseline", may_replace=args.baseline))
    if args.prune_baseline:
        outputs.append(Output(args.baseline, "pruned baseline", may_replace=args.baseline))
    return outputs


def baseline_target(args: argparse.Namespace) -> str | None:
    """The file this command writes a baseline to: --write-baseline FILE, or the --baseline file --prune-baseline
    rewrites (None: it writes none)."""
    return args.write_baseline or (args.baseline if args.prune_baseline else None)


def write_baseline(args: argparse.Namespace, text: str) -> None:
    """Write the baseline `text` to --write-baseline FILE, or over the --baseline file --prune-baseline prunes."""
    if args.write_baseline:
        _check_baseline_target(args.write_baseline, args.baseline)
    write(text, baseline_target(args))


def rebaselined(args: argparse.Namespace, raw, inputs, config: GateConfig) -> GateConfig:
    """Write --write-baseline or the pruned --baseline from the rules' findings `raw`; the gate's configuration to
    judge them with: against what was written, else `config` itself."""
    from ortgate.engine.gate import rebaseline
    from ortgate.engine.pipeline import linted_files

    target = baseline_target(args)
    if target is None:
        return config
    text, judged_by = rebaseline(raw, config, linted_files(inputs), target, prune=args.prune_baseline)
    write_baseline(args, text)
    return judged_by


def _check_baseline_target(path: str, baseline_in: str | None) -> None:
    """--write-baseline may rewrite the --baseline it read (check_outputs refused every other input), never a file
    that is not a baseline."""
    from ortgate.engine.baseline import is_baseline_file

    target = Path(path).resolve()
    if target.exists() and not (baseline_in and Path(baseline_in).resolve() == target) and not is_baseline_file(target):
        raise InputError("refusing to overwrite: the file exists and is not an ortgate baseline", path)


def expand_models(given: list[str]) -> list[str]:
    """The models named: paths as given, globs expanded (sorted; `**` crosses folders) where the shell did not,
    each model once. A glob that matches nothing is an error, so a typo never passes the gate on nothing."""
    models: list[str] = []
    for arg in given:
        if Path(arg).exists() or not _GLOB_CHARS.intersection(arg):
            models.append(arg)
            continue
        import glob

        matches = sorted(glob.glob(arg, recursive=True))
        if not matches:
            raise InputError("no file or folder matches this pattern", arg)
        models += matches
    seen: set[Path] = set()
    unique = []
    for model in models:
        key = Path(model).resolve()
        if key not in seen:
            seen.add(key)
            unique.append(model)
    return unique
