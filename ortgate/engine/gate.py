"""The gate: the one place that decides. Rule selection, severity overrides, waivers, baselines, verdict."""

from __future__ import annotations

import datetime as _dt
import fnmatch
from collections import Counter
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from ortgate.config.policy import Policy, Waiver
from ortgate.engine.baseline import (
    BASELINE_VERSION,
    GATE_FAMILY,
    LEGACY_VERSION,
    V2_VERSION,
    V3_VERSION,
    Baseline,
    baseline_from_text,
    baseline_text,
    baselineable,
    pruned_text,
)
from ortgate.errors import InputError
from ortgate.findings import Finding, Location, Severity
from ortgate.rules import Rule, all_rules, find_rule, match_rules, resolve_rule, suggest_rule

OFF = "off"


@dataclass(frozen=True)
class RuleSelector:
    """A rule reference the user wrote, with where they wrote it (for the error when it names nothing)."""

    text: str
    source: str  # "--select", "--ignore", or "policy.yaml:12"


@dataclass(frozen=True)
class GateConfig:
    """What the gate applies: the rules selected and ignored, severities, the failing level, waivers, baseline.
    A value: a command that judges against another baseline makes another config (dataclasses.replace)."""

    select: tuple[RuleSelector, ...] = ()
    ignore: tuple[RuleSelector, ...] = ()
    severity: Mapping[str, tuple[str, str]] = field(default_factory=dict)  # rule ref -> (level, source)
    fail_on: Severity = Severity.ERROR
    waivers: tuple[Waiver, ...] = ()
    baseline: Baseline | None = None  # findings already accepted
    baseline_path: str | None = None
    today: _dt.date = field(default_factory=_dt.date.today)
    preview: bool = False  # rules in preview run too (`--preview`, or the policy's `rules: {preview: true}`)


class Gated(NamedTuple):
    """The gate's findings (suppressions and severities applied) and the baseline entries they matched."""

    findings: list[Finding]
    matched: frozenset[int]  # indexes into the baseline's entries


@dataclass
class Verdict:
    """The gate's decision: pass or fail, the counts per severity, and what was suppressed by what."""

    passed: bool
    fail_on: Severity
    counts: dict[str, int]  # active findings per severity label
    suppressed: int
    suppressed_by: dict[str, int] = field(default_factory=dict)  # "waiver" / "baseline" -> findings

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1


def gate_config_from(policy: Policy | None, *, cli_select: list[str] | None, cli_ignore: list[str] | None,
                     fail_on: str | None, baseline: Baseline | None = None, baseline_path: str | None = None,
                     today: _dt.date | None = None, preview: bool = False) -> GateConfig:
    """The gate's configuration from the policy's `rules:` and `waivers:` and the command line. A reference that
    names no rule is an InputError (the first one; `reference_errors` lists them all)."""
    config = unchecked_gate_config(policy, cli_select=cli_select, cli_ignore=cli_ignore, fail_on=fail_on,
                                   baseline=baseline, baseline_path=baseline_path, today=today, preview=preview)
    errors = reference_errors(config, policy)
    if errors:
        raise errors[0]
    return config


def unchecked_gate_config(policy: Policy | None, *, cli_select: list[str] | None, cli_ignore: list[str] | None,
                          fail_on: str | None, baseline: Baseline | None = None, baseline_path: str | None = None,
                          today: _dt.date | None = None, preview: bool = False) -> GateConfig:
    rules_block = (policy.get("rules") if policy else None) or {}

    def policy_source(*key: str | int) -> str:
        loc = policy.where("rules", *key)  # type: ignore[union-attr]
        return f"{loc.file}:{loc.line}" if loc.line else loc.file

    select: list[RuleSelector] = []
    if cli_select:
        select = [RuleSelector(s, "--select") for s in cli_select]
    elif rules_block.get("select"):
        select = [RuleSelector(s, policy_source("select", i)) for i, s in enumerate(rules_block["select"])]
    ignore = [RuleSelector(s, policy_source("ignore", i)) for i, s in enumerate(rules_block.get("ignore") or [])]
    ignore += [RuleSelector(s, "--ignore") for s in (cli_ignore or [])]
    severity = {ref: (level, policy_source("severity", ref))
                for ref, level in (rules_block.get("severity") or {}).items()}
    level = fail_on or rules_block.get("fail_on") or "error"
    return GateConfig(select=tuple(select), ignore=tuple(ignore), severity=severity, fail_on=Severity.parse(level),
                      waivers=tuple(policy.waivers) if policy is not None else (), baseline=baseline,
                      baseline_path=baseline_path, today=today or _dt.date.today(),
                      preview=preview or rules_block.get("preview") is True)


