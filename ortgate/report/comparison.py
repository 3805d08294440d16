"""The comparison with a base model (`--compare`), formatted: plain lines for the text report, a markdown section
with a table of the findings that appeared and disappeared and a Mermaid `xychart-beta` chart of the step time per
component, base beside the change (GitHub renders Mermaid in Markdown; the table beside it carries the numbers for
a viewer that does not). Formats only: the gate decided already."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortgate.cost.estimate import format_bytes, format_rate
from ortgate.report import clean, display_path, layer_label
from ortgate.report.groups import FindingGroup, group_findings

if TYPE_CHECKING:
    from ortgate.cost.compare import EstimateComparison, PartDelta
    from ortgate.engine.compare import Comparison, Explanation

MAX_LISTED = 50  # findings listed per side in the markdown section
CHART_KIND = "xychart-beta"
NOT_PRICED = "not compared: no device is priced (name one in the policy's throughput.device)"


def _ms(ms: float) -> str:
    """'0.148 ms', '12.4 ms', '18.9 us': three significant digits."""
    return f"{ms:.3g} ms" if abs(ms) >= 0.1 else f"{ms * 1e3:.3g} us"


def _gib(n: float) -> str:
    from ortgate.cost.memory import format_gib

    return format_gib(n)


def _signed_ms(ms: float) -> str:
    return ("+" if ms > 0 else "-" if ms < 0 else "±") + _ms(abs(ms))


def _change(change: float | None) -> str:
    return "n/a" if change is None else f"{change:+.1%}"


def _relative(base: float, model: float) -> str:
    return _change(model / base - 1.0) if base else ("±0" if not model else "new")


def headline(est: EstimateComparison) -> str:
    """'cpu: 6,757 -> 35,571 tokens/s as exported (+426.4%), 0.148 ms -> 0.0281 ms per step; with every fix
    26,298 -> 35,571'."""
    b, m = est.base, est.model
    return (f"{est.device}: {format_rate(b.tokens_per_s)} -> {format_rate(m.tokens_per_s)} tokens/s as exported "
            f"({_change(est.tokens_change)}), {_ms(b.ms_per_step)} -> {_ms(m.ms_per_step)} per step; with every fix "
            f"{format_rate(est.base_fixed.tokens_per_s)} -> {format_rate(est.model_fixed.tokens_per_s)}, an estimate")


def _explained(e: Explanation) -> str:
    layers = f" in {'layer' if len(e.layers) == 1 else 'layers'} {_span(e.layers)}" if e.layers else ""
    verb = "appeared" if e.change == "appeared" else "disappeared"
    effect = "cost" if e.change == "appeared" else "had cost"
    return (f"{e.code} {e.rule} {verb} ({e.findings} finding{'s' if e.findings != 1 else ''}{layers}): "
            f"{effect} ~{_ms(e.ms_per_token)} per token")


def _span(layers: tuple[int, ...]) -> str:
    if len(layers) > 1 and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}-{layers[-1]}"
    return ", ".join(map(str, layers[:8])) + (", ..." if len(layers) > 8 else "")


def _group_line(g: FindingGroup) -> str:
    return "  ".join(x for x in (f"{g.severity.label:<7} {g.first.code} {g.first.rule}", g.where(), g.target) if x)


# ---- text -----------------------------------------------------------------------------------------------------------


def text_lines(comparison: Comparison) -> list[str]:
    c = comparison
    out = [(f"compared with {clean(c.base_name)}: {len(c.appeared)} findings appeared, {len(c.disappeared)} "
            f"disappeared, {len(c.unchanged)} unchanged")]
    for label, findings in (("appeared", c.appeared), ("disappeared", c.disappeared)):
        groups = group_findings(findings)
        for g in groups[:MAX_LISTED]:
            out.append(f"  {label:<11} {clean(_group_line(g))}")
        if len(groups) > MAX_LISTED:
            out.append(f"  ... and {len(groups) - MAX_LISTED} more {label}")
    if c.estimate is not None:
        out += estimate_text_lines(c.estimate)
    else:
        out.append(f"  estimate  {NOT_PRICED}")
    for e in c.explained_by[:8]:
        out.append(f"  explains  {_explained(e)}")
    return out


def estimate_text_lines(est: EstimateComparison) -> list[str]:
    """The estimates side by side (`ortgate estimate --compare` prints these)."""
    b, m = est.base, est.model
    first = (f"  estimate  {est.device}: {format_rate(b.tokens_per_s)} -> {format_rate(m.tokens_per_s)} tokens/s as "
             f"exported ({_change(est.tokens_change)}), {_ms(b.ms_per_step)} -> {_ms(m.ms_per_step)} per step")
    fixed = (f"            with every fix {format_rate(est.base_fixed.tokens_per_s)} -> "
             f"{format_rate(est.model_fixed.tokens_per_s)} tokens/s; every figure an estimate")
    out = [first, fixed]
    if est.memory is not None:
        out.append(f"    memory     {_gib(est.memory[0]):>9} -> {_gib(est.memory[1]):>9} "
                   f"({_relative(est.memory[0], est.memory[1])})")
    for part in est.components:
        out.append(f"    {part.name:<10} {_ms(part.base_ms):>9} -> {_ms(part.model_ms):>9} "
                   f"({_signed_ms(part.delta_ms)}), {format_bytes(part.base_bytes)} -> "
                   f"{format_bytes(part.model_bytes)}, {part.base_launches:,} -> {part.model_launches:,} launches")
    for group in est.layer_groups:
        out.append(f"    {group.name}: {_ms(group.base_ms)} -> {_ms(group.model_ms)} per layer "
                   f"({_signed_ms(group.delta_ms)}; {group.base_form or 'layer'} -> {group.model_form or 'layer'})")
    if est.layers_differ:
        out.append(f"    layers: {est.layers_differ}")
    return out


