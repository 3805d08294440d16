"""Human report: one entry per group of identical findings (report.groups), configuration first, each fix once,
wrapped to the width, then a per-rule summary table and the verdict.

By default a group of identical findings across decoder layers is one entry ("layers 0-47 (48)") and a long
message or fix is cut at a few lines; `expand` lists every finding in full. The JSON and SARIF reports always
hold every finding whole.
"""

from __future__ import annotations

import io
import re
import textwrap
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ortgate.engine.pipeline import LintResult
from ortgate.engine.pricing import RuleSaving
from ortgate.findings import Finding, Severity
from ortgate.report import clean, display_path, group_price_text, price_totals, time_text, unforgeable
from ortgate.report.groups import FindingGroup, group_findings, where

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}
DEFAULT_WIDTH = 120  # when the report goes to a file or a CI log, not a terminal
MIN_WIDTH = 60
INDENT = "    "
# Lines of a grouped entry's message (the first entry of a rule, then later ones) and of a fix; `expand` shows
# them whole, and the JSON and SARIF reports always do.
MAX_MESSAGE_LINES = 2
MAX_REPEAT_MESSAGE_LINES = 1
MAX_FIX_LINES = 1


@dataclass(frozen=True)
class TextOptions:
    """How the text report is laid out: its width, colour and whether every finding is listed in full."""

    width: int = DEFAULT_WIDTH
    color: bool = False  # rich styles and a boxed table: a terminal
    expand: bool = False  # every finding on its own, messages whole


def render(result: LintResult, options: TextOptions | None = None) -> str:
    options = options or TextOptions()
    text = None if options.color else _plain_text(result, options)
    if text is None:
        text = _rich_text(result, options)
    return unforgeable("".join(line.rstrip() + "\n" for line in text.splitlines()))  # rich pads cells


def _plain_text(result: LintResult, options: TextOptions) -> str | None:
    """The uncoloured report without rich, or None where rich would lay out a line otherwise than plainly."""
    console = _PlainConsole(max(options.width, MIN_WIDTH))
    try:
        write(console, result, options, _PLAIN)
    except _NotPlain:
        return None
    return "".join(line + "\n" for line in console.lines)


def _rich_text(result: LintResult, options: TextOptions) -> str:
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=options.color, no_color=not options.color,
                      width=max(options.width, MIN_WIDTH), highlight=False, soft_wrap=True, emoji=False, markup=False)
    write(console, result, options, _Kit(Text, Table, box.SIMPLE_HEAD))
    return buffer.getvalue()


@dataclass(frozen=True)
class _Kit:
    """What the report is drawn with: rich's Text and Table (a terminal, colour), or the plain stand-ins."""

    Text: Any
    Table: Any
    head_box: Any = None


def write(console: Any, result: LintResult, options: TextOptions, kit: _Kit) -> None:
    Text = kit.Text  # rich's class, or its plain stand-in
    active = [f for f in result.findings if f.suppressed is None]
    width = max(options.width, MIN_WIDTH)
    shown_fixes: set[str] = set()
    shown_rules: set[str] = set()
    estimate = result.summary.estimate
    table = _rule_table(kit, active, options, estimate.by_rule if estimate is not None else {})
    if kit is _PLAIN and active:
        table.lines(width)  # one rich would fold raises _NotPlain now, before the entries are laid out in vain
    for file, findings in _by_file(active):
        console.print(Text(file, style="bold underline"))
        groups = [FindingGroup([f]) for f in findings] if options.expand else group_findings(findings)
        for group in sorted(groups, key=_group_order):
            limit = None if options.expand else (
                MAX_REPEAT_MESSAGE_LINES if group.first.code in shown_rules else MAX_MESSAGE_LINES)
            _write_group(console, kit, group, width, options, message_lines=limit,
                         show_fix=bool(group.fix) and group.fix not in shown_fixes)
            shown_rules.add(group.first.code)
            if group.fix:
                shown_fixes.add(group.fix)
    if active:
        console.print()
        console.print(table)
    if result.comparison is not None:
        from ortgate.report.comparison import text_lines

        for line in text_lines(result.comparison):
            console.print(Text(line))
    _write_verdict(console, kit, result, active, options)


def _by_file(findings: list[Finding]) -> list[tuple[str, list[Finding]]]:
    """Files with configuration findings (no graph node) first: they are the quickest to fix."""
    by_file: dict[str, list[Finding]] = defaultdict(list)
    for f in findings:
        by_file[clean(f.location.label or display_path(f.location.file))].append(f)
    order = {file: i for i, file in enumerate(by_file)}
    return sorted(by_file.items(), key=lambda item: (any(f.node for f in item[1]), order[item[0]]))