def reference_errors(config: GateConfig, policy: Policy | None) -> list[InputError]:
    """Every rule reference (waivers, select, ignore, severity) that names no rule: a typo in an ignore list would
    otherwise silently do nothing."""
    errors: list[InputError] = []
    for i, waiver in enumerate(config.waivers):
        if not resolve_rule(waiver.rule):
            hint = suggest_rule(waiver.rule)
            loc = policy.where("waivers", i, "rule") if policy is not None else Location("")
            errors.append(InputError(f"waivers[{i}].rule: unknown rule {waiver.rule!r}"
                                     + (f"; did you mean {hint!r}?" if hint else "; `ortgate rules` lists them"),
                                     loc.file, line=loc.line))
    selectors = [*config.select, *config.ignore,
                 *(RuleSelector(ref, source) for ref, (_l, source) in config.severity.items())]
    for selector in selectors:
        try:
            _resolve(selector)
        except InputError as exc:
            errors.append(exc)
    return errors


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
    """The rules to run: selected (all, or `select`), not ignored nor turned off; a rule in preview only with
    `config.preview` or when selected by its own code or name (a prefix such as OGF does not opt in)."""
    chosen = all_rules()
    named: set[str] = set()
    if config.select:
        wanted = {r.code for s in config.select for r in _resolve(s)}
        chosen = [r for r in chosen if r.code in wanted]
        named = {r.code for s in config.select if (r := find_rule(s.text)) is not None}
    ignored = {r.code for s in config.ignore for r in _resolve(s)}
    off = {r.code for ref, (level, source) in config.severity.items() if level == OFF
           for r in _resolve(RuleSelector(ref, source))}
    return [r for r in chosen if r.code not in ignored and r.code not in off
            and (not r.preview or config.preview or r.code in named)]


def apply_gate(findings: list[Finding], config: GateConfig) -> list[Finding]:
    """The gate's findings (see `gate`)."""
    return gate(findings, config).findings


def gate(findings: list[Finding], config: GateConfig) -> Gated:
    """Waivers (plus waiver-expired / waiver-unused), severity overrides, then the baseline, as suppressions; with
    the baseline entries the findings matched (what baseline-entry-stale and --prune-baseline read).

    A severity override re-levels a rule's violations only: a finding that says the rule could not decide, or that
    the rule failed, stays info whatever the policy makes of the rule.
    Suppressed findings stay in the result: reporters show them as suppressed, and only the verdict ignores them.
    """
    selected = {r.code for r in selected_rules(config)}
    out = _apply_waivers(findings, config, selected)
    overrides = severity_overrides(config)
    out = [f.with_severity(overrides[f.code]) if f.code in overrides and f.relevelable else f for f in out]
    matched: set[int] = set()
    if config.baseline is not None:
        where = Location(config.baseline_path) if config.baseline_path else None
        justification = f"in the baseline {config.baseline_path}" if config.baseline_path else "in the baseline"
        suppressed = []
        for f in out:
            hits = config.baseline.matches(f) if f.suppressed is None and baselineable(f) else []
            matched.update(hits)
            suppressed.append(f.suppress("baseline", justification, where) if hits else f)
        out = suppressed
    return Gated(sorted(out, key=Finding.sort_key), frozenset(matched))


def rebaseline(raw: list[Finding], config: GateConfig, files: list[str], target: str, *,
               prune: bool) -> tuple[str, GateConfig]:
    """What `--write-baseline TARGET` (every finding the gate lets through, waived ones aside) or `--prune-baseline`
    (config's baseline without its stale entries, TARGET being its own file) writes, from the rules' findings `raw`
    over the linted `files`; and the gate's configuration that judges them against it, so that a command that
    writes a baseline judges once."""
    gated = gate(raw, config)
    if prune:
        baseline = config.baseline
        if baseline is None:
            raise ValueError("--prune-baseline needs a baseline")
        ran = rules_that_ran(config, [e.rule for e in baseline.entries])
        text = pruned_text(baseline, gated.findings, files, ran, gated.matched)
    else:
        text = baseline_text(gated.findings)
    return text, replace(config, baseline=baseline_from_text(text, target), baseline_path=target)


