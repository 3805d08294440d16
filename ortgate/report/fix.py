"""The `ortgate fix` report: per rewrite (layer, pattern, nodes removed/added, weight bytes per decode token before and
after, verification), refusals with their reasons, fusions per layer, verification, lint before/after, measurement."""

from __future__ import annotations

import json
from collections import Counter

from ortgate.findings import Kind
from ortgate.report import clean, unforgeable

FIX_REPORT_VERSION = 1


def _mb(n: int) -> str:
    """Bytes in the unit family `ortgate estimate` and `lint` use (KiB, MiB, GiB)."""
    from ortgate.cost.estimate import format_bytes

    return format_bytes(n)


def _probe_results(outcome) -> dict[str, dict]:
    v = outcome.result.verification
    out: dict[str, dict] = {}
    if v is None:
        return out
    for p in v.probes:
        c = p.comparison
        out[p.value] = {"node": p.node, "max_abs_diff": c.max_abs_diff if c else None,
                        "ok": bool(c and c.ok and c.compared), "note": p.note or (c.note if c else None)}
    return out


def rewrite_verdict(outcome, rewrite) -> str:
    v = outcome.result.verification
    if outcome.result.dry_run:
        return "not run (--dry-run)"
    if v is None:
        return "not run (--no-verify)"
    probe = _probe_results(outcome).get(rewrite.output)
    if probe is None:
        return "covered by the model outputs" if v.mode == "per block" or not v.passed else \
            "proven by the delivered model's outputs"
    if probe["note"]:
        return f"not run: {probe['note']}"
    if probe["ok"] and v.mode == "per block":
        return f"equal, run on its own block (max diff {probe['max_abs_diff']:.2g} of the block output's scale)"
    if probe["ok"]:
        return f"equal (max abs diff {probe['max_abs_diff']:.2g})"
    if probe["max_abs_diff"] is None:
        return f"DIVERGES ({probe['note'] or 'its output shape differs'})"
    return f"DIVERGES (max abs diff {probe['max_abs_diff']:.3g})"


def _figures(source: str) -> str:
    return "figures probed on this machine" if source == "probe" else f"{source} figures"


def _lint_moe(outcome) -> str:
    """What lint says of the input's MoE, for a fix that recognised no block (so it is not read as "MoE done")."""
    moe = [f for f in outcome.findings_before if f.rule == "moe-not-fused"]
    unread = [f for f in moe if f.kind is Kind.UNDECIDED]
    unfused = len(moe) - len(unread)
    if unread:  # routers no form read: named with the reason, never "no MoE"
        why = "; ".join(f.message.removeprefix("could not decide: ") for f in unread)
        return (f"lint reads {unfused} unfused MoE layer{'s' if unfused != 1 else ''} and could not read "
                f"{len(unread)} router-like structure{'s' if len(unread) != 1 else ''}, left as they are: {why}")
    if unfused:
        return (f"lint reports {unfused} unfused MoE layer{'s' if unfused != 1 else ''} (moe-not-fused), left as "
                "they are")
    return ("lint reports no unfused MoE (moe-not-fused 0) either: a dense model, or MoE layers ortgate does not "
            "read, which stay as they are")


def _written_for(r) -> str | None:
    """The deployment the MoE nodes were written for (the policy's release and provider), and what that decided."""
    d = getattr(r, "keep_decision", None)
    if d is None or not r.rewrites:
        return None
    release = f"onnxruntime {d.release}" if d.release else "any onnxruntime release (the policy names none)"
    provider = f" on {d.provider}" if d.provider else ""
    form = "MoE inputs kept alive past the node" if d.keep else "no in-place workaround"
    return f"{release}{provider}: {form}: {d.reason}"


