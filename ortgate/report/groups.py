"""Identical findings across decoder layers, as one entry: "layers 0-47 (48): ...".

Two findings are identical when they have the same file, rule, severity, fix and suppression, and the same
message and node once the names in them are abstracted: inside a name-like token (one holding a letter, a digit
and a separator, as `model.layers.47.mlp.gate/MatMul` or `node_MatMul_1234` do) every number is a slot, and so
is the number after "layer". Quantities, shapes and versions ("4 experts", "[64, 32]", "ORT 1.31.1") are not
names: a finding that says "1 residual Add" never joins one that says "2 residual Adds". A finding that points
at no node (a policy key, a count) joins only its exact duplicates.

For display, a slot that holds each finding's own layer number reads `N`, one that varies otherwise `*`, and
one that is the same everywhere keeps its value: `model.layers.N.mlp.gate/MatMul`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from ortgate.findings import Finding, Severity

# A run of characters that can make up a node, tensor or key name; name-like when it mixes letters, digits and
# a separator.
_TOKEN = re.compile(r"[\w./:-]+")
_LAYER_PHRASE = re.compile(r"\b(layers? )(\d+)\b")
_DIGITS = re.compile(r"\d+")
_HAS_LETTER = re.compile(r"[A-Za-z]")
_SEPARATORS = frozenset("./_:")


def _pieces(text: str) -> list[str | int]:
    """`text` as literal strings and slots; a slot is an int index into the numbers `_numbers` returns."""
    return _split(text)[0]


def _split(text: str) -> tuple[list[str | int], list[str]]:
    spans: list[tuple[int, int]] = []
    for m in _LAYER_PHRASE.finditer(text):
        spans.append(m.span(2))
    for m in _TOKEN.finditer(text):
        token = m.group()
        if _HAS_LETTER.search(token) and any(c.isdigit() for c in token) and _SEPARATORS.intersection(token):
            spans += [(m.start() + d.start(), m.start() + d.end()) for d in _DIGITS.finditer(token)]
    pieces: list[str | int] = []
    numbers: list[str] = []
    at = 0
    for start, end in sorted(set(spans)):
        if start < at:  # "layer 5" inside a name-like token: already a slot
            continue
        pieces.append(text[at:start])
        pieces.append(len(numbers))
        numbers.append(text[start:end])
        at = end
    pieces.append(text[at:])
    return pieces, numbers


# torch.onnx dynamo numbers a name's repeats from its second one: node_linear, node_linear_1, node_linear_2, ...
_BARE_DYNAMO_NAME = re.compile(r"\bnode_[A-Za-z][A-Za-z_]*[A-Za-z]\b")


def _indexed(text: str) -> str:
    """`text` with a bare dynamo name as index 0 of its pattern (node_linear -> node_linear_0), so that layer 0's
    node_linear and layer 1's node_linear_7 are one name pattern."""
    return _BARE_DYNAMO_NAME.sub(lambda m: m.group() + "_0", text) if "node_" in text else text


@functools.lru_cache(maxsize=8192)  # each finding's message and target, read by every grouping of a report
def _skeleton(text: str) -> str:
    return "".join("#" if isinstance(p, int) else p for p in _pieces(_indexed(text)))


@dataclass
class FindingGroup:
    """Identical findings (see the module doc), in layer order."""

    findings: list[Finding] = field(default_factory=list)

    @property
    def first(self) -> Finding:
        return self.findings[0]

    @property
    def count(self) -> int:
        return len(self.findings)

    @property
    def layers(self) -> list[int]:
        return sorted({f.layer for f in self.findings if f.layer is not None})

    @property
    def severity(self) -> Severity:
        return self.first.severity

    @property
    def message(self) -> str:
        return self._template(lambda f: f.message)

    @property
    def target(self) -> str:
        """The node (with its subgraph) or the config key, abstracted like the message."""
        return self._template(_target)

    @property
    def fix(self) -> str | None:
        return self.first.fix

    def where(self) -> str:
        """'layers 0-47 (48 layers)', 'layer 3 (2 findings)', 'layers 0-3, 9 (5 layers)', 'across layers 0-1',
        'outside the decoder layers', ... ."""
        return where(self.findings)

    def _template(self, text_of) -> str:
        texts = [text_of(f) for f in self.findings]
        if len(set(texts)) == 1:
            return texts[0]
        texts = [_indexed(t) for t in texts]
        split = [_split(t) for t in texts]
        pieces, _ = split[0]
        out = []
        for p in pieces:
            if not isinstance(p, int):
                out.append(p)
                continue
            values = [numbers[p] for _, numbers in split]
            if len(set(values)) == 1:
                out.append(values[0])
            elif all(f.layer is not None and v == str(f.layer) for f, v in zip(self.findings, values)):
                out.append("N")
            else:
                out.append("*")
        return "".join(out)