def rules_that_ran(config: GateConfig, names: list[str | None]) -> list[str]:
    """Of these rule names (old names included), the ones whose rule ran."""
    selected = {r.code for r in selected_rules(config)}
    found = {name: find_rule(name) for name in dict.fromkeys(n for n in names if n)}
    return [name for name, r in found.items() if r is not None and r.code in selected]


def stale_baseline_findings(config: GateConfig, files: list[str], matched: AbstractSet[int]) -> list[Finding]:
    """baseline-entry-stale for each entry that matched no finding (`matched`: the entries `gate` found matched)
    although its file was linted and its rule ran."""
    baseline = config.baseline
    stale_rule = find_rule("baseline-entry-stale")
    if baseline is None or stale_rule is None or stale_rule.code not in {r.code for r in selected_rules(config)}:
        return []
    ran = rules_that_ran(config, [e.rule for e in baseline.entries])
    legacy = (f"; this baseline is version {LEGACY_VERSION}, which names findings by node name (a re-export that "
              f"renames nodes loses it): --prune-baseline rewrites it as version {BASELINE_VERSION}"
              ) if baseline.version == LEGACY_VERSION else ""
    out = []
    if V2_VERSION in baseline.older_schemes:
        out.append(Finding(
            code=stale_rule.code, rule=stale_rule.name, severity=stale_rule.severity,
            message=(f"this baseline's entries are version {V2_VERSION} fingerprints, which name a model by its file "
                     "name alone: an entry accepts the same finding in every model of that name (a/model.onnx and "
                     f"b/model.onnx alike); version {V3_VERSION} names it by its path relative to the working "
                     "directory"),
            location=Location(baseline.path or "", None, "version"),
            fix=f"Rewrite it as version {BASELINE_VERSION}: add --prune-baseline (with --baseline FILE), from the "
                "directory the gate runs in.",
            properties=(("baseline_version", V2_VERSION),)))
    if baseline.modelless:
        out.append(Finding(
            code=stale_rule.code, rule=stale_rule.name, severity=stale_rule.severity,
            message=(f"{baseline.modelless} entr{'y' if baseline.modelless == 1 else 'ies'} of this baseline "
                     f"(version {V3_VERSION}) name no model: an entry about a file several models share (the "
                     "policy's model.moe_layers, genai_config.json) accepts its finding in every model linted with "
                     f"that file; version {BASELINE_VERSION} names the model each entry was written for"),
            location=Location(baseline.path or "", None, "version"),
            fix=f"Rewrite it as version {BASELINE_VERSION}: add --prune-baseline (with --baseline FILE), linting the "
                "models it was written for.",
            properties=(("baseline_version", V3_VERSION),)))
    for i in baseline.stale(files, ran, matched):
        entry = baseline.entries[i]
        what = ", ".join(f"{k} {entry.data[k]}" for k in ("rule", "file", "layer", "node", "key_path")
                         if entry.data.get(k) is not None)
        out.append(Finding(
            code=stale_rule.code, rule=stale_rule.name, severity=stale_rule.severity,
            message=f"baseline entry ({what or entry.key}) matched no finding: what it accepted is gone{legacy}",
            location=Location(baseline.path or "", entry.line, f"findings[{i}]"),
            fix="Rewrite the baseline without its stale entries: add --prune-baseline (with --baseline FILE).",
            properties=(("fingerprint", entry.key),)))
    return out


def severity_overrides(config: GateConfig) -> dict[str, Severity]:
    """Rule code -> the severity the policy gives its violations. A reference by exact code or name wins over one
    that reaches the rule through a split-off redirect or a prefix, whatever their order in the policy."""
    overrides: dict[str, tuple[int, Severity]] = {}
    for ref, (level, source) in config.severity.items():
        if level == OFF:
            continue
        direct = find_rule(ref)
        for r in _resolve(RuleSelector(ref, source)):
            rank = 1 if direct is not None and direct.code == r.code else 0
            if r.code not in overrides or rank >= overrides[r.code][0]:
                overrides[r.code] = (rank, Severity.parse(level))
    return {code: level for code, (_rank, level) in overrides.items()}


