"""`ortgate run`'s report, in every format `ortgate lint` writes: the findings exactly as lint reports them (the
runtime rules' among them, ORT's refusals and --timeout included), with the run's figures where the format has a
place for them (text: before the findings; json: under "run"; markdown: a section after the verdict)."""

from __future__ import annotations

import io
import json

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ortgate.engine.pipeline import LintResult
from ortgate.evidence import Measurement, RunEvidence
from ortgate.knowledge.provider_names import CPU
from ortgate.report import clean, unforgeable

MAX_ORT_LINES = 5  # ORT's warnings while creating the policy session (all of them are in the JSON report)


def render_run(fmt: str, result: LintResult, evidence: RunEvidence, *, expand: bool = False, width: int | None = None,
               color: bool = False) -> str:
    """The run report in `fmt`; `expand`, `width` and `color` shape the findings as for `ortgate lint`."""
    from ortgate.report import render

    if fmt == "json":
        from ortgate.report.json_report import report_dict

        report = report_dict(result)  # the lint report as a value, with the run's figures beside it
        report["run"] = evidence.to_dict()
        return json.dumps(report, allow_nan=False, indent=2, sort_keys=True, default=str) + "\n"
    if fmt == "text":
        return render_figures(evidence) + "\n" + render("text", result, expand=expand, width=width, color=color)
    if fmt == "markdown":
        summary = render("markdown", result, expand=expand)
        head, sep, rest = summary.partition("\n\n")  # after the verdict heading
        figures = render_figures(evidence).rstrip("\n").replace("`", "'")  # no fence can close early
        section = f"### Run\n\n```text\n{figures}\n```\n"
        return f"{head}{sep}{section}\n{rest}" if sep else f"{summary}\n{section}"
    return render(fmt, result)  # sarif, github, junit, codequality: the findings (the runtime ones say what it saw)


def render_figures(evidence: RunEvidence, *, width: int = 110) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=False, no_color=True, width=width, highlight=False, soft_wrap=True)
    _write(console, evidence)
    return unforgeable(buffer.getvalue())


def _line(console: Console, label: str, text: str) -> None:
    line = Text(f"{label:<11}", style="bold")
    line.append(clean(text))  # one line, whatever a path, a key or ORT's message holds
    console.print(line)


def _write(console: Console, ev: RunEvidence) -> None:
    s = ev.session
    p = s.provider
    console.print(Text(clean(f"ortgate run: {ev.model} (policy {ev.policy})"), style="bold underline"))
    cpu = " [CPU]" if ev.cpu_figures else ""
    if ev.cpu_figures:
        console.print(Text(f"CPU FIGURES: {p.requested} is not available here; the policy's config ran on "
                           f"{CPU} (--allow-cpu). Every figure below is a CPU figure.", style="bold"))
    ran = f"session runs on {', '.join(p.ran_on)}" if p.ran_on else "no session built"
    _line(console, "provider", f"requested {p.requested}; {ran}"
          + ("" if p.available else f" ({p.requested} unavailable: {p.unavailable_reason})"))
    if s.options:
        _line(console, "options", ", ".join(f"{o.key}={o.requested!r} -> {o.effective!r}"
                                            f"{'' if o.applied else ' NOT APPLIED'}" for o in s.options))
    if s.dims:
        _line(console, "overrides", ", ".join(f"{d.dim}={d.value} ({d.status})" for d in s.dims))
    if s.placement:
        counts = ", ".join(f"{prov}: {sum(ops.values())} nodes" for prov, ops in s.placement.items())
        memcpy = sum(n for ops in s.placement.values() for op, n in ops.items() if op.startswith("Memcpy"))
        _line(console, "placement", f"{counts}; {memcpy} Memcpy nodes")
    if s.dump is not None:
        if s.dump.path and s.dump.kept:
            _line(console, "dump", f"{s.dump.path}: linted with the same rules")
        elif s.dump.path:
            _line(console, "dump", f"the optimized graph was linted with the same rules, then deleted (--dump FILE "
                                   f"keeps it); its findings are under 'optimized graph of {ev.model}'")
        else:
            _line(console, "dump", f"none: {s.dump.reason}")
    if ev.dims:
        _line(console, "inputs", ", ".join(f"{k}={v}" for k, v in ev.dims.items()))
    for failure in ev.failures:
        node = f" at node {failure.node!r}" if failure.node else ""
        _line(console, "stopped", f"while {failure.phase}{node}: {failure.message}")
    if ev.skipped:
        _line(console, "measured", f"nothing: {ev.skipped}")
    if ev.measurement is not None:
        _measurement(console, "policy", ev.measurement, cpu)
    if ev.baseline is not None:
        _measurement(console, "default", ev.baseline, cpu)
        if ev.speedup_vs_default is not None and ev.measurement is not None:
            if ev.versus_default is not None:
                _line(console, "speedup", f"{ev.versus_default.describe(3)} policy vs ORT's default session (the "
                                          f"median of the rounds' default p50 / policy p50){cpu}")
            else:
                _line(console, "speedup", f"{ev.speedup_vs_default:.3f}x policy vs ORT's default session "
                                          f"(p50 {_ms(ev.baseline.stats.p50_ms)} ms / "
                                          f"{_ms(ev.measurement.stats.p50_ms)} ms){cpu}")
    if ev.estimate is not None:
        _estimate(console, ev, cpu)
    if ev.correctness is not None:
        worst = [o for o in ev.correctness.outputs if not o.ok]
        diffs = ", ".join(f"{o.output} {o.max_abs_diff:.2g}" for o in ev.correctness.outputs[:4]
                          if o.max_abs_diff is not None)
        verdict = (f"{len(worst)} output(s) differ" if worst else "all outputs within tolerance")
        _line(console, "outputs", f"vs {ev.correctness.reference}: {verdict} (max |diff|: {diffs or 'n/a'})")
    for note in ev.notes:
        _line(console, "note", note)
    for message in s.ort_messages[:MAX_ORT_LINES]:
        _line(console, "ort said", message)
    if ev.profile is not None:
        _profile(console, ev, cpu)