def render_fix_text(outcome) -> str:
    r = outcome.result
    lines = [f"ortgate fix {r.model} -> {r.output}" + (" (dry run: nothing written)" if r.dry_run else "")]
    lines.append(f"repairs: {', '.join(r.kinds) or 'none'}; onnxruntime {r.ort_installed or 'not installed'}"
                 + (f", policy target {r.ort_target}" if r.ort_target else ""))
    written_for = _written_for(r)
    if written_for:
        lines.append(f"written for: {written_for}")
    for w in r.warnings:
        lines.append(f"warning: {w}")
    if "moe" in r.kinds:
        lines.append("")
        if r.rewrites or r.refusals:
            lines.append(f"MoE rewrites: {len(r.rewrites)} block(s) -> com.microsoft.MoE, {len(r.refusals)} left "
                         "unchanged")
        else:
            lines.append(f"MoE rewrites: none: no MoE block recognised; {_lint_moe(outcome)}")
        for rw in r.rewrites:
            a = rw.anatomy
            attrs = ", ".join(f"{k}={v}" for k, v in rw.attributes.items())
            lines.append(f"  layer {a.layer}: {a.pattern} ({a.routing}, {len(a.experts)} experts, k={a.k}, "
                         f"hidden {a.hidden_size}, intermediate {a.intermediate_size}) -> {rw.node_name}")
            lines.append(f"    nodes removed {rw.removed}, added {rw.added}; expert weight bytes per decode token "
                         f"{_mb(rw.bytes_before)} -> {_mb(rw.bytes_after)}; verification: {rewrite_verdict(outcome, rw)}")
            lines.append(f"    {attrs}")
            for note in rw.notes:
                lines.append(f"    note: {note}")
        for ref in r.refusals:
            where = f"layer {ref.layer}" if ref.layer is not None else "block"
            lines.append(f"  {where} ({ref.node}): left unchanged: {ref.reason}")
    if r.fusions is not None:
        lines.append("")
        counts = ", ".join(f"{k} {v}" for k, v in r.fusions.counts.items() if v) or "none"
        lines.append(f"onnxscript fusions ({', '.join(r.fusions.kinds)}): {counts}")
        for layer in r.fusions.layers:
            name = f"layer {layer.layer}" if layer.layer is not None else "outside the layers"
            applied = ", ".join(f"{k} x{n}" for k, n in layer.applied.items()) or "nothing"
            if layer.became:
                applied += " (" + ", ".join(f"{op} x{n}" for op, n in layer.became.items()) + ")"
            lines.append(f"  {name}: fused {applied}")
            for kind, (count, why) in layer.missed.items():
                lines.append(f"    {kind}: {count} still decomposed: {why}")
        for note in r.fusions.attention_notes:
            lines.append(f"  no GroupQueryAttention written where its rule matched: {note}")
    v = r.verification
    lines.append("")
    if v is None:
        why = " (--dry-run)" if r.dry_run else " (--no-verify)" if r.changed else ": nothing was rewritten"
        lines.append(f"verification: not run{why}")
    else:
        margin = f", routing margin {v.routing_margin:.3g}" if v.routing_margin is not None else ""
        if v.mode == "as tokens":  # no common step: the tokens line below is the comparison
            lines.append(f"verification on ORT CPU, as tokens: {'PASSED' if v.passed else 'FAILED'}")
        else:
            lines.append(f"verification on ORT CPU, {v.mode} (inputs seed {v.seed}{margin}): "
                         f"{'PASSED' if v.passed else 'FAILED'}; max abs diff {v.max_abs:.3g}, max rel diff "
                         f"{v.max_rel:.3g}")
        if v.mode != "per block" and v.session:
            lines.append(f"  the written folder loaded from disk against the original, in plain sessions with "
                         f"{v.session}")
        for step in v.steps:
            lines.append(f"  {step.label}: {'equal' if step.passed else 'DIFFERS'} (max rel diff {step.max_rel:.3g})")
        for what in v.not_checked:
            lines.append(f"  not checked: {what}")
        for note in v.notes:
            lines.append(f"  note: {note}")
        for c in v.outputs:
            shown = f"{c.max_abs_diff:.3g}" if c.max_abs_diff is not None else "n/a"
            lines.append(f"  {c.output} [{c.dtype}]: max abs {shown}"
                         f", max rel {v.max_rel_diff.get(c.output, 0.0):.3g}, {c.mismatched}/{c.total} outside "
                         f"rtol {c.rtol:g} atol {c.atol:g}")
    lines.extend(_token_lines(r))
    before, after = Counter(f.rule for f in outcome.findings_before), Counter(f.rule for f in outcome.findings_after)
    if before or after:
        rules = sorted(set(before) | set(after))
        shown = "; ".join(f"{rule} {before.get(rule, 0)} -> {after.get(rule, 0) if r.written else '-'}" for rule in rules)
        lines.append(f"lint (repaired rules, input -> output): {shown}")
    m = outcome.measurement
    if m is not None:
        if m.original is None:
            lines.append(f"measured ({m.step}): fixed {m.fixed.p50_ms:.3f} ms; {m.note}")
        else:
            # The speedup printed beside the two p50s is their ratio; the per-round median, which the JSON's
            # `speedup` holds, is said as what it is.
            plain = m.original.p50_ms / m.fixed.p50_ms if m.fixed.p50_ms > 0 else None
            ratio = f", speedup {plain:.2f}x (original p50 / fixed p50)" if plain is not None else ""
            rounds = (f"; median of the per-round ratios {m.ratio.describe()}" if m.ratio is not None else "")
            lines.append(f"measured ({m.step}): original p50 {m.original.p50_ms:.3f} ms, fixed p50 "
                         f"{m.fixed.p50_ms:.3f} ms{ratio}{rounds}")
    p = outcome.prediction
    if p is not None:
        speedup = f", speedup {p.speedup:.2f}x" if p.speedup is not None else ""
        lines.append(f"estimated by the cost model for {p.device} ({_figures(p.figures)}), the same step: original "
                     f"{p.original_ms:.3f} ms, fixed {p.fixed_ms:.3f} ms{speedup} (an estimate, not a measurement)")
        for what in p.uncounted:
            lines.append(f"  not counted: {what}")
    lines.append("")
    if outcome.failure:
        lines.append(f"FAILED: {outcome.failure}")
    elif r.written:
        lines.append(f"wrote {r.output}: {', '.join(r.files)} ({r.nodes_before} -> {r.nodes_after} nodes)")
    elif r.dry_run:
        lines.append(f"dry run: {r.nodes_before} -> {r.nodes_after} nodes; nothing written")
    else:
        lines.append("nothing to fix: nothing written")
    # Each entry is one line: whatever a path, a node name or a reason holds stays on it (clean), and no line can
    # pass for a workflow command (unforgeable).
    return unforgeable("\n".join(clean(line) for line in lines) + "\n")


