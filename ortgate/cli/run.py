"""The `ortgate run` subcommand: its arguments and what it prints. Exit codes as `ortgate lint`: 0 the gate
passes, 1 it fails (ORT refused the model, or the run passed --timeout, among the findings), 2 usage or input
error."""

from __future__ import annotations

import argparse
import sys

from ortgate.cli.args import GateArgs, GenaiConfigArgs, ReportArgs
from ortgate.cli.lint import (
    LINT_FORMATS,
    SIDE_REPORTS,
    baseline_outputs,
    baseline_target,
    write_baseline,
)
from ortgate.cli.output import (
    EXIT_PASS,
    Output,
    check_outputs,
    require_onnxruntime,
    terminal_options,
    write,
)
from ortgate.errors import InputError

FORMATS = LINT_FORMATS


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="build the policy's ONNX Runtime session, prove and measure it, and gate on "
                                     "what it saw")
    run.add_argument("model", help="an .onnx file, or a folder holding model.onnx (and genai_config.json)")
    run.add_argument("--policy", required=True, help="deployment policy YAML: the session to build")
    GenaiConfigArgs.add_to(run)
    run.add_argument("--dump", metavar="OUT.onnx",
                     help="keep the session's optimized model here (default: a temporary file, linted then deleted)")
    run.add_argument("--profile", nargs="?", const=True, default=False, metavar="TRACE.json",
                     help="profile the policy session: per-op and per-provider time tables (and keep ORT's trace "
                          "in TRACE.json if given)")
    run.add_argument("--warmup", type=int, metavar="N", help="warm-up runs (default: runner.warmup, else 3)")
    run.add_argument("--iterations", type=int, metavar="N", help="timed runs (default: runner.iterations, else 20)")
    run.add_argument("--compare-default", action="store_true",
                     help="also measure ORT's default session (speedup) and compare outputs with ORT_DISABLE_ALL")
    run.add_argument("--allow-cpu", action="store_true",
                     help="if the policy's provider is not available here, run the same config on CPU "
                          "(every figure is labelled CPU)")
    run.add_argument("--allow-custom-ops", action="store_true",
                     help="load the custom-op libraries named by the policy's session.custom_op_libraries")
    run.add_argument("--timeout", type=float, metavar="S",
                     help="stop the run after S seconds: a run-timeout finding, the report, exit 1")
    ReportArgs.add_to(run)
    for fmt, dest, what in SIDE_REPORTS:
        run.add_argument(f"--{fmt if dest != 'json_output' else 'json'}", metavar="FILE", dest=dest,
                         help=f"also write the {what} to FILE")
    GateArgs.add_to(run)
    run.add_argument("--exit-zero", action="store_true", help="exit 0 even when the gate fails")
    run.add_argument("--write-calibration", metavar="FILE",
                     help="write the device figures fitted to this measurement to FILE (YAML), for a policy's "
                          "throughput.calibration")
    run.add_argument("--expand", action="store_true",
                     help="text and markdown: list every finding on its own, in full, instead of one entry per "
                          "group of identical findings across layers")


def cmd_run(args: argparse.Namespace) -> int:
    require_onnxruntime("`ortgate run`")
    from ortgate.engine.baseline import load_baseline
    from ortgate.engine.run import RunGate, run_reference
    from ortgate.runner.collect import RunRequest
    from ortgate.runner.progress import RunProgress

    report = ReportArgs.parse(args)
    reports = [(report.format, report.output)] + [(fmt, getattr(args, dest)) for fmt, dest, _ in SIDE_REPORTS
                                                  if getattr(args, dest)]
    outputs = run_outputs(args, reports)
    check_outputs(outputs, [args.model, args.policy, args.config, args.baseline])  # before loading: fail at once
    flags = GateArgs.parse(args)
    gate = RunGate(flags.select, flags.ignore, load_baseline(flags.baseline) if flags.baseline else None,
                   flags.baseline, preview=flags.preview, write_baseline_to=baseline_target(args),
                   prune=flags.prune_baseline)
    request = RunRequest(args.model, args.policy, config=args.config, dump=args.dump, profile=args.profile,
                         warmup=args.warmup, iterations=args.iterations, compare_default=args.compare_default,
                         allow_cpu=args.allow_cpu, allow_custom_ops=args.allow_custom_ops, timeout_s=args.timeout,
                         fail_on=flags.fail_on)

    def emit(outcome) -> int:
        return _emit(args, reports, outcome)

    with RunProgress(enabled=sys.stderr is not None and sys.stderr.isatty()) as progress:
        outcome = run_reference(request, progress=progress, hard_exit=True, gate=gate, emit=emit,
                                before_writing=lambda inputs: check_outputs(outputs,
                                                                            [*run_reads(inputs), args.baseline]))
    return emit(outcome)


def _emit(args: argparse.Namespace, reports: list[tuple[str, str | None]], outcome) -> int:
    """Write the baseline (if asked) and every report; the exit code."""
    from ortgate.report.run import render_run

    result = outcome.result  # judged once, against the baseline it writes when it writes one
    if outcome.baseline_text is not None:
        write_baseline(args, outcome.baseline_text)
    for fmt, path in reports:
        write(render_run(fmt, result, outcome.evidence, **terminal_options(path), expand=args.expand), path)
    if args.write_calibration:
        _write_calibration(args, outcome)
    if args.exit_zero:
        return EXIT_PASS
    return result.verdict.exit_code


def _write_calibration(args: argparse.Namespace, outcome) -> None:
    from ortgate.engine.throughput import calibration_yaml

    if outcome.estimate is None or outcome.evidence.measurement is None:
        why = (outcome.evidence.estimate or {}).get("note") or outcome.evidence.skipped or "nothing was measured"
        raise InputError(f"--write-calibration: no calibration written: {why}", args.write_calibration)
    write(calibration_yaml(outcome.estimate, outcome.evidence, args.policy), args.write_calibration)


def run_outputs(args: argparse.Namespace, reports: list[tuple[str, str | None]]) -> list[Output]:
    names = {fmt: what for fmt, _, what in SIDE_REPORTS}
    outputs = [Output(path, "report" if i == 0 else names[fmt]) for i, (fmt, path) in enumerate(reports)
               if path is not None]
    if args.write_calibration:
        outputs.append(Output(args.write_calibration, "calibration file"))
    outputs += baseline_outputs(args)
    if args.dump:
        # ORT writes a large model's initializers beside the dump, as DUMP.data (runner.session).
        outputs += [Output(args.dump, "optimized dump"), Output(args.dump + ".data", "optimized dump's weights")]
    if isinstance(args.profile, str):
        outputs.append(Output(args.profile, "profile trace"))
    return outputs


def run_reads(inputs) -> list:
    """The files `ortgate run` reads: the lint inputs, which hold the custom-op libraries the policy names
    (ortgate.config.reads)."""
    return list(inputs.files_read)
