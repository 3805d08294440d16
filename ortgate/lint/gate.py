"""The gate: the one place that decides. Rule selection, severity overrides, waivers, baselines, verdict."""

from __future__ import annotations

import datetime as _dt
import fnmatch
from collections import Counter
from dataclasses import dataclass, field

from ortgate.errors import InputError
from ortgate.lint.findings import Finding, Location, Severity
from ortgate.policies.loader import Policy, Waiver
from ortgate.rules import Rule, all_rules, find_rule, match_rules, suggest_rule

OFF = "off"


@dataclass(frozen=True)
class RuleSelector:
    """A rule reference the user wrote, with where they wrote it (for the error when it names nothing)."""

    text: str
    source: str  # "--select", "--ignore", or "policy.yaml:12"


@dataclass
class GateConfig:
    select: list[RuleSelector] = field(default_factory=list)
    ignore: list[RuleSelector] = field(default_factory=list)
    severity: dict[str, tuple[str, str]] = field(default_factory=dict)  # rule ref -> (level, source)
    fail_on: Severity = Severity.ERROR
    waivers: list[Waiver] = field(default_factory=list)
    baseline: set[str] | None = None  # finding identities already accepted
    today: _dt.date = field(default_factory=_dt.date.today)


@dataclass
class Verdict:
    passed: bool
    fail_on: Severity
    counts: dict[str, int]  # active findings per severity label
    suppressed: int

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def gate_config_from(policy: Policy | None, *, cli_select: list[str] | None, cli_ignore: list[str] | None,
                     fail_on: str | None, baseline: set[str] | None = None,
                     today: _dt.date | None = None) -> GateConfig:
    config = GateConfig(baseline=baseline, today=today or _dt.date.today())
    rules_block = (policy.get("rules") if policy else None) or {}

    def policy_source(*key: str | int) -> str:
        loc = policy.where("rules", *key)  # type: ignore[union-attr]
        return f"{loc.file}:{loc.line}" if loc.line else loc.file

    if cli_select:
        config.select = [RuleSelector(s, "--select") for s in cli_select]
    elif rules_block.get("select"):
        config.select = [RuleSelector(s, policy_source("select", i)) for i, s in enumerate(rules_block["select"])]
    config.ignore = [RuleSelector(s, policy_source("ignore", i)) for i, s in enumerate(rules_block.get("ignore") or [])]
    config.ignore += [RuleSelector(s, "--ignore") for s in (cli_ignore or [])]
    for ref, level in (rules_block.get("severity") or {}).items():
        config.severity[ref] = (level, policy_source("severity", ref))
    level = fail_on or rules_block.get("fail_on") or "error"
    config.fail_on = Severity.parse(level)
    if policy is not None:
        config.waivers = policy.waivers
    # Every reference must name a rule: a typo in an ignore list would otherwise silently do nothing.
    for selector in config.select + config.ignore:
        _resolve(selector)
    for ref, (_level, source) in config.severity.items():
        _resolve(RuleSelector(ref, source))
    return config


def _resolve(selector: RuleSelector) -> list[Rule]:
    rules = match_rules(selector.text)
    if not rules:
        hint = suggest_rule(selector.text)
        suggestion = f"; did you mean {hint!r}?" if hint else "; `ortgate rules` lists them"
        file, _, line = selector.source.rpartition(":") if selector.source[0] != "-" else ("", "", "")
        if file and line.isdigit():
            raise InputError(f"unknown rule {selector.text!r}{suggestion}", file, line=int(line))
        raise InputError(f"{selector.source}: unknown rule {selector.text!r}{suggestion}")
    return rules


def selected_rules(config: GateConfig) -> list[Rule]:
    chosen = all_rules()
    if config.select:
        wanted = {r.code for s in config.select for r in _resolve(s)}
        chosen = [r for r in chosen if r.code in wanted]
    ignored = {r.code for s in config.ignore for r in _resolve(s)}
    off = {r.code for ref, (level, source) in config.severity.items() if level == OFF
           for r in _resolve(RuleSelector(ref, source))}
    return [r for r in chosen if r.code not in ignored and r.code not in off]


def apply_gate(findings: list[Finding], config: GateConfig) -> list[Finding]:
    """Severity overrides, then waivers and baseline as suppressions, plus waiver-expired / waiver-unused."""
    overrides: dict[str, Severity] = {}
    for ref, (level, source) in config.severity.items():
        if level != OFF:
            for r in _resolve(RuleSelector(ref, source)):
                overrides[r.code] = Severity.parse(level)
    out = [f.with_severity(overrides[f.code]) if f.code in overrides else f for f in findings]
    out = _apply_waivers(out, config)
    if config.baseline is not None:
        out = [f.suppress("baseline", "present in the baseline") if f.suppressed is None and f.identity() in config.baseline
               else f for f in out]
    return sorted(out, key=Finding.sort_key)


def _apply_waivers(findings: list[Finding], config: GateConfig) -> list[Finding]:
    if not config.waivers:
        return findings
    expired_rule = find_rule("waiver-expired")
    unused_rule = find_rule("waiver-unused")
    out: list[Finding] = []
    used = [False] * len(config.waivers)
    active = [(i, w) for i, w in enumerate(config.waivers) if w.expires is None or w.expires >= config.today]
    for f in findings:
        for i, w in active:
            if _waiver_matches(w, f):
                used[i] = True
                f = f.suppress("waiver", w.reason)
                break
        out.append(f)
    for i, w in enumerate(config.waivers):
        if w.expires is not None and w.expires < config.today and expired_rule is not None:
            out.append(_gate_finding(expired_rule, w.location,
                                     f"waiver for {w.rule}{' on ' + w.node if w.node else ''} expired on "
                                     f"{w.expires.isoformat()}: the findings it covered count again",
                                     "Fix the findings, or renew the waiver with a new `expires` date and a reason."))
        elif not used[i] and unused_rule is not None:
            out.append(_gate_finding(unused_rule, w.location,
                                     f"waiver for {w.rule}{' on ' + w.node if w.node else ''} matched no finding",
                                     "Delete the waiver: what it excused is gone (or its rule/node pattern is wrong)."))
    return out


def _waiver_matches(waiver: Waiver, finding: Finding) -> bool:
    if waiver.rule not in (finding.rule, finding.code):
        return False
    if waiver.node is None:
        return True
    target = finding.node or finding.location.key_path or ""
    return fnmatch.fnmatchcase(target, waiver.node)


def _gate_finding(rule: Rule, location: Location, message: str, fix: str) -> Finding:
    return Finding(code=rule.code, rule=rule.name, severity=rule.severity, message=message,
                   location=location, fix=fix)


def decide(findings: list[Finding], fail_on: Severity) -> Verdict:
    active = [f for f in findings if f.suppressed is None]
    counts = Counter(f.severity.label for f in active)
    passed = not any(f.severity >= fail_on for f in active)
    return Verdict(passed, fail_on, {s.label: counts.get(s.label, 0) for s in sorted(Severity, reverse=True)},
                   sum(1 for f in findings if f.suppressed is not None))