def _estimate(console: Console, ev: RunEvidence, cpu: str) -> None:
    e = ev.estimate or {}
    if e.get("device") is None:
        _line(console, "estimate", e.get("note", "no estimate"))
        return
    figures = {"calibrated": "calibrated figures", "probe": "figures probed on this machine"}.get(
        e.get("figures", ""), "catalog figures")
    expected = e.get("tokens_per_s_expected")
    measured = e.get("tokens_per_s_measured")
    ceiling = e.get("tokens_per_s_ceiling")
    ratio = f"; measured {measured:,.1f} tokens/s = {measured / expected:.0%} of the estimate" if expected else ""
    # A graph whose step the cost model prices at 0 s (no bytes, FLOPs or launches it counts) has no rate.
    rate = (f"{expected:,.1f} tokens/s expected ({_ms(e['ms_per_step_expected'])} ms per step)" if expected else
            "no expected rate (the cost model counts no time in this graph's step)")
    top = (f"ceiling {ceiling:,.1f} tokens/s" if ceiling else
           "no ceiling (the cost model counts no bytes or FLOPs in this graph's step)")
    _line(console, "estimate", f"{e['device']} ({figures}): {rate}, {top}{ratio} (an estimate for {e['device']}, "
                               f"not a measurement){cpu}")


def _ms(value: float) -> str:
    return f"{value:.4f}" if value < 1 else f"{value:.3f}" if value < 100 else f"{value:,.1f}"


def _measurement(console: Console, label: str, m: Measurement, cpu: str) -> None:
    st = m.stats
    mode = "IOBinding" + (" + CUDA graph replay" if m.cuda_graph else "")
    _line(console, label, f"{m.provider} on {m.device}: p50 {_ms(st.p50_ms)} ms, p90 {_ms(st.p90_ms)} ms, "
                          f"p99 {_ms(st.p99_ms)} ms, mean {_ms(st.mean_ms)} ms ({m.warmup} warm-up + "
                          f"{st.iterations} timed runs, {mode}){cpu}")
    if m.prefill:
        _line(console, "", f"{m.tokens_per_second:,.1f} tokens/s of prefill (batch {m.batch_size} x {m.new_tokens} "
                           f"token{'s' if m.new_tokens != 1 else ''} / p50; the graph has no KV cache, so this is no "
                           f"decode step: every generated token reruns the whole sequence){cpu}")
    else:
        _line(console, "", f"{m.tokens_per_second:,.1f} tokens/s (batch {m.batch_size} x {m.new_tokens} new "
                           f"token{'s' if m.new_tokens != 1 else ''} / p50){cpu}")
    if m.peak_memory_bytes is not None:
        _line(console, "", f"{m.peak_memory_bytes / 2**20:.1f} MiB {m.memory_source}")


def _profile(console: Console, ev: RunEvidence, cpu: str) -> None:
    pr = ev.profile
    assert pr is not None
    text = f"{pr.runs} runs, {pr.memcpy_nodes} Memcpy nodes ({pr.memcpy_calls} calls)"
    if pr.arena_peak_bytes is not None:
        text += f", ORT arena peak {pr.arena_peak_bytes / 2**20:.1f} MiB"
    if pr.file:
        text += f", trace {pr.file}"
    _line(console, "profile", text + cpu)
    if pr.note:
        _line(console, "", pr.note)
    providers = Table("provider", "nodes", "calls", "time (us)", "share", box=None, pad_edge=False)
    for row in pr.providers:
        providers.add_row(row["provider"], str(row["nodes"]), str(row["calls"]), f"{row['total_us']:.0f}",
                          f"{row['share']:.1%}")
    console.print(providers)
    ops = Table("op type", "provider", "calls", "time (us)", "us/run", "share", box=None, pad_edge=False)
    for row in pr.op_types:
        ops.add_row(clean(row["op_type"]), row["provider"], str(row["calls"]), f"{row['total_us']:.0f}",
                    f"{row['avg_us_per_run']:.1f}", f"{row['share']:.1%}")
    console.print(ops)