# ---- markdown -------------------------------------------------------------------------------------------------------


def markdown_lines(comparison: Comparison) -> list[str]:
    from ortgate.report.markdown import _cell, _code, _row

    c = comparison
    out = [f"### Compared with {_code(display_path(c.base_name) if c.base_label is None else c.base_name)}", "",
           f"{len(c.appeared)} findings appeared, {len(c.disappeared)} disappeared, {len(c.unchanged)} unchanged.", ""]
    est = c.estimate
    if est is not None:
        out += [f"Estimate on {_cell(headline(est))}.", ""]
        out += [_row(["", "Base", "This change", "Change"]), _row(["---", "---:", "---:", "---:"])]
        b, m = est.base, est.model
        out.append(_row(["tokens/s (expected)", format_rate(b.tokens_per_s), format_rate(m.tokens_per_s),
                         _change(est.tokens_change)]))
        out.append(_row(["step time", _ms(b.ms_per_step), _ms(m.ms_per_step), _relative(b.ms_per_step, m.ms_per_step)]))
        out.append(_row(["bytes per step", format_bytes(b.bytes), format_bytes(m.bytes), _relative(b.bytes, m.bytes)]))
        out.append(_row(["kernel launches", f"{b.launches:,}", f"{m.launches:,}", _relative(b.launches, m.launches)]))
        if est.memory is not None:
            out.append(_row(["memory", _gib(est.memory[0]), _gib(est.memory[1]),
                             _relative(est.memory[0], est.memory[1])]))
        out.append(_row(["tokens/s with every fix", format_rate(est.base_fixed.tokens_per_s),
                         format_rate(est.model_fixed.tokens_per_s), _relative(est.base_fixed.tokens_per_s or 0.0,
                                                                              est.model_fixed.tokens_per_s or 0.0)]))
        out.append("")
        parts, what = (list(est.layer_groups), "layer group (per layer)") if len(est.components) < 2 and \
            est.layer_groups else (list(est.components), "component")
        out += ["```mermaid", *mermaid_chart(parts, est.device, what), "```", ""]
        out += [_row([what.capitalize(), "Base", "This change", "Change", "Bytes", "Launches"]),
                _row(["---", "---:", "---:", "---:", "---:", "---:"])]
        for part in list(est.components) + list(est.layer_groups):
            name = part.name if not part.layers else f"{part.name} (per layer)"
            out.append(_row([_cell(name), _ms(part.base_ms), _ms(part.model_ms), _signed_ms(part.delta_ms),
                             f"{format_bytes(part.base_bytes)} → {format_bytes(part.model_bytes)}",
                             f"{part.base_launches:,} → {part.model_launches:,}"]))
        out.append("")
        if est.layers_differ:
            out += [f"Layers not compared: {_cell(est.layers_differ)}.", ""]
    if est is None:
        out += [f"Estimates {NOT_PRICED}.", ""]
    if c.explained_by:
        out += ["What explains the change (each finding's price on the device, an estimate):", ""]
        out += [f"- {_cell(_explained(e))}" for e in c.explained_by[:10]] + [""]
    for label, findings in (("appeared", c.appeared), ("disappeared", c.disappeared)):
        if not findings:
            continue
        out += [_row([f"Findings that {label}", "Rule", "Layer", "Where", "Message"]),
                _row(["---", "---", "---", "---", "---"])]
        groups = group_findings(findings)
        for g in groups[:MAX_LISTED]:
            f = g.first
            message = g.message
            out.append(_row([f.severity.label, f"{_code(f.code)} {f.rule}",
                             _cell(g.where() if g.count > 1 or f.layer is None else layer_label(f.layer)),
                             _code(g.target) if g.target else _code(display_path(f.location.file)),
                             _cell(message[:300] + ("…" if len(message) > 300 else ""))]))
        if len(groups) > MAX_LISTED:
            out += ["", f"…and {len(groups) - MAX_LISTED} more (the JSON report lists every finding)."]
        out.append("")
    return out


def mermaid_chart(parts: list[PartDelta], device: str, what: str = "component") -> list[str]:
    """A Mermaid xychart-beta block's lines: one bar per part, the base's above the change's (the bars of two series
    of xychart-beta overlap and it draws no legend, so each bar is labelled with its side; horizontal, so that the
    labels have a row each)."""
    values = [v for p in parts for v in (p.base_ms, p.model_ms)]
    micro = max(values, default=0.0) < 0.1
    scale, unit = (1e3, "us") if micro else (1.0, "ms")
    labels = [f"{_label(p)} {side}" for p in parts for side in ("base", "change")]
    numbers = [round(v * scale, 3) for v in values]
    top = _nice_top(max(numbers, default=0.0))
    return [
        f"{CHART_KIND} horizontal",
        f'    title "Step time per {_quoted(what)}, base and change ({unit}, estimated on {_quoted(device)})"',
        "    x-axis [" + ", ".join(f'"{_quoted(label)}"' for label in labels) + "]",
        f'    y-axis "{unit} per step" 0 --> {top:g}',
        "    bar [" + ", ".join(f"{n:g}" for n in numbers) + "]",
    ]


def _label(part: PartDelta) -> str:
    return part.name


def _quoted(text: str) -> str:
    """Text inside a Mermaid double-quoted string: no quote, bracket or newline can end it early."""
    return " ".join(clean(text).replace('"', "'").replace("[", "(").replace("]", ")").split())


def _nice_top(value: float) -> float:
    """An axis end a little above `value`: 1, 2 or 5 times a power of ten."""
    import math

    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value * 1.05:
            return float(step * power)
    return float(10 * power)
