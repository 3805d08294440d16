"""Each finding's price: what fixing it would save on one decode step of the policy's device, from the cost
model's repairs (an estimate, never a measurement). Each rule names the repair kind that prices it (`price=` on
`@rule`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from ortgate.cost import Estimate, Repair
from ortgate.cost.estimate import format_rate
from ortgate.findings import Finding, Price
from ortgate.rules import Rule
from ortgate.rules.context import LintInputs


@cache
def priced_rules() -> dict[str, Rule]:
    """Rule code -> the rule, for the rules whose findings are priced (`price` on their `@rule`)."""
    from ortgate.rules import all_rules

    return {r.code: r for r in all_rules() if r.price is not None}


def repairs_for(est: Estimate, finding: Finding) -> list[Repair]:
    """The repairs fixing `finding` applies: those of its layer, those outside the layers for a node outside them,
    all of its kind for a finding about the whole graph (a count, a setting) or about every node of its kind
    (`price_all`)."""
    rule = priced_rules().get(finding.code)
    if rule is None or rule.price is None:
        return []
    kind = rule.price
    if rule.price_all:
        return est.repairs_of(kind)
    if finding.layer is not None:
        return est.repairs_of(kind, finding.layer)
    if finding.node is not None:
        return est.repairs_of(kind, None)
    return est.repairs_of(kind)


def _claimed(est: Estimate, findings: list[Finding]) -> set[int]:
    """The repairs a finding about a layer or a node applies (ids): the root causes those findings price."""
    return {id(r) for f in findings if f.layer is not None or f.node is not None for r in repairs_for(est, f)}


def priced_repairs(est: Estimate, finding: Finding, claimed: set[int]) -> list[Repair]:
    """The repairs `finding` is priced with: a finding about the whole graph (a layer count that restates the
    per-layer findings) keeps only the repairs no finding about a layer or a node prices, so that each root
    cause is priced once."""
    repairs = repairs_for(est, finding)
    if finding.layer is None and finding.node is None:
        repairs = [r for r in repairs if id(r) not in claimed]
    return repairs


def price_findings(findings: list[Finding], inputs: LintInputs) -> list[Finding]:
    est = inputs.estimate
    if est is None:
        return findings
    device = est.device.name
    claimed = _claimed(est, findings)
    out = []
    for f in findings:
        repairs = priced_repairs(est, f, claimed)
        if repairs:
            saving = est.saving(repairs)
            f = replace(f, price=Price(saving.ms_per_token, saving.share, device))
        out.append(f)
    return out


@dataclass(frozen=True)
class StepFigures:
    """A decode step as the reports show it: tokens/s expected and at the ceiling, and the expected step time."""

    tokens_per_s_expected: float | None
    tokens_per_s_ceiling: float | None
    ms_per_step_expected: float

    def to_dict(self) -> dict[str, Any]:
        return {"tokens_per_s_expected": self.tokens_per_s_expected, "tokens_per_s_ceiling": self.tokens_per_s_ceiling,
                "ms_per_step_expected": self.ms_per_step_expected}


@dataclass(frozen=True)
class RuleSaving:
    """What fixing every finding of one rule saves per token (the cost model's joint saving of its repairs)."""

    rule: str
    ms_per_token: float
    share_of_step: float

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "ms_per_token": self.ms_per_token, "share_of_step": self.share_of_step}


@dataclass(frozen=True)
class EstimateHeadline:
    """The estimate's headline for the reports (the JSON report's `inputs.estimate`): device, step, tokens/s as
    exported and with fixes, and what fixing all of each rule's findings would save."""

    device: str
    figures: str  # where the device's figures come from ("catalog", "calibrated: FILE:LINE", ...)
    batch_size: int
    new_tokens: int
    context_length: int
    as_exported: StepFigures
    with_fixes: StepFigures
    by_rule: Mapping[str, RuleSaving]  # rule code -> its saving
    not_counted: int  # what the estimate left out (Estimate.uncounted)

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": True, "device": self.device, "figures": self.figures, "batch_size": self.batch_size,
                "new_tokens": self.new_tokens, "context_length": self.context_length,
                "as_exported": self.as_exported.to_dict(), "with_fixes": self.with_fixes.to_dict(),
                "by_rule": {code: s.to_dict() for code, s in self.by_rule.items()}, "not_counted": self.not_counted}


def estimate_summary(inputs: LintInputs, findings: list[Finding]) -> EstimateHeadline | None:
    """The estimate's headline for the reports: device, step, tokens/s as exported and with fixes, and what
    fixing all of each rule's findings would save."""
    est = inputs.estimate
    if est is None:
        return None
    by_rule: dict[str, list[Repair]] = defaultdict(list)
    taken: dict[str, set[int]] = defaultdict(set)  # ids of the repairs in by_rule[code] (each counted once)
    names: dict[str, str] = {}
    claimed = _claimed(est, findings)
    for f in findings:
        repairs = priced_repairs(est, f, claimed)
        if repairs:
            ids = taken[f.code]
            for r in repairs:
                if id(r) not in ids:
                    ids.add(id(r))
                    by_rule[f.code].append(r)
            names[f.code] = f.rule
    savings = {}
    for code, repairs in sorted(by_rule.items()):
        s = est.saving(repairs)
        savings[code] = RuleSaving(names[code], round(s.ms_per_token, 4), round(s.share, 4))
    a, w = est.as_exported, est.with_fixes
    setup = est.setup
    return EstimateHeadline(
        device=est.device.name,
        figures=_figure_origin(est),
        batch_size=setup.shape.batch,
        new_tokens=setup.shape.new_tokens,
        context_length=setup.shape.context,
        as_exported=StepFigures(_r(a.tokens_per_s_expected), _r(a.tokens_per_s_ceiling), round(a.expected_s * 1e3, 4)),
        with_fixes=StepFigures(_r(w.tokens_per_s_expected), _r(w.tokens_per_s_ceiling), round(w.expected_s * 1e3, 4)),
        by_rule=savings,
        not_counted=len(est.uncounted),
    )


def _figure_origin(est: Estimate) -> str:
    figure = est.device.bandwidth_gb_s
    if figure.confidence == "calibrated":
        return figure.source
    if figure.confidence == "probe":
        return f"probe {figure.value:g} GB/s"
    return "catalog"


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def headline(summary: EstimateHeadline, *, compact: bool = False) -> str:
    """'h100-sxm (catalog), batch 1, context 4,096: 3.44 tokens/s as exported -> 137 with fixes (ceiling ...), an
    estimate'; compact, for a line that already says it is the estimate: '...: 3.44 -> 137 tokens/s with fixes
    (ceiling ...)'."""
    a, w = summary.as_exported, summary.with_fixes
    step = f"{summary.device} ({summary.figures}), batch {summary.batch_size}, context {summary.context_length:,}"
    expected = format_rate(a.tokens_per_s_expected), format_rate(w.tokens_per_s_expected)
    ceiling = f"(ceiling {format_rate(a.tokens_per_s_ceiling)} -> {format_rate(w.tokens_per_s_ceiling)})"
    if compact:
        return f"{step}: {expected[0]} -> {expected[1]} tokens/s with fixes {ceiling}"
    return f"{step}: {expected[0]} tokens/s as exported -> {expected[1]} with fixes {ceiling}, an estimate"
