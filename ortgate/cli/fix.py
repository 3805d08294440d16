"""`ortgate fix`: rewrite the findings ortgate can repair into a new model folder, proven equal on ORT CPU."""

from __future__ import annotations

import argparse

from ortgate.cli.output import (
    EXIT_FAIL,
    EXIT_PASS,
    Output,
    check_outputs,
    progress,
    progress_wanted,
    require_onnxruntime,
    split_list,
    terminate_cleanly,
    write,
)

FIX_FORMATS = ("text", "json")


def add_parser(sub) -> None:
    fix = sub.add_parser("fix", help="rewrite unfused MoE (and norms, rotary, attention) into fused ORT ops, "
                                     "verify on ORT CPU, write a new model folder")
    fix.add_argument("model", help="an .onnx file, or a folder holding model.onnx (and genai_config.json)")
    fix.add_argument("-o", "--output", required=True, metavar="OUT",
                     help="the new model folder (must not exist, and must not be or hold an input)")
    fix.add_argument("--select", metavar="RULES", help="comma-separated rules whose findings to repair "
                                                      "(moe-not-fused, rmsnorm-not-fused, skip-rmsnorm-not-fused, "
                                                      "rotary-not-fused, gqa-not-fused; default: all)")
    fix.add_argument("--ignore", metavar="RULES", help="comma-separated rules whose findings not to repair")
    fix.add_argument("--dry-run", action="store_true", help="report what would be rewritten; write nothing")
    fix.add_argument("--no-verify", action="store_true",
                     help="skip running original and fixed on ORT CPU (and the measurement)")
    fix.add_argument("--policy", help="deployment policy YAML: verification runs with its session options (on CPU), and its "
                                      "execution_provider (name, onnxruntime_version) is the deployment the model is "
                                      "written for (ORT releases with known MoE kernel bugs)")
    fix.add_argument("--format", choices=FIX_FORMATS, default="text", help="report format on stdout")
    fix.add_argument("--force", action="store_true", help="replace OUT if it exists")
    fix.add_argument("--context-length", type=int, metavar="N",
                     help="genai_config.json's context length (default: the policy's throughput.context_length)")
    fix.add_argument("--eos-token-id", metavar="IDS", help="genai_config.json's end-of-sequence token id(s), comma-separated")
    fix.add_argument("--bos-token-id", type=int, metavar="ID", help="genai_config.json's beginning-of-sequence token id")


def cmd_fix(args: argparse.Namespace) -> int:
    from ortgate.engine.fix import run_fix
    from ortgate.fix.genai_config import GenaiSettings
    from ortgate.fix.pipeline import FixRequest
    from ortgate.report.fix import render_fix_json, render_fix_text

    if not (args.no_verify or args.dry_run):
        require_onnxruntime("`ortgate fix` (it verifies the rewrite on ONNX Runtime; --no-verify skips that)")
    target = None
    provider = None
    dims: dict = {}
    setup = None
    policy_files: tuple = ()
    if args.policy:
        from ortgate.config.deployment import resolve_release, setup_from_policy
        from ortgate.config.policy import load_policy
        from ortgate.config.reads import policy_reads
        from ortgate.runner.settings import runner_settings

        policy = load_policy(args.policy)
        release = resolve_release(policy)  # a value that is not a release, or one too old, is bad input
        target = release.version if release.pinned else None  # none pinned: written for any release
        setup = setup_from_policy(policy)
        provider = setup.provider_name
        dims = dict(runner_settings(policy).dims)  # runner.dims: values for symbolic dims the graph cannot name
        policy_files = tuple(policy_reads(policy))  # the policy, its bases, its calibration: OUT may neither be nor hold one
        context = policy.get("throughput", "context_length")
        if args.context_length is None and isinstance(context, int):
            args.context_length = context
    genai = GenaiSettings(args.context_length, _token_ids(args.eos_token_id), args.bos_token_id)
    request = FixRequest(args.model, args.output, select=split_list(args.select), ignore=split_list(args.ignore),
                         dry_run=args.dry_run, verify=not args.no_verify, force=args.force, target_ort=target,
                         target_provider=provider, runner_dims=dims,
                         policy=args.policy, session_setup=setup, policy_files=tuple(policy_files),
                         genai=genai, check_output=lambda reads: check_outputs([Output(args.output, "fixed model", folder=True)],
                                                                  reads))
    with terminate_cleanly(), progress(progress_wanted()) as note:
        outcome = run_fix(request, note=note)
    write(render_fix_json(outcome) if args.format == "json" else render_fix_text(outcome), None)
    return EXIT_FAIL if outcome.exit_code else EXIT_PASS


def _token_ids(text: str | None) -> list[int]:
    if not text:
        return []
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        from ortgate.errors import InputError

        raise InputError(f"--eos-token-id: {text!r} is not a comma-separated list of token ids") from None

