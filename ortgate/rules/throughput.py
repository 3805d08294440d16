"""Throughput rules (OGT): the policy's `throughput:` targets against the decode cost model's estimate for its
device (`ortgate.cost`), judged from the graph alone. Every figure is an estimate for the named device."""

from __future__ import annotations

from dataclasses import dataclass

from ortgate.cost import Estimate
from ortgate.cost.estimate import format_bandwidth, format_bytes, format_ms, format_rate
from ortgate.findings import Severity
from ortgate.rules.base import rule
from ortgate.rules.context import EVIDENCE_KEY, RuleContext

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
    est: Estimate | None = None  # the estimate judged (the prefill's for max_ttft_ms)


def _verdicts(ctx: RuleContext) -> tuple[list[TargetVerdict], Estimate | None]:
    tp, est = ctx.inputs.throughput, ctx.inputs.estimate
    if tp is None or est is None:
        return [], est
    out = []
    tokens = est.setup.shape.tokens
    for key, target in tp.static_targets.items():
        judged = ctx.inputs.prefill if key == "max_ttft_ms" else est
        if judged is None:
            continue
        budget = tokens / target if key == "min_tokens_per_s" else target / 1e3
        out.append(TargetVerdict(key, target, budget, judged.as_exported.ceiling_s, judged.as_exported.expected_s,
                                 judged.with_fixes.expected_s, judged.with_fixes.ceiling_s, judged))
    return out, est


def _asked(v: TargetVerdict, est: Estimate) -> str:
    s = est.setup
    if v.key == "max_ttft_ms":
        return (f"the policy allows at most {v.target:g} ms to the first token on {est.device.name} (a prompt of "
                f"{s.shape.new_tokens:,} tokens x batch {s.shape.batch})")
    step = f"batch {s.shape.batch} x {s.shape.new_tokens} new token{'s' if s.shape.new_tokens != 1 else ''}"
    if v.key == "min_tokens_per_s":
        return (f"the policy asks for at least {v.target:g} tokens/s on {est.device.name} ({step}, context "
                f"{s.shape.context:,}: a step budget of {format_ms(v.budget_s * 1e3)})")
    return (f"the policy allows at most {v.target:g} ms per token on {est.device.name} ({step}, context "
            f"{s.shape.context:,})")


def _rate(est: Estimate, seconds: float) -> str:
    if est.setup.shape.new_tokens > 1 and est.setup.shape.new_tokens == est.setup.shape.context:
        return f"{format_ms(seconds * 1e3)} to the first token"
    tokens = est.setup.shape.tokens
    return f"{format_rate(tokens / seconds if seconds > 0 else None)} tokens/s ({format_ms(seconds * 1e3)} per step)"


def _costs_and_fixes(est: Estimate) -> str:
    costs = "; ".join(f"({i}) {c.words}" for i, c in enumerate(est.largest_costs(3), 1))
    fixed = est.with_fixes
    ceiling = (_rate(est, fixed.ceiling_s) if est.setup.shape.new_tokens > 1
               and est.setup.shape.new_tokens == est.setup.shape.context
               else f"{format_rate(fixed.tokens_per_s_ceiling)} tokens/s")
    return f"Largest costs: {costs}. With every fix: {_rate(est, fixed.expected_s)} expected, ceiling {ceiling}"


def _properties(v: TargetVerdict, est: Estimate) -> dict:
    return {"target": v.key, "limit": v.target, "device": est.device.name, "estimate": True,
            "ms_per_step_budget": round(v.budget_s * 1e3, 4), "ms_per_step_ceiling": round(v.ceiling_s * 1e3, 4),
            "ms_per_step_expected": round(v.expected_s * 1e3, 4),
            "ms_per_step_expected_with_fixes": round(v.fixed_expected_s * 1e3, 4)}


