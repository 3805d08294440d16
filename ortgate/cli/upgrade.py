"""`ortgate upgrade`: what changes for this model and policy between two ONNX Runtime releases.

The same lint, once judged on the deployment's release (`--from`, else the policy's
`execution_provider.onnxruntime_version`, else the release ortgate assumes) and once on `--to`: the findings that
appear and disappear (ops and attributes the release defines, what its providers refuse, config keys it reads or
refuses, defects fixed), the config keys the newer release adds, and the decode estimate on both when the policy
names a device. The exit code is the `--to` lint's verdict, so a CI job can gate an upgrade.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ortgate.cli.args import GenaiConfigArgs
from ortgate.cli.output import Output, check_outputs, write
from ortgate.errors import InputError

if TYPE_CHECKING:
    from ortgate.engine.pipeline import LintResult
    from ortgate.findings import Finding
    from ortgate.rules.context import LintInputs


def add_parser(sub) -> None:
    p = sub.add_parser("upgrade", help="what changes for a model and policy between two ONNX Runtime releases")
    p.add_argument("model", help="an .onnx file, or a folder holding model.onnx (and genai_config.json)")
    p.add_argument("--policy", help="deployment policy YAML")
    GenaiConfigArgs.add_to(p)
    p.add_argument("--optimized", metavar="DUMP", help="ORT's optimized model dump (optimized_model_filepath)")
    p.add_argument("--to", required=True, metavar="RELEASE", help="the ONNX Runtime release to judge the deployment on")
    p.add_argument("--from", dest="from_", metavar="RELEASE",
                   help="the release it runs now (default: the policy's execution_provider.onnxruntime_version, "
                        "else the release ortgate assumes)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--output", metavar="FILE", help="write the comparison to FILE instead of stdout")


def _judge(args: argparse.Namespace, version: str | None, flag: str) -> tuple[LintInputs, LintResult]:
    from ortgate.engine.gate import gate_config_from
    from ortgate.engine.pipeline import LintRequest, lint, load_inputs

    try:
        inputs = load_inputs(LintRequest(args.model, args.policy, args.optimized, args.config, ort_version=version))
    except InputError as exc:
        if exc.path is None and exc.problem.startswith("--ort-version:"):
            raise InputError(flag + exc.problem[len("--ort-version"):]) from None
        raise
    config = gate_config_from(inputs.policy, cli_select=None, cli_ignore=None, fail_on=None)
    return inputs, lint(inputs, config)


def _entry(f: Finding) -> dict:
    return {"code": f.code, "rule": f.rule, "severity": f.severity.label, "message": f.message,
            "where": f.location.key_path or f.node or f.location.file}


def compare(args: argparse.Namespace) -> tuple[dict, int]:
    from ortgate.knowledge.deployment_facts import _FACTS, at_least

    before_inputs, before = _judge(args, args.from_, "--from")
    after_inputs, after = _judge(args, args.to, "--to")
    old, new = before_inputs.deployment.ort, after_inputs.deployment.ort
    active_before = {f.identity(): f for f in before.findings if f.suppressed is None}
    active_after = {f.identity(): f for f in after.findings if f.suppressed is None}
    appear = [f for key, f in active_after.items() if key not in active_before]
    vanish = [f for key, f in active_before.items() if key not in active_after]
    changed = [(active_before[k], f) for k, f in active_after.items()
               if k in active_before and active_before[k].severity is not f.severity]
    added_keys = [{"prefix": a.prefix, "since": a.since, "source": a.source} for a in _FACTS.session_keys_added
                  if at_least(a.since, _next(old.judged_as)) and at_least(new.judged_as, a.since)]
    estimate = {}
    for label, inputs in (("from", before_inputs), ("to", after_inputs)):
        est = inputs.estimate
        if est is not None:
            estimate[label] = {"ms_per_step": round(est.as_exported.expected_s * 1000, 4),
                               "device": est.device.name}
    report = {
        "from": {"onnxruntime": old.version, "judged_as": old.judged_as, "source": old.origin},
        "to": {"onnxruntime": new.version, "judged_as": new.judged_as, "source": new.origin},
        "appear": [_entry(f) for f in appear],
        "disappear": [_entry(f) for f in vanish],
        "severity_changed": [{**_entry(f), "was": b.severity.label} for b, f in changed],
        "config_keys_added": added_keys,
        "estimate": estimate,
        "verdict_from": _verdict(before), "verdict_to": _verdict(after),
    }
    return report, after.verdict.exit_code


def _verdict(result: LintResult) -> str:
    counts = result.verdict.counts
    summary = ", ".join(f"{counts.get(s, 0)} {s}{'s' if s != 'info' else ''}" for s in ("error", "warning", "info"))
    return f"{'PASS' if result.verdict.passed else 'FAIL'} ({summary})"


def _next(version: str) -> str:
    """The smallest release after `version` (1.31.1 -> 1.31.2): keys added in `version` itself are not new."""
    parts = [int(p) for p in version.split(".")[:3]] + [0, 0]
    return f"{parts[0]}.{parts[1]}.{parts[2] + 1}"


def text(report: dict) -> str:
    lines = [f"onnxruntime {report['from']['onnxruntime']} ({report['from']['source']})",
             f"  -> onnxruntime {report['to']['onnxruntime']} ({report['to']['source']})", ""]
    to, was = report["to"]["onnxruntime"], report["from"]["onnxruntime"]
    for title, key in ((f"findings new on {to}", "appear"), (f"findings gone on {to} (on {was})", "disappear")):
        entries = report[key]
        lines.append(f"{title}: {len(entries)}")
        lines += [f"  {e['severity']:<7} {e['code']} {e['rule']}  {e['where']}: {e['message']}" for e in entries]
    for e in report["severity_changed"]:
        lines.append(f"  {e['code']} {e['rule']}: {e['was']} -> {e['severity']}  {e['where']}")
    if report["config_keys_added"]:
        lines.append("config keys the newer release reads: "
                     + ", ".join(f"{k['prefix']}{'*' if k['prefix'].endswith('.') else ''}"
                                 for k in report["config_keys_added"]))
    est = report["estimate"]
    if est:
        lines.append("estimate: " + ", ".join(f"{label} {e['ms_per_step']} ms per decode step on {e['device']}"
                                              for label, e in est.items())
                     + " (of the kernel paths, only the CUDA QMoE GEMV fast path is priced per release)")
    lines.append(f"verdict: {report['verdict_from']} -> {report['verdict_to']}")
    return "\n".join(lines) + "\n"


def cmd_upgrade(args: argparse.Namespace) -> int:
    outputs = [Output(args.output, "comparison")] if args.output else []
    check_outputs(outputs, [args.model, args.policy, args.optimized, args.config])
    if args.from_ is not None and args.from_ == args.to:
        raise InputError(f"upgrade: --from and --to name the same release ({args.to})")
    report, code = compare(args)
    document = text(report) if args.format == "text" else json.dumps(report, indent=2, allow_nan=False) + "\n"
    write(document, args.output)
    return code
