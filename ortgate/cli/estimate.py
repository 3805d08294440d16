"""`ortgate estimate`: what one decode step of a model costs on a device, as exported and with every fix.

Bytes, FLOPs, kernel launches and host synchronisations per component and per group of identical layers, the
ceiling and expected tokens per second, the largest costs and what each kind of fix saves. An estimate for the
named device from the graph alone (never a weight byte, never a measurement).
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from typing import Literal

from ortgate.cli.args import GenaiConfigArgs, ReleaseArgs
from ortgate.cli.output import EXIT_PASS, Output, check_outputs, release_notice, write
from ortgate.errors import InputError

FORMATS = ("text", "json")


def add_parser(sub) -> None:
    p = sub.add_parser("estimate", help="estimate a decode step's bytes, FLOPs, launches and tokens/s on a device")
    p.add_argument("model", nargs="?", help="an .onnx file, or a folder holding model.onnx (and genai_config.json)")
    p.add_argument("--policy", help="deployment policy YAML (its throughput: block names the device and the step)")
    p.add_argument("--device", help="a device of the catalog (overrides the policy's); see --list-devices")
    p.add_argument("--batch", type=_batches, metavar="N[,N...]",
                   help="sequences per decode step (overrides the policy's); a list (1,8,32,128) sweeps the batches")
    p.add_argument("--prompt", type=_prompt, metavar="TOKENS",
                   help="prompt tokens per sequence: estimate the prefill (time to first token) too")
    p.add_argument("--context", type=_context, help="positions each step attends to (overrides the policy's)")
    p.add_argument("--optimized", metavar="DUMP", help="estimate ORT's optimized model dump instead of the model")
    GenaiConfigArgs.add_to(p)
    ReleaseArgs.add_to(p)
    p.add_argument("--format", choices=FORMATS, default="text")
    p.add_argument("--output", metavar="FILE", help="write the estimate to FILE instead of stdout")
    p.add_argument("--probe", action="store_true",
                   help="measure this machine's CPU for the cpu device (without it, the cpu device needs a "
                        "calibration; needs ONNX Runtime)")
    p.add_argument("--list-devices", action="store_true", help="list the device catalog and exit")
    p.add_argument("--compare", metavar="BASE_MODEL",
                   help="also estimate the model this one changes, on the same device and step, and show the change "
                        "per component and layer group")


def _count(text: str, what: str) -> int:
    """A positive count in ASCII digits, at most the largest the policy's `throughput:` allows for `what`
    (int() would take full-width or Arabic-Indic digits, underscores and hundreds of digits)."""
    from ortgate.config.throughput import step_bounds

    maximum = getattr(step_bounds(), what)
    if not text.isascii() or not text.isdigit():
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"expected a positive integer in ASCII digits (0-9), got {shown!r}")
    if len(text.lstrip("0")) > len(str(maximum)) or int(text) > maximum:
        shown = text if len(text) <= 20 else f"a number of {len(text)} digits"
        raise argparse.ArgumentTypeError(f"{shown} is above the largest {what} ortgate estimates, {maximum:,} (the "
                                         "policy's throughput: block has the same bound)")
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _prompt(text: str) -> int:
    return _count(text, "prompt")


def _context(text: str) -> int:
    return _count(text, "context")


def _batches(text: str) -> tuple[int, ...]:
    from ortgate.config.throughput import step_bounds

    most = step_bounds().batch_sizes
    if text.count(",") >= most:
        raise argparse.ArgumentTypeError(f"{text.count(',') + 1} batch sizes; a sweep takes at most {most} (the "
                                         "policy's throughput.batch_sizes has the same bound)")
    items = [x.strip() for x in text.split(",")]
    if not items or any(not x for x in items):
        shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {shown!r}")
    return tuple(_count(x, "batch") for x in items)


def cmd_estimate(args: argparse.Namespace) -> int:
    if args.list_devices:
        check_outputs([Output(args.output, "device list")] if args.output else [], [])
        write(devices_text() if args.format == "text" else devices_json(), args.output)
        return EXIT_PASS
    if not args.model:
        raise InputError("estimate: a MODEL is required (see `ortgate estimate --help`)")
    from ortgate.engine.pipeline import LintRequest, load_inputs
    from ortgate.engine.throughput import CostOverrides

    outputs = [Output(args.output, "estimate")] if args.output else []
    if args.compare and args.optimized:
        raise InputError("--compare compares two models as exported; drop --optimized to compare them")
    check_outputs(outputs, [args.model, args.policy, args.optimized, args.config, args.compare])
    request = LintRequest(args.model, args.policy, args.optimized, args.config,
                          CostOverrides(args.device, args.batch[0] if args.batch else None, args.context, args.prompt,
                                        tuple(args.batch) if args.batch and len(args.batch) > 1 else (),
                                        probe=args.probe),
                          ort_version=ReleaseArgs.parse(args).ort_version)
    inputs = load_inputs(request)
    release_notice(inputs)
    check_outputs(outputs, inputs.files_read)
    est = inputs.estimate
    if est is None and inputs.cost_gap is not None:
        raise InputError(f"estimate: {inputs.cost_gap}")
    if est is None:
        from ortgate.knowledge.devices import device_names

        raise InputError("estimate: no device to estimate for: pass --device NAME or a policy with throughput.device "
                         f"(devices: {', '.join(device_names())})")
    compared = _compared(args, inputs, request.cost, outputs)
    text = render_json(est, inputs, compared) if args.format == "json" else render_text(est, inputs)
    if compared is not None and args.format == "text":
        text += compared_text(*compared)
    write(text, args.output)
    return EXIT_PASS


def _compared(args: argparse.Namespace, inputs, cost, outputs: list[Output]):
    """(the base's path, the estimate comparison) for --compare BASE_MODEL; None without it."""
    if not args.compare:
        return None
    from ortgate.engine.compare import estimate_comparison, load_base

    base = load_base(args.compare, inputs, args.policy, cost=cost)
    check_outputs(outputs, base.files_read)
    comparison = estimate_comparison(base, inputs)
    if comparison is None:
        raise InputError(f"--compare: the base is not priced: {base.cost_gap or 'no device'}", args.compare)
    return base.model.path, comparison


def compared_text(base: str, comparison) -> str:
    from ortgate.report.comparison import estimate_text_lines

    return "\n" + "\n".join([f"compared with {base}", *estimate_text_lines(comparison)]) + "\n"


# ---- text ---------------------------------------------------------------------------------------------------------


def render_text(est, inputs, *, width: int = 120) -> str:
    import sys

    from rich.table import Table

    from ortgate.cost.estimate import format_bandwidth, format_bytes, format_ms, format_rate

    buffer = io.StringIO()
    color = sys.stdout.isatty()
    console = _OneLineConsole(file=buffer, force_terminal=color, no_color=not color, width=width, highlight=False,
                              soft_wrap=True, markup=False)
    s, d = est.setup, est.device
    a, w = est.as_exported, est.with_fixes
    tokens = "token" if s.shape.new_tokens == 1 else "tokens"
    console.print(f"ortgate estimate: {inputs.executed.path} on {d.name} ({d.label}), batch {s.shape.batch} x "
                  f"{s.shape.new_tokens} new {tokens}, context {s.shape.context:,}")
    weights = sorted(a.bytes_by_dtype.items(), key=lambda kv: -kv[1])
    dtypes = [{"float32": "float"}.get(k, k) for k, _ in weights]
    console.print(f"figures   {_figures_line(d, dtypes)}")
    session = [s.provider or f"{d.name}'s usual provider", s.optimization_level or "ORT_ENABLE_ALL"]
    if est.model.gpu_launches:
        session.append("CUDA graph " + ("on" if a.cuda_graph else "requested, but blocked" if s.cuda_graph else "off"))
    if est.model.ort_fusions_applied:
        session.append("ORT fuses " + ", ".join(est.model.ort_fusions_applied))
    console.print(f"session   {'; '.join(session)}")
    console.print()

    table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold")
    columns: tuple[tuple[str, Literal["left", "right"]], ...] = (
        ("component", "left"), ("bytes/step", "right"), ("GFLOP/step", "right"), ("launches", "right"), ("syncs", "right"), ("share", "right"), ("| with fixes: bytes", "right"),
                           ("launches", "right"), ("share", "right"))
    for title, justify in columns:
        table.add_column(title, justify=justify)
    names = [c for c in ("attention", "moe", "mlp", "norms", "embedding", "lm_head", "other")
             if c in a.components or c in w.components]
    for c in names:
        ta, tw = a.components.get(c), w.components.get(c)
        table.add_row(c, *(_cells(ta, a) if ta else ["-"] * 5), *(_short(tw, w) if tw else ["-"] * 3))
    table.add_row("total", format_bytes(a.totals.bytes), _gflop(a.totals.flops), f"{a.totals.launches:,}",
                  f"{a.totals.syncs:,}", "100%", format_bytes(w.totals.bytes), f"{w.totals.launches:,}", "100%")
    console.print(table)
    console.print()
    console.print("layers    (groups of identical decoder layers, as exported)")
    for group in est.layer_groups():
        t = group.totals
        nbytes = sum(x.bytes for x in t.values())
        launches = sum(x.launches for x in t.values())
        console.print(f"  {_layer_span(group.layers)}: {group.forms or 'layer'}: {format_bytes(nbytes)} and "
                      f"{launches:,} launches per layer")
    for f in _moe_lines(est):
        console.print(f"  {f}")
    console.print()
    for label, step in (("as exported", a), ("with fixes ", w)):
        console.print(f"{label}  {format_rate(step.tokens_per_s_expected)} tokens/s expected "
                      f"({format_ms(step.expected_s * 1e3)} per step); ceiling {format_rate(step.tokens_per_s_ceiling)}"
                      f" tokens/s ({format_bytes(step.totals.bytes)} at {format_bandwidth(step.step_bandwidth)}"
                      f"{', served from the last-level cache' if step.in_cache else ''})")
    console.print("largest costs")
    for i, c in enumerate(est.largest_costs(3), 1):
        console.print(f"  {i}. {c.words} ({c.share:.0%} of the step)")
    savings = _savings(est)
    if savings:
        console.print("what each fix saves (alone)")
        for kind, scope, saving in savings:
            console.print(f"  {kind:<13} {scope:>20}  {saving.ms_per_token:.3g} ms per token "
                          f"({saving.share:.0%} of the step)")
    if est.uncounted:
        console.print("not counted")
        for u in est.uncounted:
            console.print(f"  {u.component}: {u.what}")
    for line in deployment_lines(inputs):
        console.print(line)
    console.print(f"Every figure is an estimate for {d.name}, never a measurement.")
    from ortgate.report import unforgeable

    return unforgeable(buffer.getvalue())


def deployment_lines(inputs) -> list[str]:
    """Memory fit, the prompt phase and the batch sweep, in plain lines (what `ortgate estimate` adds)."""
    from ortgate.cost.estimate import format_ms, format_rate
    from ortgate.cost.memory import format_gib
    from ortgate.cost.sweep import batch_sweep, moe_crossover

    est = inputs.estimate
    out: list[str] = []
    mem = inputs.memory
    if mem is not None:
        out.append("")
        cap = mem.capacity
        if cap:
            share = inputs.throughput.memory_share if inputs.throughput is not None else 0.9
            verdict = ("does not fit" if mem.total > cap else
                       f"above the {share:.0%} warning share" if mem.share and mem.share > share else "fits")
            out.append(f"memory    {format_gib(mem.total)} of {format_gib(cap)} on {mem.device.name} "
                       f"({mem.share:.0%}, memory figure {mem.device.memory_gib.confidence}): {verdict}")
        else:
            out.append(f"memory    {format_gib(mem.total)}; {mem.device.name} has no memory figure "
                       "(calibration.memory_gib gives one): fit not judged")
        for p in mem.parts:
            out.append(f"  {p.name.replace('_', ' '):<13} {format_gib(p.bytes):>11}  {p.how}")
        if mem.at_full_context:
            fits = mem.length_fitting(inputs.throughput.memory_share if inputs.throughput is not None else 0.9)
            said = ("; it fits at this batch" if fits and fits >= mem.kv_length else
                    f"; a max_length of {fits:,} fits" if fits else "; no max_length fits")
            out.append(f"  search.max_length {mem.kv_length:,} is the model's whole context, pre-allocated for every "
                       f"sequence: {format_gib(mem.part('kv_cache'))} (onnxruntime-genai#2251){said}")
        for u in mem.uncounted[:4]:
            out.append(f"  not sized: {u}")
        out.append("  not counted (ortgate cannot see them): " + "; ".join(mem.not_counted))
    pre = inputs.prefill
    if pre is not None:
        s = pre.setup.shape
        step = pre.as_exported
        out.append("")
        out.append(f"prefill   {s.new_tokens:,} prompt tokens x batch {s.batch}: time to first token "
                   f"{format_ms(step.expected_s * 1e3)} expected (ceiling {format_ms(step.ceiling_s * 1e3)}), "
                   f"beside {format_ms(est.as_exported.expected_s * 1e3)} per decode step")
        read = [f.experts_read for f in pre.model.moe_forms if f.experts_read is not None]
        if read:
            out.append(f"  MoE: {sum(read) / len(read):.1f} experts read per layer over the prompt")
    if inputs.batch_sizes:
        points = batch_sweep(inputs.executed, est.setup, list(inputs.batch_sizes))
        out.append("")
        out.append(f"{'batch':>7} {'experts read':>12} {'bytes/step':>11} {'ms/step':>9} {'tok/s/seq':>10} "
                   f"{'tok/s/device':>13} {'memory':>12}  bound (MoE)")
        from ortgate.cost.estimate import format_bytes

        for pt in points:
            experts = f"{pt.experts_read:.1f}" if pt.experts_read is not None else "-"
            at = inputs.memory_at(pt.batch)
            memory = format_gib(at.total) if at is not None else "-"
            out.append(f"{pt.batch:>7,} {experts:>12} {format_bytes(pt.bytes):>11} {pt.step_s * 1e3:>9.3f} "
                       f"{format_rate(pt.tokens_per_s_sequence):>10} {format_rate(pt.tokens_per_s_device):>13} "
                       f"{memory:>12}  {pt.bound}" + (f" ({pt.moe_bound})" if pt.moe_bound else ""))
        if est.model.moe_forms:
            cross = moe_crossover(inputs.executed, est.setup)
            out.append("  the MoE layers stop being bandwidth-bound at batch "
                       + (f"{cross:,}" if cross else "beyond 65,536 (not found)"))
    return out


def _figures_line(d, dtypes: Sequence[str] = ()) -> str:
    from ortgate.cost.estimate import format_bandwidth

    parts = [f"bandwidth {format_bandwidth(d.bandwidth or 0)} ({d.bandwidth_gb_s.confidence})"]
    for dtype in (*dtypes, "bfloat16", "float16", "float"):
        figure = d.tflops.get(dtype)
        if figure is not None and figure.value is not None:
            parts.append(f"{dtype} {figure.value:g} TFLOP/s ({figure.confidence})")
            break
    parts.append(f"{d.kernel_us.value:g} us per kernel ({d.kernel_us.confidence})")
    if d.is_gpu_like and d.graph_kernel_us.value is not None:
        parts.append(f"{d.graph_kernel_us.value:g} us with CUDA graph ({d.graph_kernel_us.confidence})")
    if d.memory_efficiency.value is not None:
        parts.append(f"memory efficiency {d.memory_efficiency.value:g} ({d.memory_efficiency.confidence})")
    if d.cache_bytes.value:
        parts.append(f"last-level cache {d.cache_bytes.value / 2**20:,.0f} MiB at "
                     f"{format_bandwidth((d.cache_bandwidth_gb_s.value or 0) * 1e9)}")
    return ", ".join(parts)


def _cells(t, step) -> list[str]:
    from ortgate.cost.estimate import format_bytes

    share = step.component_time_s(_name(step, t)) / step.expected_s if step.expected_s else 0.0
    return [format_bytes(t.bytes), _gflop(t.flops), f"{t.launches:,}", f"{t.syncs:,}", f"{share:.0%}"]


def _gflop(flops: float) -> str:
    """GFLOP with three significant digits below 100 (a tiny model's 0.000262, never a row of 0.0), whole above."""
    import math

    gflop = flops / 1e9
    if gflop <= 0:
        return "0"
    if gflop >= 100:
        return f"{gflop:,.0f}"
    return f"{gflop:.{max(0, 2 - math.floor(math.log10(gflop)))}f}"


def _short(t, step) -> list[str]:
    from ortgate.cost.estimate import format_bytes

    share = step.component_time_s(_name(step, t)) / step.expected_s if step.expected_s else 0.0
    return [format_bytes(t.bytes), f"{t.launches:,}", f"{share:.0%}"]


def _name(step, totals) -> str:
    return next(name for name, t in step.components.items() if t is totals)


def _layer_span(layers: list[int]) -> str:
    if len(layers) == 1:
        return f"layer {layers[0]}"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}-{layers[-1]} ({len(layers)})"
    shown = ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")
    return f"layers {shown} ({len(layers)})"