@rule("OGT001", "throughput-below-policy", Severity.ERROR, needs=("throughput", "device"))
def throughput_below_policy(ctx: RuleContext):
    """The policy asks for more throughput than the graph as exported can ever reach on its device.

    ## What it checks
    `throughput.min_tokens_per_s` and `throughput.max_ms_per_token` against the hard ceiling of one decode step of
    the graph ORT will run (and `throughput.max_ttft_ms` against the ceiling of the prompt phase: one step of
    `prompt_length` tokens per sequence, every expert the prompt's tokens touch, attention over the prompt), on `throughput.device` at the policy's `batch_size` and `context_length`: the bytes a
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
        assert v.est is not None and ctx.inputs.throughput is not None
        est = v.est
        step = est.as_exported
        yield ctx.finding(
            f"{_asked(v, est)}; as exported the graph cannot beat {_rate(est, v.ceiling_s)}, its ceiling "
            f"({format_bytes(step.totals.bytes)} per step at {format_bandwidth(step.step_bandwidth)}, no overhead). "
            f"{_costs_and_fixes(est)}",
            location=ctx.inputs.throughput.where(v.key),
            fix="Fix the highest-priced findings first (fused MoE and attention above all), or correct the target.",
            properties=_properties(v, est),
        )


@rule("OGT002", "throughput-below-estimate", Severity.WARNING, needs=("throughput", "device"))
def throughput_below_estimate(ctx: RuleContext):
    """The policy asks for more throughput than the decode cost model expects the graph to reach on its device.

    ## What it checks
    `throughput.min_tokens_per_s` and `throughput.max_ms_per_token` against the expected step time on
    `throughput.device` (and `throughput.max_ttft_ms` against the expected prompt phase of `prompt_length` tokens): each node's roofline time at the device's default (or calibrated) memory and compute
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
        assert v.est is not None and ctx.inputs.throughput is not None
        est = v.est
        ceiling = (f"ceiling {_rate(est, v.ceiling_s)}" if v.key == "max_ttft_ms" else
                   f"ceiling {format_rate(est.as_exported.tokens_per_s_ceiling)} tokens/s")
        yield ctx.finding(
            f"{_asked(v, est)}; the estimate for the graph as exported is {_rate(est, v.expected_s)} "
            f"({ceiling}). {_costs_and_fixes(est)}",
            location=ctx.inputs.throughput.where(v.key),
            fix="Fix the highest-priced findings first. " + CALIBRATE,
            properties=_properties(v, est),
        )


