"""Markdown job summary (for $GITHUB_STEP_SUMMARY or a pull-request comment).

Verdict and counts, what to fix first (errors before warnings, then the rule whose fix clears the most
findings), a table of findings by decoder layer (layers with the same findings share a row), the findings with
identical ones across layers as one row (report.groups; `expand` lists each), and the suppressed ones with
their justification. Deterministic, and bounded well below GitHub's 1 MiB summary limit.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Severity
from ortgate.report import clean, display_path, layer_label, target
from ortgate.report.groups import FindingGroup, group_findings, ranges

MAX_FIX_FIRST = 10
MAX_ROWS = 300


def render(result: LintResult, *, expand: bool = False) -> str:
    v = result.verdict
    active = [f for f in result.findings if f.suppressed is None]
    suppressed = [f for f in result.findings if f.suppressed is not None]
    out: list[str] = []
    out.append(f"## {'✅' if v.passed else '❌'} ortgate: {'PASS' if v.passed else 'FAIL'}")
    out.append("")
    counts = ", ".join(_bold_if(n, _plural(n, label)) for label, n in v.counts.items())
    extra = f" · {v.suppressed} suppressed" if v.suppressed else ""
    out.append(f"{counts}{extra} · fails on `{v.fail_on.label}` and above")
    out.append("")
    out += _inputs_table(result.summary)
    out += _not_checked(result.summary)
    if result.comparison is not None:
        from ortgate.report.comparison import markdown_lines

        out += markdown_lines(result.comparison)
    if active:
        out += _fix_first(active, result.summary.get("estimate"))
        out += _by_layer(active)
        out += _findings_table(active, expand)
    else:
        out += ["No findings." if not suppressed else "No active findings.", ""]
    if suppressed:
        out += _suppressed_table(suppressed)
    return "\n".join(out).rstrip("\n") + "\n"


def _not_checked(summary: dict) -> list[str]:
    gaps = summary.get("not_checked") or []
    if not gaps:
        return []
    from ortgate.engine.pipeline import not_checked_text

    return [f"**Not checked:** {_cell(not_checked_text(gap))}  " for gap in gaps] + [""]


def _inputs_table(summary: dict) -> list[str]:
    """One row per model linted (a multi-model report lists each under the shared policy)."""
    models = summary.get("models") or [summary]
    rows = [_inputs_row(s) for s in models]
    width = max(len(header) for header, _ in rows)
    header = next(h for h, _ in rows if len(h) == width)
    lines = [_row(header), _row(["---"] * (len(header) - 2) + ["---:", "---:"])]
    for h, row in rows:
        if len(h) < width:  # a model without an optimized dump beside one with
            row.insert(1, "—")
        lines.append(_row(row))
    lines.append("")
    from ortgate.engine.pricing import headline

    for s in models:
        if s.get("estimate"):
            which = f"{_code(display_path(s['model']))} on " if len(models) > 1 else ""
            lines += [f"Estimate for {which}{_cell(headline(s['estimate']))}.", ""]
    return lines


def _inputs_row(summary: dict) -> tuple[list[str], list[str]]:
    header = ["Model"]
    row = [_code(display_path(summary["model"]))]
    if summary.get("optimized"):
        header.append("Optimized dump")
        row.append(_code(display_path(summary["optimized"])))
    header.append("Policy")
    row.append(_code(summary["policy"]) if summary.get("policy") else "none")
    header += ["Provider", "Nodes", "Layers"]
    row += [_cell(summary.get("provider") or "—"), str(summary.get("nodes", "—")),
            str(summary["layers"]) if summary.get("layers") is not None else "—"]
    return header, row


def _fix_first(active: list[Finding], estimate: dict | None = None) -> list[str]:
    by_rule: dict[str, list[Finding]] = defaultdict(list)
    for f in active:
        by_rule[f.code].append(f)
    savings = (estimate or {}).get("by_rule", {})

    def saves(code: str) -> float:
        return float(savings.get(code, {}).get("ms_per_token", 0.0))

    if estimate and savings:
        ranked = sorted(by_rule.values(), key=lambda fs: (not _blocks(fs), -saves(fs[0].code),
                                                          -max(f.severity for f in fs), -len(fs), fs[0].code))
        order = (f"Largest estimated saving on {estimate['device']} first (what fixing every finding of the rule "
                 "saves per token), then the most severe.")
    else:
        ranked = sorted(by_rule.values(), key=lambda fs: (not _blocks(fs), -max(f.severity for f in fs), -len(fs),
                                                          fs[0].code))
        order = "Most severe first, then the rule whose fix clears the most findings."
    if any(_blocks(fs) for fs in ranked):
        order = f"What stops the model from loading comes first. {order}"
    header = ["#", "Rule", "Severity", "Findings", "Where"] + (["Saves (estimate)"] if savings else []) + ["Fix"]
    out = ["### What to fix first", "", order, "", _row(header), _row(["---:", "---", "---", "---:", "---"]
                                                                      + (["---:"] if savings else []) + ["---"])]
    for i, fs in enumerate(ranked[:MAX_FIX_FIRST], start=1):
        first = fs[0]
        fix = next((f.fix for f in fs if f.fix), None) or "—"
        cells = [str(i), f"{_code(first.code)} {first.rule}", max(f.severity for f in fs).label, str(len(fs)),
                 _where_summary(fs)]
        if savings:
            saving = savings.get(first.code)
            cells.append(f"{saving['ms_per_token']:.3g} ms/token ({saving['share_of_step']:.0%})" if saving else "—")
        out.append(_row(cells + [_cell(fix)]))
    if len(ranked) > MAX_FIX_FIRST:
        out.append("")
        out.append(f"…and {len(ranked) - MAX_FIX_FIRST} more rules below.")
    out.append("")
    return out


def _blocks(findings: list[Finding]) -> bool:
    """Whether a rule's findings include one that stops the model from loading: no cap may hide it."""
    return any(f.stops_session for f in findings)