def _moe_lines(est) -> list[str]:
    from collections import Counter

    forms = Counter((f.form, f.experts, f.top_k, None if f.experts_read is None else round(f.experts_read, 1))
                    for f in est.model.moe_forms)
    out = []
    for (form, experts, k, read), n in sorted(forms.items(), key=lambda kv: -kv[1]):
        out.append(f"MoE: {n} layer{'s' if n != 1 else ''} {form}, {experts} experts, top-{k}: "
                   f"{read if read is not None else '?'} experts read per step")
    return out


def _repair_scope(kind: str, repairs: list) -> str:
    if kind == "cuda_graph":
        return "model-wide"
    inside = len({r.layer for r in repairs if r.layer is not None})
    outside = sum(1 for r in repairs if r.layer is None)
    parts = [f"{inside} layer{'s' if inside != 1 else ''}"] if inside else []
    return ", ".join(parts + ([f"{outside} outside"] if outside else []))


def _savings(est):
    """(kind, where it repairs: layers, outside the layers, or model-wide (CUDA graph), saving), largest first."""
    from collections import OrderedDict

    kinds: OrderedDict[str, list] = OrderedDict()
    for r in est.repairs:
        kinds.setdefault(r.kind, []).append(r)
    out = []
    for kind, repairs in kinds.items():
        saving = est.saving(repairs)
        if saving.ms_per_token > 0:
            out.append((kind, _repair_scope(kind, repairs), saving))
    out.sort(key=lambda x: -x[2].ms_per_token)
    return out