def _group_order(group: FindingGroup) -> tuple:
    """Most severe first; a rule's entries together, in layer order, the ones outside the layers last."""
    f = group.first
    return (-group.severity, bool(f.node), f.code, f.layer is None, f.layer or 0, f.location.line or 0)


def _write_group(console: Any, kit: _Kit, group: FindingGroup, width: int, options: TextOptions, *,
                 message_lines: int | None, show_fix: bool) -> None:
    Text = kit.Text
    f = group.first
    header = Text("  ")
    header.append(f"{f.severity.label:<7}", style=STYLE[f.severity])
    header.append(f" {f.code} ", style="dim")
    header.append(f.rule, style="bold")
    if f.node:
        header.append(f"  {where(group.findings)}", style="bold")
    target = group.target
    if target or f.location.line:
        header.append(f"  {target}{f':{f.location.line}' if f.location.line else ''}", style="dim")
    _print_wrapped(console, kit, header, width)
    for line in _wrap(group.message, width, INDENT, message_lines):
        console.print(Text(line))
    prices = [f.price for f in group.findings if f.price is not None]
    if prices and options.expand:  # grouped, the rule table carries each rule's price
        for line in _wrap(f"saves {group_price_text(prices)}", width, INDENT, None):
            console.print(Text(line, style="magenta"))
    if show_fix and group.fix:
        fix_limit = None if options.expand else MAX_FIX_LINES
        lines = _wrap(f"fix: {group.fix}", width, INDENT, fix_limit, more=f" … (ortgate explain {f.code})")
        for line in lines:
            console.print(Text(line, style="green"))


def _wrap(text: str, width: int, indent: str, max_lines: int | None, more: str = " …") -> list[str]:
    return textwrap.wrap(" ".join(text.split()), width=width, initial_indent=indent, subsequent_indent=indent,
                         break_on_hyphens=False, max_lines=max_lines, placeholder=more) or [indent]


def _print_wrapped(console: Any, kit: _Kit, text: Any, width: int) -> None:
    """A styled line, folded at spaces to `width` with the message indent."""
    if text.cell_len <= width:
        console.print(text)
        return
    lines = text.wrap(console, width - len(INDENT), overflow="fold")
    for i, line in enumerate(lines):
        console.print(kit.Text(INDENT) + line if i else line)


def _rule_table(kit: _Kit, active: list[Finding], options: TextOptions, joint: Mapping[str, RuleSaving] | None = None
                ) -> Any:
    """One row per rule: severity, how many findings, what fixing them all saves per token (an estimate on the
    policy's device, when it names one: the cost model's joint saving of the rule's repairs, each root cause
    once), where (most severe first, then the most findings)."""
    joint = joint or {}
    by_rule: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    for f in active:
        by_rule[(f.code, f.rule)].append(f)
    rows = sorted(by_rule.items(), key=lambda item: (-max(f.severity for f in item[1]), -len(item[1]), item[0]))
    Text = kit.Text
    table = kit.Table(box=kit.head_box if options.color else None, pad_edge=False, show_edge=False,
                  header_style="bold" if options.color else "")
    table.add_column("rule")
    table.add_column("severity")
    table.add_column("findings", justify="right")
    priced = any(f.price is not None for f in active)
    if priced:
        table.add_column("saves/token (est.)", justify="right")
    table.add_column("where", overflow="fold")
    for (code, name), findings in rows:
        severity = max(f.severity for f in findings)
        cells: list[Any] = [f"{code} {name}", Text(severity.label, style=STYLE[severity]), str(len(findings))]
        if priced:
            prices = [f.price for f in findings if f.price is not None]
            total, share = price_totals(prices)
            if prices and code in joint and total - joint[code].ms_per_token > 1e-4:  # repairs the findings share
                total, share = joint[code].ms_per_token, joint[code].share_of_step
            cells.append(Text(f"{time_text(total)} ({share:.0%})" if prices else "", style="magenta"))
        table.add_row(*cells, where(findings))
    return table


