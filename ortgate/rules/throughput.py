"""Throughput rules (OGT): the policy's `throughput:` targets against the decode cost model's estimate for its
device (`ortgate.cost`), judged from the graph alone. Every figure is an estimate for the named device."""

from __future__ import annotations

from dataclasses import dataclass

from ortgate.cost import Estimate
from ortgate.cost.estimate import format_bandwidth, format_bytes, format_ms, format_rate
from ortgate.evidence import EVIDENCE_KEY
from ortgate.findings import Severity
from ortgate.rules.base import rule
from ortgate.rules.context import RuleContext

CALIBRATE = ("Calibrate the device once with `ortgate run MODEL --policy P --write-calibration FILE` on it and name "
             "the file in `throughput.calibration`, so the estimate uses your measured efficiencies.")


@dataclass(frozen=True)
class TargetVerdict:
    key: str
    target: float
    budget_s: float  # the step time the target allows
    ceiling_s: float  # the floor of the graph as exported
    expected_s: float
    fixed_expected_s: float
    fixed_ceiling_s: float


def _verdicts(ctx: RuleContext) -> tuple[list[TargetVerdict], Estimate | None]:
    tp, est = ctx.inputs.throughput, ctx.inputs.estimate
    if tp is None or est is None:
        return [], est
    out = []
    tokens = est.setup.shape.tokens
    for key, target in tp.static_targets.items():
        budget = tokens / target if key == "min_tokens_per_s" else target / 1e3
        out.append(TargetVerdict(key, target, budget, est.as_exported.ceiling_s, est.as_exported.expected_s,
                                 est.with_fixes.expected_s, est.with_fixes.ceiling_s))
    return out, est


def _asked(v: TargetVerdict, est: Estimate) -> str:
    s = est.setup
    step = f"batch {s.shape.batch} x {s.shape.new_tokens} new token{'s' if s.shape.new_tokens != 1 else ''}"
    if v.key == "min_tokens_per_s":
        return (f"the policy asks for at least {v.target:g} tokens/s on {est.device.name} ({step}, context "
                f"{s.shape.context:,}: a step budget of {format_ms(v.budget_s * 1e3)})")
    return (f"the policy allows at most {v.target:g} ms per token on {est.device.name} ({step}, context "
            f"{s.shape.context:,})")


def _rate(est: Estimate, seconds: float) -> str:
    tokens = est.setup.shape.tokens
    return f"{format_rate(tokens / seconds if seconds > 0 else None)} tokens/s ({format_ms(seconds * 1e3)} per step)"


def _costs_and_fixes(est: Estimate) -> str:
    costs = "; ".join(f"({i}) {c.words}" for i, c in enumerate(est.largest_costs(3), 1))
    fixed = est.with_fixes
    return (f"Largest costs: {costs}. With every fix: {_rate(est, fixed.expected_s)} expected, ceiling "
            f"{format_rate(fixed.tokens_per_s_ceiling)} tokens/s")


def _properties(v: TargetVerdict, est: Estimate) -> dict:
    return {"target": v.key, "limit": v.target, "device": est.device.name, "estimate": True,
            "ms_per_step_budget": round(v.budget_s * 1e3, 4), "ms_per_step_ceiling": round(v.ceiling_s * 1e3, 4),
            "ms_per_step_expected": round(v.expected_s * 1e3, 4),
            "ms_per_step_expected_with_fixes": round(v.fixed_expected_s * 1e3, 4)}


@rule("OGT001", "throughput-below-policy", Severity.ERROR)
def throughput_below_policy(ctx: RuleContext):
    """The policy asks for more throughput than the graph as exported can ever reach on its device.

    ## What it checks
    `throughput.min_tokens_per_s` and `throughput.max_ms_per_token` against the hard ceiling of one decode step of
    the graph ORT will run, on `throughput.device` at the policy's `batch_size` and `context_length`: the bytes a
    step must read (weights actually used, the experts a step touches, the KV cache) at the device's peak
    bandwidth, or its FLOPs at peak throughput, with no overhead at all (`ortgate estimate` shows the figures).
    No real run beats that floor, so this fails only a graph that could never meet the target. The message gives
    the step budget, the three largest costs and what every fix would give. Estimates on a CPU runner are
    estimates for the named device, never measurements.

    ## Why it costs throughput
    A dense expert loop reads every expert's weights on every token: Qwen3-30B-A3B as a torch dense loop reads
    56.9 GiB per step where the fused graph reads 3.4 GiB, a ceiling of 53 tokens/s on an H100 SXM where the
    fused export's is over 500. No session setting recovers it; the pre-merge job is where to stop it.

    ## Bad
    ```yaml
    # the two-layer example model reads 387 KiB a step: its ceiling on an H100 SXM is 8.5 million tokens/s
    throughput: {device: h100-sxm, context_length: 1024, min_tokens_per_s: 1.0e+7}
    ```

    ```text
    At full size: Qwen3-30B-A3B exported as a torch dense expert loop reads 63.4 GiB a step at 4k context, a
    ceiling of 49 tokens/s on an H100 SXM; `min_tokens_per_s: 100` fails here, before any GPU is involved.
    ```

    ## Good
    ```yaml
    throughput: {device: h100-sxm, context_length: 1024, min_tokens_per_s: 2000}   # 4,164 expected
    ```

    ## Fix
    Fix the findings priced highest first (their price is in the report); re-export with fused MoE and attention
    (onnxruntime-genai's builder, or `ortgate fix`). If the target is wrong for the device, correct the policy.
    """
    verdicts, est = _verdicts(ctx)
    for v in verdicts:
        if v.budget_s >= v.ceiling_s:
            continue
        assert est is not None and ctx.inputs.throughput is not None
        step = est.as_exported
        yield ctx.finding(
            f"{_asked(v, est)}; as exported the graph cannot beat {_rate(est, v.ceiling_s)}, its ceiling "
            f"({format_bytes(step.totals.bytes)} per step at {format_bandwidth(step.step_bandwidth)}, no overhead). "
            f"{_costs_and_fixes(est)}",
            location=ctx.inputs.throughput.where(v.key),
            fix="Fix the highest-priced findings first (fused MoE and attention above all), or correct the target.",
            properties=_properties(v, est),
        )