def _one_line_console():
    from rich.console import Console

    from ortgate.report import clean

    class OneLineConsole(Console):
        """Each printed text is one line whatever the model's paths and names hold (ortgate.report.clean); nothing
        is read as markup."""

        def print(self, *objects, **kwargs) -> None:
            super().print(*(clean(o) if isinstance(o, str) else o for o in objects), **kwargs)

    return OneLineConsole


def _OneLineConsole(**kwargs):
    return _one_line_console()(**kwargs)


# ---- json ---------------------------------------------------------------------------------------------------------


def render_json(est, inputs, compared=None) -> str:
    data = est.to_dict()
    if compared is not None:
        data["comparison"] = {"base": compared[0], **compared[1].to_dict()}
    data["model"] = inputs.executed.path
    data["layer_groups"] = [
        {"layers": g.layers, "form": g.forms,
         "bytes_per_layer": round(sum(t.bytes for t in g.totals.values())),
         "kernel_launches_per_layer": sum(t.launches for t in g.totals.values())}
        for g in est.layer_groups()]
    data.update(deployment_data(inputs))
    data["fix_savings"] = [{"repair": kind, "layers": n, "ms_per_token": round(s.ms_per_token, 4),
                            "share_of_step": round(s.share, 4)} for kind, n, s in _savings(est)]
    return json.dumps(data, allow_nan=False, indent=2, sort_keys=True) + "\n"