def _write_verdict(console: Any, kit: _Kit, result: LintResult, active: list[Finding], options: TextOptions) -> None:
    Text = kit.Text
    v = result.verdict
    counts = ", ".join(f"{n} {label}{'s' if n != 1 else ''}" for label, n in v.counts.items())
    suppressed = ""
    if v.suppressed:
        from ortgate.engine.gate import suppressed_breakdown

        by = suppressed_breakdown(v.suppressed_by)
        suppressed = f", {v.suppressed} suppressed" + (f" ({by})" if by else "")
    s = result.summary
    scope = f"{len(s.models)} models, " if s.several else ""
    scope += f"{s.nodes} nodes"
    if s.layers:
        scope += f", {s.layers} layers"
    if s.provider:
        scope += f", {clean(s.provider)}"
    line = Text()
    line.append("PASS" if v.passed else "FAIL", style="bold green" if v.passed else "bold red")
    line.append(f"  {counts}{suppressed} ({scope}; fails on {v.fail_on.label} and above)")
    width = max(options.width, MIN_WIDTH)
    if s.estimate:
        from ortgate.engine.pricing import headline

        _print_wrapped(console, kit, Text(f"estimate  {clean(headline(s.estimate, compact=True))}"), width)
    entries = len(group_findings(active))
    if not options.expand and entries < len(active):
        shown = f"{entries} entr{'y' if entries == 1 else 'ies'}"
        _print_wrapped(console, kit, Text(f"{len(active)} findings shown as {shown} of identical findings; --expand "
                                     "lists each one", style="dim"), width)
    release = s.release
    if release is not None and release.assumed:
        _print_wrapped(console, kit, Text(f"release: onnxruntime {release.version}, assumed (pin it with "
                                          f"{release.pin})", style="dim"), width)
    from ortgate.engine.pipeline import not_checked_text

    for gap in result.summary.not_checked:
        _print_wrapped(console, kit, Text(f"not checked: {clean(not_checked_text(gap))}", style="dim"), width)
    console.print(line)  # the verdict: always the last line, and one line, for scripts and CI logs to grep


# ---- the report without a terminal, without rich -------------------------------------------------------------------
# What rich writes for an uncoloured console (soft wrap, no markup, emoji or highlighting) where every line is
# printable and every width-dependent line plain ASCII (one cell per character), and the rule table fits the width:
# a line printed as it is, a styled line folded at spaces as rich's Text.wrap(overflow="fold") folds it, the table's
# columns at their widest cell. Anything else raises _NotPlain, and rich writes the whole report.


class _NotPlain(Exception):
    pass


_WORD = re.compile(r"\s*\S+\s*")  # rich._wrap's words: a word and the whitespace after it


def _cells(text: str) -> int:
    """The cells `text` takes: its length, for the plain ASCII the plain writer lays out."""
    if not (text.isascii() and text.isprintable()):
        raise _NotPlain
    return len(text)


def _breaks(text: str, width: int, fold: bool = True) -> list[int]:
    """rich._wrap.divide_line(text, width, fold), for one-cell characters."""
    breaks: list[int] = []
    offset = 0
    for match in _WORD.finditer(text):
        start, word = match.start(), match.group()
        length = len(word.rstrip())
        if width - offset >= length:
            offset += len(word)
        elif length > width and not fold:  # the word alone on its lines, cut where it is printed
            if start:
                breaks.append(start)
            offset = len(word)
        elif length > width:
            chunks = [word[i:i + width] for i in range(0, len(word), width)]
            for i, chunk in enumerate(chunks):
                if start:
                    breaks.append(start)
                if i == len(chunks) - 1:
                    offset = len(chunk)
                else:
                    start += len(chunk)
        elif offset and start:
            breaks.append(start)
            offset = len(word)
    return breaks


class _PlainText:
    """rich.text.Text as the text report uses it, without styles."""

    __slots__ = ("plain",)

    def __init__(self, text: str = "", style: str | None = None) -> None:
        self.plain = text

    def append(self, text: str, style: str | None = None) -> _PlainText:
        self.plain += text
        return self

    def __add__(self, other: _PlainText) -> _PlainText:
        return _PlainText(self.plain + other.plain)

    @property
    def cell_len(self) -> int:
        return _cells(self.plain)

    def wrap(self, console: Any, width: int, overflow: str) -> list[_PlainText]:
        _cells(self.plain)
        at = [0, *_breaks(self.plain, width), len(self.plain)]
        # rich crops each line to the width: past it, only the spaces a break left (the report strips them)
        return [_PlainText(self.plain[a:b][:width]) for a, b in zip(at, at[1:])]


