"""`ortgate lint`: lint a model and its deployment, gate, and write the reports."""

from __future__ import annotations

import argparse
from pathlib import Path

from ortgate.cli.output import (
    EXIT_PASS,
    Output,
    check_outputs,
    progress,
    progress_wanted,
    split_list,
    terminal_options,
    write,
)
from ortgate.errors import InputError

LINT_FORMATS = ("text", "json", "sarif", "github", "markdown")


def add_parser(sub) -> None:
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
    add_baseline_arguments(lint)
    lint.add_argument("--fail-on", choices=("error", "warning", "info"),
                      help="lowest severity that fails the gate (default: the policy's rules.fail_on, else error)")
    lint.add_argument("--select", metavar="RULES", help="comma-separated rule names, codes or code prefixes to run")
    lint.add_argument("--ignore", metavar="RULES", help="comma-separated rule names, codes or code prefixes to skip")
    lint.add_argument("--exit-zero", action="store_true", help="exit 0 even when the gate fails")
    lint.add_argument("--expand", action="store_true",
                      help="text and markdown: list every finding on its own, in full, instead of one entry per "
                           "group of identical findings across layers")


def cmd_lint(args: argparse.Namespace) -> int:
    from ortgate.engine.baseline import load_baseline
    from ortgate.engine.gate import gate_config_from
    from ortgate.engine.pipeline import LintRequest, lint, load_inputs
    from ortgate.graph.index import gc_paused
    from ortgate.report import render

    reports = [(args.format, args.output)] + [(fmt, path) for fmt, path in (
        ("sarif", args.sarif), ("markdown", args.markdown), ("json", args.json_output)) if path]
    outputs = [Output(path, "report" if i == 0 else _REPORT_NAMES[fmt]) for i, (fmt, path) in enumerate(reports)
               if path is not None]
    outputs += baseline_outputs(args)
    given = [args.model, args.policy, args.optimized, args.config, args.baseline]
    check_outputs(outputs, given)  # before loading: a mistyped command fails at once
    baseline = load_baseline(args.baseline) if args.baseline else None
    request = LintRequest(args.model, args.policy, args.optimized, args.config)
    # One short-lived pass that allocates a large, acyclic index: the cyclic collector would only rescan it.
    with gc_paused(), progress(progress_wanted()) as note:
        inputs = load_inputs(request, note)
        check_outputs(outputs, [*inputs.files_read, args.baseline])  # every file read, now that all are known
        config = gate_config_from(inputs.policy, cli_select=split_list(args.select),
                                  cli_ignore=split_list(args.ignore), fail_on=args.fail_on, baseline=baseline,
                                  baseline_path=args.baseline)
        result = lint(inputs, config, note)
    result = write_baselines(args, result, inputs, config)
    for fmt, path in reports:
        write(render(fmt, result, **terminal_options(path), expand=args.expand), path)
    if args.exit_zero:
        return EXIT_PASS
    return result.verdict.exit_code


def add_baseline_arguments(parser) -> None:
    parser.add_argument("--write-baseline", metavar="FILE",
                        help="write every current finding (not covered by a waiver) to FILE as the new baseline, "
                             "then judge against it")
    parser.add_argument("--prune-baseline", action="store_true",
                        help="rewrite the --baseline file without its stale entries (entries that matched no "
                             "finding), as the current baseline version")


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


def write_baselines(args: argparse.Namespace, result, inputs, config):
    """Write --write-baseline or the pruned --baseline, and judge again against what was written."""
    from ortgate.engine.baseline import baseline_text, load_baseline, pruned_text
    from ortgate.engine.gate import rules_that_ran
    from ortgate.engine.pipeline import judge, linted_files

    if args.write_baseline:
        _check_baseline_target(args.write_baseline, args.baseline)
        write(baseline_text(result.findings), args.write_baseline)
        target = args.write_baseline
    elif args.prune_baseline:
        baseline = config.baseline
        ran = rules_that_ran(config, [e.rule for e in baseline.entries])
        write(pruned_text(baseline, result.findings, linted_files(inputs), ran), args.baseline)
        target = args.baseline
    else:
        return result
    config.baseline, config.baseline_path = load_baseline(target), target
    return judge(result.raw, inputs, config, result.rules)


def _check_baseline_target(path: str, baseline_in: str | None) -> None:
    """--write-baseline may rewrite the --baseline it read (check_outputs refused every other input), never a file
    that is not a baseline."""
    from ortgate.engine.baseline import is_baseline_file

    target = Path(path).resolve()
    if target.exists() and not (baseline_in and Path(baseline_in).resolve() == target) and not is_baseline_file(target):
        raise InputError("refusing to overwrite: the file exists and is not an ortgate baseline", path)


_REPORT_NAMES = {"sarif": "SARIF report", "markdown": "markdown report", "json": "JSON report"}