def deployment_data(inputs) -> dict:
    from ortgate.cost.sweep import batch_sweep, moe_crossover

    est = inputs.estimate
    out: dict = {}
    mem = inputs.memory
    if mem is not None:
        out["memory"] = mem.to_dict()
    pre = inputs.prefill
    if pre is not None:
        out["prefill"] = {"estimate": True, "prompt_length": pre.setup.shape.new_tokens,
                          "batch_size": pre.setup.shape.batch,
                          "ms_to_first_token_expected": round(pre.as_exported.expected_s * 1e3, 6),
                          "ms_to_first_token_ceiling": round(pre.as_exported.ceiling_s * 1e3, 6),
                          "bytes": round(pre.as_exported.totals.bytes), "flops": round(pre.as_exported.totals.flops),
                          "experts_read": [None if f.experts_read is None else round(f.experts_read, 2)
                                           for f in pre.model.moe_forms]}
    if inputs.batch_sizes:
        out["batches"] = []
        for p in batch_sweep(inputs.executed, est.setup, list(inputs.batch_sizes)):
            at = inputs.memory_at(p.batch)
            out["batches"].append({**p.to_dict(), "memory_bytes": None if at is None else round(at.total),
                                   "share_of_device": None if at is None or at.share is None else round(at.share, 4)})
        out["moe_compute_bound_from_batch"] = moe_crossover(inputs.executed, est.setup) if est.model.moe_forms \
            else None
    return out