def _target(f: Finding) -> str:
    if f.node:
        return f"{f.graph}/{f.node}" if f.graph else f.node
    return f.location.key_path or ""


def group_key(f: Finding) -> tuple:
    """What makes findings identical (see the module doc)."""
    suppressed = None if f.suppressed is None else (f.suppressed.kind, f.suppressed.justification)
    base = (f.location.file, f.location.label, f.code, f.rule, f.severity, f.fix, suppressed)
    if not f.node:
        return (*base, f.location.line, f.location.key_path, f.message, repr(f.properties), f.layer is None)
    return (*base, _skeleton(f.message), _skeleton(_target(f)), f.op_type, f.layer is None)


def group_findings(findings: Iterable[Finding]) -> list[FindingGroup]:
    """Identical findings grouped, groups in the order their first finding came; each group in layer order."""
    groups: dict[tuple, FindingGroup] = {}
    for f in findings:
        groups.setdefault(group_key(f), FindingGroup()).findings.append(f)
    for g in groups.values():
        g.findings.sort(key=lambda f: (f.layer is None, f.layer or 0, f.node or "", f.location.line or 0))
    return list(groups.values())


def ranges(values: Iterable[int], dash: str = "-") -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8'."""
    spans: list[list[int]] = []
    for v in sorted(set(values)):
        if spans and v == spans[-1][1] + 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}{dash}{b}" for a, b in spans)


_LAYERS_IN_MESSAGE = re.compile(r"\bin layers ((?:\d+(?:-\d+)?)(?:(?:, | and )\d+(?:-\d+)?)*)\b")


def _spanned_layers(f: Finding) -> str | None:
    """The layers a finding outside any one layer says it spans ("... in layers 0-1"), or None."""
    m = _LAYERS_IN_MESSAGE.search(f.message)
    return m.group(1) if m else None


def _counted(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def where(findings: list[Finding], dash: str = "-") -> str:
    """Where a set of findings lies: their layers as ranges, with how many layers and (when it differs) how many
    findings; findings that span several layers, as their messages name them; and/or outside the layers."""
    layers = sorted({f.layer for f in findings if f.layer is not None})
    parts = []
    if layers:
        in_layers = sum(1 for f in findings if f.layer is not None)
        counts = [_counted(len(layers), "layer")] if len(layers) > 1 else []
        if in_layers > len(layers):
            counts.append(_counted(in_layers, "finding"))
        count = f" ({', '.join(counts)})" if counts else ""
        parts.append(f"{'layer' if len(layers) == 1 else 'layers'} {ranges(layers, dash)}{count}")
    outside = [f for f in findings if f.layer is None]
    spanning = [f for f in outside if f.node and _spanned_layers(f)]
    if spanning:
        spans = list(dict.fromkeys(str(_spanned_layers(f)) for f in spanning))
        label = f"across layers {'; '.join(spans)}"
        parts.append(label + (f" ({_counted(len(spanning), 'finding')})" if len(spanning) > 1 else ""))
        outside = [f for f in outside if f not in spanning]
    if outside:
        if any(f.node for f in outside):
            label = "outside the decoder layers"
        elif any(f.location.key_path or f.location.line for f in outside):
            label = "configuration"
        else:
            label = "the whole graph"  # a fact about the model's interface or every layer, with no one node
        parts.append(label + (f" ({_counted(len(outside), 'finding')})" if len(outside) > 1 else ""))
    return "; ".join(parts)