@rule("OGT003", "throughput-not-judged", Severity.INFO, needs=("throughput",))
def throughput_not_judged(ctx: RuleContext):
    """A throughput target of the policy that `ortgate lint` cannot judge from the graph, and why.

    ## What it checks
    Every key of the `throughput:` block is judged or said not to be: latency percentiles
    (`max_p50_latency_ms`, `max_p90_latency_ms`, `max_p99_latency_ms`) and `min_speedup_vs_default` can only be
    measured (`ortgate run` on the device), `max_regression` needs a base model to compare with (`--compare`), a
    block without `device` names no device to estimate for, the `cpu`
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
    if tp.max_regression is not None and ctx.inputs.base is None and not measured_here:
        yield ctx.finding("throughput.max_regression judges a change against its base model, and none was given: "
                          "lint with --compare BASE_MODEL (the Action compares with its compare-ref)",
                          location=tp.where("max_regression"), properties={"target": "max_regression"})
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


# ---- memory fit ---------------------------------------------------------------------------------------------------


def _memory(ctx: RuleContext):
    mem = ctx.inputs.memory
    if mem is None or mem.capacity is None:
        return None
    return mem


def _memory_words(mem) -> str:
    from ortgate.cost.memory import format_gib

    parts = ", ".join(f"{p.name.replace('_', ' ')} {format_gib(p.bytes)}" for p in mem.parts)
    return (f"{format_gib(mem.total)} estimated on {mem.device.name} ({format_gib(mem.capacity)}, "
            f"{mem.device.memory_gib.confidence}) at batch {mem.batch}: {parts}; the KV cache holds "
            f"{mem.kv_length:,} positions ({mem.kv_source})")


def _full_context_words(mem, share: float) -> str:
    from ortgate.cost.memory import format_gib
    from ortgate.knowledge.deployment_facts import deployment_fact

    if not mem.at_full_context:
        return ""
    fact = deployment_fact("kv_buffer_full_context")
    fits = mem.length_fitting(share)
    fitting = (f"; a search.max_length of {fits:,} keeps the total within {share:.0%} of the device"
               if fits else "; no max_length fits: the weights alone leave no room")
    return (f" search.max_length {mem.kv_length:,} is the model's whole context (model.context_length): the shared "
            f"buffer pre-allocates {format_gib(mem.part('kv_cache'))} of KV cache whatever the prompt "
            f"({fact.source}){fitting}.")


def _memory_location(ctx: RuleContext, mem):
    from ortgate.findings import Location

    genai = ctx.inputs.genai
    if mem.shared_buffer and genai is not None:
        return Location(str(genai.path), line=genai.line_of("search", "max_length"))
    tp = ctx.inputs.throughput
    return tp.where("device") if tp is not None else None


def _memory_properties(mem) -> dict:
    return {"estimate": True, "device": mem.device.name, "total_bytes": round(mem.total),
            "capacity_bytes": round(mem.capacity), "share": round(mem.share, 4), "kv_length": mem.kv_length,
            "batch_size": mem.batch, **{f"{p.name}_bytes": round(p.bytes) for p in mem.parts}}


@rule("OGT004", "memory-exceeds-device", Severity.ERROR, needs=("device",))
def memory_exceeds_device(ctx: RuleContext):
    """The deployment needs more memory than its device has: weights, KV cache and workspace added up.

    ## What it checks
    The memory a session of the graph needs on `throughput.device` (or `--device`), added up from the graph
    alone: every initializer once, as stored (dims x dtype; int4 packing and quantization scales included, a tied
    embedding once); the KV cache per layer at the deployment's length (`search.max_length` of genai_config.json
    when `past_present_share_buffer` pre-allocates one buffer of it, else the policy's `context_length`, with past
    and present both alive: twice) times the batch; linear-attention states; and a bound on activations (the
    logits plus 4 live copies of the widest activation). Fails when the total exceeds the device's memory (the
    catalog's figure, or `calibration.memory_gib`). What ortgate cannot see (the CUDA context, the allocator's
    arena growth, other processes) is not added in, so a total below the device can still fail: see
    `memory-near-device`. When genai's `max_length` is the model's whole context the message says what that
    costs and which `max_length` fits.

    ## Why it costs throughput
    A deployment that does not fit never serves a token: the session fails at creation or at the first long
    prompt. The builder's exports pre-allocated 128K positions of KV cache per sequence (onnxruntime-genai#2251)
    and users hit out-of-memory at batch 1 on 24 GB cards.

    ## Bad
    ```yaml
    # the two-layer example model (float16 KV, 256 B per position) at batch 4096 and 131,072 positions: 256 GiB of
    # KV cache (past and present) on an 80 GiB H100
    throughput: {device: h100-sxm, batch_size: 4096, context_length: 131072}
    ```

    ## Good
    ```yaml
    throughput: {device: h100-sxm, batch_size: 64, context_length: 4096}
    ```

    ## Fix
    Lower the batch or the KV length (genai's `search.max_length`, the policy's `context_length`), quantize the
    weights or the KV cache, or pick a device with more memory (`ortgate estimate --list-devices`).
    """
    mem = _memory(ctx)
    if mem is None or mem.total <= mem.capacity:
        return
    share = ctx.inputs.throughput.memory_share if ctx.inputs.throughput is not None else 0.9
    fits = mem.length_fitting(share)
    hint = "" if mem.at_full_context else (
        f" A KV length of {fits:,} keeps the total within {share:.0%} of the device." if fits else
        " The weights alone leave no room for a KV cache at this batch.")
    yield ctx.finding(
        f"the deployment does not fit: {_memory_words(mem)}.{_full_context_words(mem, share)}{hint} Not counted, "
        f"since ortgate cannot see them: {'; '.join(mem.not_counted[:2])}",
        location=_memory_location(ctx, mem),
        fix="Lower the batch or the KV length (search.max_length / throughput.context_length), quantize, or use a "
            "device with more memory.",
        properties=_memory_properties(mem),
    )


@rule("OGT005", "memory-near-device", Severity.WARNING, needs=("device",))
def memory_near_device(ctx: RuleContext):
    """The deployment's estimated memory is above the policy's share of the device (default 90%) but within it.

    ## What it checks
    The same total as `memory-exceeds-device` (weights as stored, the KV cache at the deployment's length times
    the batch, linear-attention states, a bound on activations), against `throughput.max_memory_share` of the
    device's memory (default 0.9). The share is headroom for what ortgate cannot see: the CUDA context and the
    math libraries' workspaces, the allocator's arena growth (powers of two by default), other processes.

    ## Why it costs throughput
    A session that fits with no headroom fails on the first longer prompt, a larger arena extension, or a second
    process on the device: an out-of-memory in production instead of a warning in review.

    ## Bad
    ```yaml
    # the example model at batch 2048 x 131,072 positions: 128 GiB of KV cache, 91% of an H200's 141 GiB
    throughput: {device: h200, batch_size: 2048, context_length: 131072}
    ```

    ## Good
    ```yaml
    throughput: {device: h200, batch_size: 2048, context_length: 131072, max_memory_share: 0.95}
    ```

    ## Fix
    Lower the batch or the KV length, or raise `throughput.max_memory_share` once a run on the device shows the
    headroom is enough.
    """
    mem = _memory(ctx)
    if mem is None or mem.total > mem.capacity:
        return
    tp = ctx.inputs.throughput
    share = tp.memory_share if tp is not None else 0.9
    if mem.share is None or mem.share <= share:
        return
    yield ctx.finding(
        f"{mem.share:.0%} of the device's memory, above the policy's {share:.0%}: {_memory_words(mem)}."
        f"{_full_context_words(mem, share)} The rest of the device is what ortgate cannot see: "
        f"{'; '.join(mem.not_counted)}",
        location=_memory_location(ctx, mem),
        fix="Lower the batch or the KV length, or raise throughput.max_memory_share after a run on the device.",
        properties={**_memory_properties(mem), "max_memory_share": share},
    )


# ---- the regression gate: the model against the base it changes (`--compare BASE_MODEL`) ----------------------


def _part_words(part, per: str = "") -> str:
    return (f"{part.name} +{_us(part.delta_ms)}{per} ({format_bytes(part.base_bytes)} and {part.base_launches:,} "
            f"launches -> {format_bytes(part.model_bytes)} and {part.model_launches:,})")


def _us(ms: float) -> str:
    """Three significant digits: '0.148 ms', '28.1 us' (a tiny model's step is microseconds)."""
    return f"{ms:.3g} ms" if abs(ms) >= 0.1 else f"{ms * 1e3:.3g} us"


@rule("OGT006", "throughput-regression", Severity.ERROR, needs=("throughput", "device", "base"))
def throughput_regression(ctx: RuleContext):
    """The model's estimated tokens/s as exported dropped against its base by more than the policy allows.

    ## What it checks
    With `throughput.max_regression` (a share, e.g. 0.05) and a base model to compare with (`ortgate lint MODEL
    --compare BASE_MODEL`, or the Action's `compare-ref`: the same path on the pull request's base branch), the
    expected tokens/s of one decode step of the model as exported against the base's, both estimated on
    `throughput.device` for the policy's step. Fails when the model is slower by more than the share; the message
    names the components and the layers whose estimated time grew. A base whose decoder layers do not correspond
    to the model's (another family, another depth) is not the same model: said as could-not-decide. Both are
    estimates for the device, never measurements.

    ## Why it costs throughput
    Absolute targets are hard to set for a new model, so teams leave them loose; a baseline hides known findings
    but says nothing about an export that became 10% slower without a new finding (a fused layer that lost its
    fusion while another gained one, a dtype change, a larger KV cache). The pull request is where to see it.

    ## Bad
    ```yaml
    throughput: {device: h100-sxm, context_length: 1024, max_regression: 0.05}
    ```

    ```onnx base
    # the base: the same two layers, each one MatMul; the model (the fused example) runs 48 kernels a step
    <ir_version: 10, opset_import: ["" : 21]>
    decode (int64[batch_size, sequence_length] input_ids) => (float[batch_size, sequence_length, 256] logits)
    <float[256, 64] embed, float[64, 64] w0, float[64, 64] w1, float[64, 256] head>
    {
      ["/model/embed_tokens/Gather"] x = Gather<axis = 0>(embed, input_ids)
      ["/model/layers.0/mlp/MatMul"] h0 = MatMul(x, w0)
      ["/model/layers.0/Add"] r0 = Add(x, h0)
      ["/model/layers.1/mlp/MatMul"] h1 = MatMul(r0, w1)
      ["/model/layers.1/Add"] r1 = Add(r0, h1)
      ["/lm_head/MatMul"] logits = MatMul(r1, head)
    }
    ```

    ## Good
    ```yaml
    # the fused model is meant to replace the one-MatMul sketch: the policy accepts losing up to 90%
    throughput: {device: h100-sxm, context_length: 1024, max_regression: 0.9}
    ```

    ```onnx base
    <ir_version: 10, opset_import: ["" : 21]>
    decode (int64[batch_size, sequence_length] input_ids) => (float[batch_size, sequence_length, 256] logits)
    <float[256, 64] embed, float[64, 64] w0, float[64, 64] w1, float[64, 256] head>
    {
      ["/model/embed_tokens/Gather"] x = Gather<axis = 0>(embed, input_ids)
      ["/model/layers.0/mlp/MatMul"] h0 = MatMul(x, w0)
      ["/model/layers.0/Add"] r0 = Add(x, h0)
      ["/model/layers.1/mlp/MatMul"] h1 = MatMul(r0, w1)
      ["/model/layers.1/Add"] r1 = Add(r0, h1)
      ["/lm_head/MatMul"] logits = MatMul(r1, head)
    }
    ```

    ## Fix
    Find what the change lost in the comparison (`ortgate lint MODEL --compare BASE_MODEL`: the findings that
    appeared, and the components and layers whose time grew) and fix it; if the slower model is intended, raise
    `throughput.max_regression` in the same pull request, where a reviewer sees it.
    """
    from ortgate.cost.compare import compare_estimates
    from ortgate.findings import Location

    tp, base = ctx.inputs.throughput, ctx.inputs.base
    if tp is None or base is None or tp.max_regression is None:
        return
    est, base_est = ctx.inputs.estimate, base.estimate
    if est is None or base_est is None:
        return  # no figures for the device: throughput-not-judged says so
    where: Location = tp.where("max_regression")
    base_name = base.model.label or base.model.path  # the Action names a base it read with git by its ref
    cmp = compare_estimates(base_est, est)
    if cmp.layers_differ is not None:
        yield ctx.undecided(f"throughput.max_regression against {base_name}: {cmp.layers_differ}", location=where,
                            properties={"base": base_name})
        return
    change = cmp.tokens_change
    if change is None:
        yield ctx.undecided(f"throughput.max_regression against {base_name}: the estimate has no tokens/s for one "
                            "of the two", location=where, properties={"base": base_name})
        return
    if -change <= tp.max_regression:
        return
    comps, groups = cmp.slower_parts()
    lost = "; ".join(_part_words(c) for c in comps[:4]) or "no component alone"
    layers = "; ".join(_part_words(g, " per layer") for g in groups[:3])
    yield ctx.finding(
        f"the estimated tokens/s as exported dropped {-change:.1%} against the base {base_name} "
        f"({format_rate(cmp.base.tokens_per_s)} -> {format_rate(cmp.model.tokens_per_s)} tokens/s, "
        f"{_us(cmp.base.ms_per_step)} -> {_us(cmp.model.ms_per_step)} per step on {cmp.device}), more "
        f"than throughput.max_regression allows ({tp.max_regression:.0%}). Time grew in: {lost}"
        + (f". Layers: {layers}" if layers else ""),
        location=where,
        fix="Fix what the change lost (the comparison lists the findings that appeared), or raise "
            "throughput.max_regression in the same change if the slower model is intended.",
        properties={"estimate": True, "device": cmp.device, "base": base_name,
                    "max_regression": tp.max_regression, "tokens_per_s_change": round(change, 4),
                    "tokens_per_s_base": round(cmp.base.tokens_per_s or 0.0, 3),
                    "tokens_per_s_model": round(cmp.model.tokens_per_s or 0.0, 3)},
    )
