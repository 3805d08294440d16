"""`ortgate policy validate`: every check `ortgate lint` runs on a policy, on the policy alone, all problems at once.

What lint would refuse (exit 2): the YAML, the schema (each file of the `extends` chain, then the merged policy),
the chain itself, waiver reasons and dates, rule references in `rules:` and `waivers:`, the execution provider's
name. What lint would report about the policy whatever the model: the rules that judge the declared session alone
(provider option catalogs, option values, session config keys, free-dimension ranges), expired and unused waivers,
and a model family ortgate does not know. The rules run exactly as in lint, through the same gate (the policy's own
`rules:` severities and ignores, its waivers).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass, field
from pathlib import Path

from ortgate.config.deployment import build_deployment
from ortgate.config.policy import Policy, check_policy_file
from ortgate.config.throughput import throughput_policy
from ortgate.engine.gate import RuleSelector, apply_gate, reference_errors, selected_rules, unchecked_gate_config
from ortgate.engine.pipeline import run_rules
from ortgate.errors import InputError
from ortgate.findings import Finding, Severity
from ortgate.knowledge.families import family_names, model_family
from ortgate.rules import all_rules
from ortgate.rules.context import PolicyInputs


@dataclass(frozen=True)
class PolicyProblem:
    file: str
    line: int | None
    severity: str  # "error" | "warning" | "info"
    message: str
    rule: str | None = None  # "OGP002 unknown-provider-option" for a rule's finding; None for what lint refuses
    refused: bool = False  # lint would stop here (exit 2)


@dataclass
class PolicyCheck:
    path: str
    policy: Policy | None
    problems: list[PolicyProblem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """2 when lint would refuse the policy, 1 when it would report an error about it, else 0."""
        if any(p.refused for p in self.problems):
            return 2
        return 1 if any(p.severity == "error" for p in self.problems) else 0


def check_policy(path: str | Path, *, today: _dt.date | None = None) -> PolicyCheck:
    policy, errors = check_policy_file(path)
    check = PolicyCheck(str(path), policy if not errors else None, [_refused(e) for e in errors])
    if policy is None:
        return check
    problems: list[PolicyProblem] = []
    try:
        config = unchecked_gate_config(policy, cli_select=None, cli_ignore=None, fail_on=None, today=today)
        problems += [_refused(e) for e in reference_errors(config, policy)]
    except (TypeError, ValueError, KeyError, AttributeError):
        config = None  # a malformed rules: or waivers: block, which the schema problems above describe
    if not errors and config is not None:
        try:
            deployment = build_deployment(policy, None)
        except InputError as exc:
            problems.append(_refused(exc))
            deployment = None
        try:
            tp = throughput_policy(policy)  # a catalog device, a device for every target, a calibration that reads
        except InputError as exc:
            problems.append(_refused(exc))
        else:
            problems += _unmeasured_device(tp)
        problems += _family_problems(policy)
        if deployment is not None and not any(p.refused for p in problems):
            problems += [_from_finding(f) for f in _rule_findings(policy, deployment, config)]
    check.problems += problems
    check.problems.sort(key=lambda p: (_file_order(policy, p.file), p.line or 0))
    return check


def _rule_findings(policy: Policy, deployment, config) -> list[Finding]:
    rules = {r.code for r in selected_rules(config)}  # the policy's own rules: select / ignore / severity off
    # The rules that judge a policy's declared session without reading a model (`policy_only=True` on `@rule`).
    codes = [r.code for r in all_rules() if r.policy_only and r.code in rules]
    # Only these ran: waiver-unused must not call a waiver of another rule unused.
    config = dataclasses.replace(config, select=tuple(RuleSelector(code, "policy validate") for code in codes))
    inputs = PolicyInputs(policy, deployment, files_read=tuple(policy.chain))
    findings = apply_gate(run_rules(inputs, selected_rules(config)), config)
    return [f for f in findings if f.suppressed is None]


def _unmeasured_device(tp) -> list[PolicyProblem]:
    """What lint says of a `cpu` device without a calibration, in every environment: nothing is estimated."""
    from ortgate.engine.throughput import UNMEASURED_CPU, needs_figures

    device = tp.device_with_figures() if tp is not None else None
    if device is None or not needs_figures(device):
        return []
    loc = tp.device_location or tp.block_location
    judged = "lint judges no throughput target and prices no finding" if tp.static_targets else (
        "lint prices no finding")
    return [PolicyProblem(loc.file, loc.line, Severity.INFO.label, f"throughput.device {device.name}: {judged}: "
                          f"{UNMEASURED_CPU}", "OGT003 throughput-not-judged")]


def _family_problems(policy: Policy) -> list[PolicyProblem]:
    name = policy.get("model", "family")
    if name is None or model_family(name) is not None:
        return []
    loc = policy.where("model", "family")
    return [PolicyProblem(loc.file, loc.line, Severity.WARNING.label,
                          f"model.family: {name!r} is not a model family ortgate knows (known: "
                          f"{', '.join(family_names())}): its routing, activation and epsilon defaults are not checked; "
                          "set model.norm_topk_prob, model.activation and model.rms_norm_eps, or use a known family")]


def _refused(error: InputError) -> PolicyProblem:
    return PolicyProblem(error.path or "", error.line, Severity.ERROR.label, error.problem, refused=True)


def _from_finding(f: Finding) -> PolicyProblem:
    key = f"{f.location.key_path}: " if f.location.key_path and not f.message.startswith(f.location.key_path) else ""
    return PolicyProblem(f.location.file, f.location.line, f.severity.label, f"{key}{f.message}", f"{f.code} {f.rule}")


def _file_order(policy: Policy, file: str) -> int:
    names = [str(p) for p in policy.chain]
    return names.index(file) if file in names else len(names)