def fix_json(outcome) -> dict:
    r = outcome.result
    v = r.verification
    m = outcome.measurement
    return {
        "version": FIX_REPORT_VERSION,
        "model": r.model,
        "output": r.output,
        "written": r.written,
        "dry_run": r.dry_run,
        "repairs": list(r.kinds),
        "onnxruntime": {"installed": r.ort_installed, "target": r.ort_target,
                        "written_for": None if r.keep_decision is None else {
                            "release": r.keep_decision.release, "provider": r.keep_decision.provider,
                            "inplace_workaround": r.keep_decision.keep, "reason": r.keep_decision.reason},
                        "verified_with_keep_alive": r.verified_with_keep_alive},
        "warnings": r.warnings,
        "nodes": {"before": r.nodes_before, "after": r.nodes_after},
        "rewrites": [{
            "layer": rw.layer,
            "pattern": rw.anatomy.pattern,
            "routing": rw.anatomy.routing,
            "node": rw.node_name,
            "experts": len(rw.anatomy.experts),
            "k": rw.anatomy.k,
            "hidden_size": rw.anatomy.hidden_size,
            "intermediate_size": rw.anatomy.intermediate_size,
            "attributes": rw.attributes,
            "nodes_removed": rw.removed,
            "nodes_added": rw.added,
            "weight_bytes_per_decode_token": {"before": rw.bytes_before, "after": rw.bytes_after},
            "verification": rewrite_verdict(outcome, rw),
            "notes": rw.notes,
            "group_router": None if rw.group is None else {
                "n_group": rw.group.n_group, "topk_group": rw.group.topk_group, "group_topk": rw.group.group_topk,
                "top_k": rw.group.top_k, "expert_bias": rw.group.bias, "routed_scaling_factor": rw.group.scale},
        } for rw in r.rewrites],
        "refusals": [{"layer": ref.layer, "node": ref.node, "reason": ref.reason} for ref in r.refusals],
        "fusions": None if r.fusions is None else {
            "kinds": list(r.fusions.kinds),
            "counts": r.fusions.counts,
            "layers": [{"layer": layer.layer, "applied": layer.applied, "became": layer.became,
                        "missed": {k: {"count": n, "reason": why} for k, (n, why) in layer.missed.items()}}
                       for layer in r.fusions.layers],
            "attention_notes": r.fusions.attention_notes,
        },
        "tokens": None if r.tokens is None else {
            "passed": r.tokens.passed,
            "original": r.tokens.original_mode,
            "fixed": r.tokens.fixed_mode,
            "batches": [{"batch": b.batch, "prompt_length": b.prompt_length, "steps": b.steps, "max_abs": b.max_abs,
                         "max_rel": b.max_rel, "ids_equal": b.ids_equal, "divergence": b.divergence, "ids": b.ids}
                        for b in r.tokens.batches],
        },
        "attention_kept": r.attention_kept,
        "genai_config": r.genai_config,
        "verification": None if v is None else {
            "passed": v.passed,
            "mode": v.mode,
            "notes": v.notes,
            "seed": v.seed,
            "routing_margin": v.routing_margin,
            "inputs": v.feeds,
            "max_abs_diff": v.max_abs,
            "max_rel_diff": v.max_rel,
            "outputs": [{"output": c.output, "dtype": c.dtype, "max_abs_diff": c.max_abs_diff,
                         "max_rel_diff": v.max_rel_diff.get(c.output), "mismatched": c.mismatched, "total": c.total,
                         "rtol": c.rtol, "atol": c.atol} for c in v.outputs],
            "first_divergent_node": v.first_divergent.node if v.first_divergent else None,
            "session": v.session,
            "steps": [{"step": st.label, "passed": st.passed, "max_rel_diff": st.max_rel, "seed": st.seed,
                       "routing_margin": st.routing_margin, "inputs": st.feeds} for st in v.steps],
            "not_checked": v.not_checked,
        },
        "lint": {"before": [f.code for f in outcome.findings_before], "after": [f.code for f in outcome.findings_after]},
        "measurement": None if m is None else {
            "step": m.step, "original_p50_ms": m.original.p50_ms if m.original else None,
            "fixed_p50_ms": m.fixed.p50_ms, "speedup": m.speedup, "predicted_speedup": outcome.predicted_speedup,
            "speedup_spread": None if m.ratio is None else [m.ratio.low, m.ratio.high],
            "rounds": None if m.ratio is None else m.ratio.rounds,
            "within_noise": None if m.ratio is None else m.ratio.within_noise,
            "note": m.note, "batch_size": m.batch_size, "new_tokens": m.new_tokens, "context_length": m.context,
        },
        "prediction": None if outcome.prediction is None else {
            "estimate": True,
            "device": outcome.prediction.device,
            "figures": outcome.prediction.figures,
            "original_ms_per_step_expected": round(outcome.prediction.original_ms, 6),
            "fixed_ms_per_step_expected": round(outcome.prediction.fixed_ms, 6),
            "speedup": None if outcome.prediction.speedup is None else round(outcome.prediction.speedup, 4),
            "uncounted": outcome.prediction.uncounted,
        },
        "failure": outcome.failure,
        "files": r.files,
    }


def render_fix_json(outcome) -> str:
    return json.dumps(fix_json(outcome), allow_nan=False, indent=2, sort_keys=False) + "\n"


def _token_lines(r) -> list[str]:
    lines = []
    if r.attention_kept:
        lines.append(f"attention kept as exported: the GroupQueryAttention rewrite could not be proven ({r.attention_kept})"
                     "; the other repairs stand")
    if r.genai_config:
        lines.append(f"genai_config.json: {r.genai_config}")
    t = r.tokens
    if t is not None:
        batches = ", ".join(str(b.batch) for b in t.batches)
        verdict = ("identical ids, logits within tolerance at every step" if t.passed else f"DIVERGED: {t.why}")
        steps = max((b.steps for b in t.batches), default=0)
        worst = max((b.max_abs for b in t.batches), default=0.0)
        lines.append(f"tokens: {steps} greedy steps from fixed prompts at batch {batches}, the original ({t.original_mode}) "
                     f"against the written folder loaded from disk ({t.fixed_mode}): {verdict}; logits max abs diff "
                     f"{worst:.3g}")
    return lines