def _by_layer(active: list[Finding]) -> list[str]:
    groups: dict[int | None, list[Finding]] = defaultdict(list)
    for f in active:
        groups[f.layer].append(f)
    rows: list[tuple[list[int | None], tuple]] = []  # layers sharing one row, and the row's cells
    for layer in sorted(groups, key=lambda layer: (layer is None, layer if layer is not None else 0)):
        fs = groups[layer]
        sev = Counter(f.severity for f in fs)
        rules = Counter((f.code, f.rule) for f in fs)
        names = ", ".join(f"{_code(code)} {name}" + (f" ×{n}" if n > 1 else "")
                          for (code, name), n in sorted(rules.items()))
        cells = (str(sev[Severity.ERROR]), str(sev[Severity.WARNING]), str(sev[Severity.INFO]), names)
        previous = rows[-1] if rows else None
        if (layer is not None and previous is not None and previous[1] == cells and previous[0][-1] is not None
                and previous[0][-1] == layer - 1):
            previous[0].append(layer)
        else:
            rows.append(([layer], cells))
    out = ["### Findings by layer", "",
           _row(["Layer", "Errors", "Warnings", "Infos", "Rules"]),
           _row(["---", "---:", "---:", "---:", "---"])]
    for layers, cells in rows:
        numbered = [n for n in layers if n is not None]  # only numbered layers merge into a range
        label = layer_label(layers[0]) if len(layers) == 1 else f"layers {ranges(numbered, '–')} ({len(layers)})"
        note = " each" if len(layers) > 1 else ""
        out.append(_row([label, *(c + note if c != "0" else c for c in cells[:3]), cells[3]]))
    out.append("")
    return out


def _findings_table(active: list[Finding], expand: bool) -> list[str]:
    ordered = sorted(active, key=lambda f: (not f.stops_session, -f.severity, f.sort_key()))
    groups = [FindingGroup([f]) for f in ordered] if expand else group_findings(ordered)
    summary = _plural(len(active), "finding")
    if len(groups) < len(active):
        summary += f" as {_plural(len(groups), 'row')} (identical findings across layers share one)"
    out = [f"<details><summary>All {summary}</summary>", "",
           _row(["Severity", "Rule", "Layer", "File", "Where", "Message"]),
           _row(["---", "---", "---", "---", "---", "---"])]
    for g in groups[:MAX_ROWS]:
        f = g.first
        out.append(_row([f.severity.label, f"{_code(f.code)} {f.rule}", _group_layers(g), _file(f),
                         _code(g.target) if g.target else "—", _cell(g.message)]))
    if len(groups) > MAX_ROWS:
        out += ["", f"…and {len(groups) - MAX_ROWS} more (the SARIF and JSON reports list every finding)."]
    out += ["", "</details>", ""]
    return out


def _group_layers(group: FindingGroup) -> str:
    if group.count == 1:
        return layer_label(group.first.layer)
    return _where_summary(group.findings) + f" ({group.count})"


def _suppressed_table(suppressed: list[Finding]) -> list[str]:
    out = [f"<details><summary>{_plural(len(suppressed), 'suppressed finding')}</summary>", "",
           _row(["Rule", "Layer", "Where", "By", "Justification"]),
           _row(["---", "---", "---", "---", "---"])]
    for f in suppressed[:MAX_ROWS]:
        s = f.suppressed
        assert s is not None
        by = s.kind
        if s.location is not None:
            by += f" ({_file_line(s.location.file, s.location.line)})"
        out.append(_row([f"{_code(f.code)} {f.rule}", layer_label(f.layer),
                         _code(target(f)) if target(f) else _file(f), _cell(by), _cell(s.justification)]))
    if len(suppressed) > MAX_ROWS:
        out += ["", f"…and {len(suppressed) - MAX_ROWS} more."]
    out += ["", "</details>", ""]
    return out


def _where_summary(findings: list[Finding]) -> str:
    layers = sorted({f.layer for f in findings if f.layer is not None})
    parts = []
    if layers:
        parts.append(("layer " if len(layers) == 1 else "layers ") + ranges(layers, "–"))
    if any(f.layer is None for f in findings):
        parts.append("model / config")
    return "; ".join(parts)


def _file(f: Finding) -> str:
    if f.location.label:
        return _code(f.location.label)
    return _code(_file_line(f.location.file, f.location.line))


def _file_line(file: str, line: int | None) -> str:
    return f"{display_path(file)}:{line}" if line else display_path(file)


def _code(text: str) -> str:
    text = _one_cell(text)
    fence = "``" if "`" in text else "`"
    if "``" in text:  # no fence of backticks holds it: shown as text, its markup escaped
        return _cell(text)
    pad = " " if fence == "``" else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _one_cell(text: object) -> str:
    """One table cell's text: printable, on one line, its `|` escaped (a code span shows HTML as written)."""
    return " ".join(clean(text).split()).replace("|", "\\|")


def _cell(text: object) -> str:
    """A table cell of text: an HTML tag in it (one that could close the report's <details>) shown as text."""
    return _one_cell(text).replace("<", "&lt;")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _bold_if(n: int, text: str) -> str:
    return f"**{text}**" if n else text


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"