class _PlainTable:
    """rich.table.Table with no box and no edge padding, its `where` column last."""

    def __init__(self, **_options: Any) -> None:
        self.columns: list[tuple[str, str, bool]] = []  # header, justify, whether it folds (else an ellipsis)
        self.rows: list[list[str]] = []
        self._lines: list[str] | None = None

    def add_column(self, header: str, justify: str = "left", overflow: str | None = None) -> None:
        self.columns.append((header, justify, overflow == "fold"))

    def add_row(self, *cells: Any) -> None:
        self.rows.append([c.plain if isinstance(c, _PlainText) else c for c in cells])

    def lines(self, width: int) -> list[str]:
        if self._lines is None:
            self._lines = self._lay_out(width)
        return self._lines

    def _lay_out(self, width: int) -> list[str]:
        """rich's Table layout: each column as wide as its widest cell; when they do not fit, the widest columns
        narrowed first (Table._collapse_widths, then evenly), and the cells wrapped in them."""
        rows = [[header for header, _, _ in self.columns], *self.rows]
        last = len(self.columns) - 1
        pads = [(0 if i == 0 else 1, 0 if i == last else 1) for i in range(len(self.columns))]
        widths = [min(max(_cells(row[i]) for row in rows) + sum(pads[i]), width) or 1
                  for i in range(len(self.columns))]
        if sum(widths) > width:
            widths = _collapse(widths, width)
            if sum(widths) > width:
                widths = _ratio_reduce(sum(widths) - width, [1] * len(widths), widths, widths)
            if any(w - sum(pad) < 1 for w, pad in zip(widths, pads)):
                raise _NotPlain
            # measured again at the narrowed widths: a column keeps its width (its widest cell was wider)
            widths = [min(max(min(_cells(row[i]), w - sum(pads[i])) for row in rows) + sum(pads[i]), w)
                      for i, w in enumerate(widths)]
        out = []
        for index, row in enumerate(rows):
            cells = []
            for i, (cell, (_header, justify, fold)) in enumerate(zip(row, self.columns)):
                inner = widths[i] - sum(pads[i])
                left, right = " " * pads[i][0], " " * pads[i][1]
                cells.append([left + line + right for line in _cell_lines(cell, inner, justify, fold)])
            height = max(len(lines) for lines in cells)
            if index == 0:  # the header row's cells align to its bottom, the others' to their top
                cells = [[" " * widths[i]] * (height - len(lines)) + lines for i, lines in enumerate(cells)]
            for n in range(height):
                out.append("".join(lines[n] if n < len(lines) else " " * widths[i] for i, lines in enumerate(cells)))
        return out


def _collapse(widths: list[int], max_width: int) -> list[int]:
    """rich's Table._collapse_widths, every column wrapable: the widest narrowed to the next widest, and so on."""
    total = sum(widths)
    excess = total - max_width
    while total and excess > 0:
        widest = max(widths)
        second = max((w if w != widest else 0) for w in widths)
        difference = widest - second
        ratios = [1 if w == widest else 0 for w in widths]
        if not any(ratios) or not difference:
            break
        widths = _ratio_reduce(excess, ratios, [min(excess, difference)] * len(widths), widths)
        total = sum(widths)
        excess = total - max_width
    return widths


def _ratio_reduce(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    """rich._ratio.ratio_reduce."""
    ratios = [ratio if maximum else 0 for ratio, maximum in zip(ratios, maximums)]
    total_ratio = sum(ratios)
    if not total_ratio:
        return values[:]
    remaining = total
    result = []
    for ratio, maximum, value in zip(ratios, maximums, values):
        if ratio and total_ratio > 0:
            distributed = min(maximum, round(ratio * remaining / total_ratio))
            result.append(value - distributed)
            remaining -= distributed
            total_ratio -= ratio
        else:
            result.append(value)
    return result


_TRAILING_SPACE = re.compile(r"\s+$")


def _cell_lines(text: str, width: int, justify: str, fold: bool) -> list[str]:
    """A table cell as rich's Text.wrap lays it out in `width` (the `where` column folds, the others end a word
    too long for the column with an ellipsis), justified."""
    at = [0, *_breaks(text, width, fold), len(text)]
    out = []
    for line in (text[a:b] for a, b in zip(at, at[1:])):
        if len(line) > width:  # Text.rstrip_end: the spaces a break left past the width
            trailing = _TRAILING_SPACE.search(line)
            if trailing is not None:
                line = line[:len(line) - min(len(trailing.group()), len(line) - width)]
        if justify == "right":
            line = _truncate(line.rstrip(), width, fold)
            line = " " * (width - len(line)) + line
        else:
            line = _truncate(line, width, fold).ljust(width)
        out.append(_truncate(line, width, fold))
    return out


def _truncate(line: str, width: int, fold: bool) -> str:
    """rich's Text.truncate, for one-cell characters."""
    if len(line) <= width:
        return line
    return line[:width] if fold else line[:width - 1] + "\u2026"


class _PlainConsole:
    """rich.console.Console(soft_wrap=True) printing to a list of lines."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.lines: list[str] = []

    def print(self, item: Any = None) -> None:
        if item is None:
            self.lines.append("")
        elif isinstance(item, _PlainTable):
            self.lines.extend(item.lines(self.width))
        else:
            if not item.plain.isprintable():  # rich strips or expands control characters and tabs
                raise _NotPlain
            self.lines.append(item.plain)


_PLAIN = _Kit(_PlainText, _PlainTable)