@rule("OGT002", "throughput-below-estimate", Severity.WARNING)
def throughput_below_estimate(ctx: RuleContext):
    """The policy asks for more throughput than the decode cost model expects the graph to reach on its device.

    ## What it checks
    `throughput.min_tokens_per_s` and `throughput.max_ms_per_token` against the expected step time on
    `throughput.device`: each node's roofline time at the device's default (or calibrated) memory and compute
    efficiencies, plus kernel launches x per-kernel time (larger without CUDA graph) and host synchronisations x
    per-sync time. Reported when the target is above the estimate but below the hard ceiling (above the ceiling,
    `throughput-below-policy` fails instead). A warning: the efficiencies are the catalog's unless calibrated.

    ## Why it costs throughput
    Launch overhead and host synchronisations are what keep fine-grained MoE decode at 15-30% of its bandwidth
    ceiling: a graph can be within its byte budget and still miss the target by thousands of launches per step.

    ## Bad
    ```yaml
    # the example model: 4,164 tokens/s expected on an H100 SXM (48 launches of 5 us, CUDA graph off)
    throughput: {device: h100-sxm, context_length: 1024, min_tokens_per_s: 50000}
    ```

    ## Good
    ```yaml
    throughput: {device: h100-sxm, context_length: 1024, min_tokens_per_s: 2000}
    ```

    ## Fix
    Fix the priced findings (CUDA graph, fusions), or calibrate the device (`ortgate run --write-calibration`)
    so the estimate uses measured efficiencies instead of the catalog's defaults.
    """
    verdicts, est = _verdicts(ctx)
    for v in verdicts:
        if v.budget_s < v.ceiling_s or v.budget_s >= v.expected_s:
            continue
        assert est is not None and ctx.inputs.throughput is not None
        yield ctx.finding(
            f"{_asked(v, est)}; the estimate for the graph as exported is {_rate(est, v.expected_s)} "
            f"(ceiling {format_rate(est.as_exported.tokens_per_s_ceiling)} tokens/s). {_costs_and_fixes(est)}",
            location=ctx.inputs.throughput.where(v.key),
            fix="Fix the highest-priced findings first. " + CALIBRATE,
            properties=_properties(v, est),
        )


@rule("OGT003", "throughput-not-judged", Severity.INFO)
def throughput_not_judged(ctx: RuleContext):
    """A throughput target of the policy that `ortgate lint` cannot judge from the graph, and why.

    ## What it checks
    Every key of the `throughput:` block is judged or said not to be: latency percentiles
    (`max_p50_latency_ms`, `max_p90_latency_ms`, `max_p99_latency_ms`) and `min_speedup_vs_default` can only be
    measured (`ortgate run` on the device), a block without `device` names no device to estimate for, the `cpu`
    device without a calibration has no figures to estimate with (a lint never measures the machine it runs on,
    so that its report is the same on every run), and parts
    of the graph the cost model could not count (a symbolic head size, an unknown dtype) are listed, since the
    verdict on the other targets counts only what is known.

    ## Why it costs throughput
    A throughput block that a CI job skips without a word gives the same green check as one that passed.

    ## Bad
    ```yaml
    throughput: {device: h100-sxm, max_p99_latency_ms: 12}    # lint cannot measure a percentile
    ```

    ## Good
    ```yaml
    throughput: {device: h100-sxm, max_ms_per_token: 12}   # judged statically; percentiles left to `ortgate run`
    ```

    ## Fix
    Judge percentiles with `ortgate run` on the target device; give `throughput.device` for a static verdict; for
    `device: cpu`, name the calibration `ortgate run --write-calibration` writes in `throughput.calibration`.
    """
    tp = ctx.inputs.throughput
    if tp is None:
        return
    measured_here = EVIDENCE_KEY in ctx.inputs.evidence
    if not measured_here:
        for key in tp.measured_only:
            yield ctx.finding(
                f"throughput.{key} can only be measured: `ortgate run` judges it on "
                f"{'the device it is for (' + tp.device.label + ')' if tp.device is not None else 'the target device'}",
                location=tp.where(key), properties={"target": key},
            )
    gap = ctx.inputs.cost_gap
    if gap is not None and not measured_here and tp.device is not None:
        judged = ("the throughput targets and the findings' prices are not judged" if tp.static_targets
                  else "the findings are not priced")
        yield ctx.finding(f"throughput.device {tp.device.name}: {judged}: {gap}",
                          location=tp.device_location or tp.block_location, properties={"target": "device"})
    if tp.device is None and tp.targets:
        yield ctx.finding("throughput: no device is named, so nothing is estimated; `ortgate run` judges the targets "
                          "where its device matches throughput.match",
                          location=tp.where("match"), properties={"target": "device"})
    est = ctx.inputs.estimate
    if est is not None and tp.static_targets and est.uncounted:
        parts = "; ".join(f"{u.component}: {u.what}" for u in est.uncounted[:4])
        more = f" (and {len(est.uncounted) - 4} more)" if len(est.uncounted) > 4 else ""
        yield ctx.finding(
            f"the estimate for {est.device.name} leaves out what it could not count: {parts}{more}; the throughput "
            "targets were judged on the rest",
            location=tp.block_location, properties={"uncounted": len(est.uncounted)},
        )