def _apply_waivers(findings: list[Finding], config: GateConfig, selected: set[str]) -> list[Finding]:
    if not config.waivers:
        return list(findings)
    codes = [_waiver_codes(w) for w in config.waivers]
    active = [i for i, w in enumerate(config.waivers) if not _expired(w, config.today)]
    used = [False] * len(config.waivers)
    out: list[Finding] = []
    for f in findings:
        for i in active:
            if _waiver_matches(config.waivers[i], codes[i], f):
                used[i] = True
                w = config.waivers[i]
                f = f.suppress("waiver", w.reason, w.location)
                break
        out.append(f)
    expired_rule = find_rule("waiver-expired")
    unused_rule = find_rule("waiver-unused")
    for i, w in enumerate(config.waivers):
        what = f"waiver for {w.rule}{' on ' + w.node if w.node else ''}"
        if w.layers:
            what += f" in layers {', '.join(str(n) for n in sorted(w.layers)[:8])}{', ...' if len(w.layers) > 8 else ''}"
        if _expired(w, config.today):
            if expired_rule is not None and expired_rule.code in selected:
                out.append(_gate_finding(
                    expired_rule, w.location,
                    f"{what} expired on {w.expires.isoformat()}: the findings it covered count again",  # type: ignore[union-attr]
                    "Fix the findings, or renew the waiver with a new `expires` date and a reason.", w))
        elif not used[i] and codes[i] <= selected and unused_rule is not None and unused_rule.code in selected:
            # Only rules that ran can show that their waiver matched nothing (every code the reference covers).
            out.append(_gate_finding(
                unused_rule, w.location, f"{what} matched no finding",
                "Delete the waiver: what it excused is gone (or its rule/node pattern is wrong).", w))
    return out


def _expired(waiver: Waiver, today: _dt.date) -> bool:
    """A waiver applies through its `expires` date and stops the day after."""
    return waiver.expires is not None and waiver.expires < today


def _waiver_codes(waiver: Waiver) -> set[str]:
    return {r.code for r in resolve_rule(waiver.rule)}


def _waiver_matches(waiver: Waiver, codes: set[str], finding: Finding) -> bool:
    if finding.code not in codes or finding.code.startswith(GATE_FAMILY):
        return False
    if waiver.layers is not None and finding.layer not in waiver.layers:
        return False
    if waiver.node is None:
        return True
    targets = [t for t in (finding.node, finding.location.key_path) if t]
    return any(fnmatch.fnmatchcase(t, waiver.node) for t in targets)


def _gate_finding(rule: Rule, location: Location, message: str, fix: str, waiver: Waiver) -> Finding:
    props = (("waiver_node", waiver.node), ("waiver_rule", waiver.rule))
    return Finding(code=rule.code, rule=rule.name, severity=rule.severity, message=message,
                   location=location, fix=fix, properties=props)


def suppressed_breakdown(suppressed_by: dict[str, int]) -> str:
    """{"baseline": 2, "waiver": 1} -> "2 in the baseline, 1 waived"."""
    words = {"waiver": "waived", "baseline": "in the baseline"}
    return ", ".join(f"{n} {words.get(kind, kind)}" for kind, n in sorted(suppressed_by.items()))


def decide(findings: list[Finding], fail_on: Severity) -> Verdict:
    """Pass unless an unsuppressed finding is at least as severe as `fail_on` (the threshold is inclusive)."""
    active = [f for f in findings if f.suppressed is None]
    counts = Counter(f.severity.label for f in active)
    passed = not any(f.severity >= fail_on for f in active)
    suppressed = Counter(f.suppressed.kind for f in findings if f.suppressed is not None)
    return Verdict(passed, fail_on, {s.label: counts.get(s.label, 0) for s in sorted(Severity, reverse=True)},
                   sum(suppressed.values()), dict(sorted(suppressed.items())))