def devices_text() -> str:
    from ortgate.knowledge.devices import device_names, find_device

    rows = [("device", "bandwidth", "bf16/fp16", "fp32", "memory", "label (confidence of the bandwidth)")]
    for name in device_names():
        d = find_device(name)
        assert d is not None
        bw = f"{d.bandwidth_gb_s.value:,.0f} GB/s" if d.bandwidth_gb_s.value else "probe"
        half = d.tflops.get("bfloat16") or d.tflops.get("float16")
        full = d.tflops.get("float")
        rows.append((name, bw, f"{half.value:g} TF" if half and half.value else "-",
                     f"{full.value:g} TF" if full and full.value else ("probe" if full else "-"),
                     f"{d.memory_gib.value:g} GiB" if d.memory_gib.value else "-",
                     f"{d.label} ({d.bandwidth_gb_s.confidence})"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    return "".join(f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}  "
                   f"{r[4]:>{widths[4]}}  {r[5]}\n" for r in rows)


def devices_json() -> str:
    from ortgate.knowledge.devices import device_names, find_device

    out = {}
    for name in device_names():
        d = find_device(name)
        assert d is not None
        out[name] = {"label": d.label, "kind": d.kind, "match": list(d.match), "figures": d.figures()}
    return json.dumps(out, allow_nan=False, indent=2, sort_keys=True) + "\n"
