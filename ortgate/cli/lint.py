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
    lint.add_argument("--write-baseline", metavar="FILE",
                      help="write every current finding (not covered by a waiver) to FILE as the new baseline, "
                           "then judge against it")
    lint.add_argument("--fail-on", choices=("error", "warning", "info"),
                      help="lowest severity that fails the gate (default: the policy's rules.fail_on, else error)")
    lint.add_argument("--select", metavar="RULES", help="comma-separated rule names, codes or code prefixes to run")
    lint.add_argument("--ignore", metavar="RULES", help="comma-separated rule names, codes or code prefixes to skip")
    lint.add_argument("--exit-zero", action="store_true", help="exit 0 even when the gate fails")
    lint.add_argument("--expand", action="store_true",
                      help="text and markdown: list every finding on its own, in full, instead of one entry per "
                           "group of identical findings across layers")


def cmd_lint(args: argparse.Namespace) -> int:
    from ortgate.engine.baseline import baseline_text, load_baseline
    from ortgate.engine.gate import gate_config_from
    from ortgate.engine.pipeline import LintRequest, judge, lint, load_inputs
    from ortgate.graph.index import gc_paused
    from ortgate.report import render

    reports = [(args.format, args.output)] + [(fmt, path) for fmt, path in (
        ("sarif", args.sarif), ("markdown", args.markdown), ("json", args.json_output)) if path]
    outputs = [Output(path, "report" if i == 0 else _REPORT_NAMES[fmt]) for i, (fmt, path) in enumerate(reports)
               if path is not None]
    if args.write_baseline:
        outputs.append(Output(args.write_baseline, "baseline", may_replace=args.baseline))
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
    if args.write_baseline:
        _check_baseline_target(args.write_baseline, args.baseline)
        write(baseline_text(result.findings), args.write_baseline)
        config.baseline, config.baseline_path = load_baseline(args.write_baseline), args.write_baseline
        result = judge(result.raw, inputs, config, result.rules)
    for fmt, path in reports:
        write(render(fmt, result, **terminal_options(path), expand=args.expand), path)
    if args.exit_zero:
        return EXIT_PASS
    return result.verdict.exit_code


def _check_baseline_target(path: str, baseline_in: str | None) -> None:
    """--write-baseline may rewrite the --baseline it read (check_outputs refused every other input), never a file
    that is not a baseline."""
    from ortgate.engine.baseline import is_baseline_file

    target = Path(path).resolve()
    if target.exists() and not (baseline_in and Path(baseline_in).resolve() == target) and not is_baseline_file(target):
        raise InputError("refusing to overwrite: the file exists and is not an ortgate baseline", path)


_REPORT_NAMES = {"sarif": "SARIF report", "markdown": "markdown report", "json": "JSON report"}
