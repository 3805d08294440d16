"""Fix advice that knows the tool that made the model.

A model records the tool that wrote it (ModelProto.producer_name / producer_version). When knowledge/producers.json
knows that tool, a finding's fix never recommends it as it already ran: the sentences that do are left out, and the
rule's fused form (`form`) is said in that tool's terms: which release writes it, or what turned it off.
"""

from __future__ import annotations

import re

from ortgate.graph.index import Graph
from ortgate.knowledge.producers import producer_of

_SENTENCES = re.compile(r"(?<=[.;])\s+(?=\S)")
_ASIDE = re.compile(r"\s*\([^()]*\)")


def producer_fix(graph: Graph, fix: str, form: str | None = None) -> str:
    """`fix` for the model `graph` as its producer made it: without recommending that producer, and with what its
    releases do about `form` when the data says."""
    tool = producer_of(graph.producer_name)
    if tool is None:
        return fix
    original = fix
    kept: list[str] = []
    # An aside naming the tool goes alone; a sentence or clause recommending it goes whole.
    fix = _ASIDE.sub(lambda m: "" if tool.mentioned_in(m.group(0)) else m.group(0), fix)
    dropped = fix != original
    after_drop = False
    for part in _SENTENCES.split(fix):
        if tool.mentioned_in(part):
            dropped = after_drop = True
            if kept and kept[-1].endswith(";") and part.rstrip().endswith("."):
                kept[-1] = kept[-1][:-1] + "."  # the clause that ended the sentence is gone
            continue
        if after_drop and kept and kept[-1].endswith(".") and part[:1].islower():
            part = part[:1].upper() + part[1:]  # a clause that now starts a sentence
        after_drop = False
        kept.append(part)
    advice = tool.advice(form, graph.producer_version) if form else None
    if not dropped and advice is None:
        return original
    text = " ".join(kept)
    if text.endswith(";"):
        text = text[:-1] + "."
    return f"{text} {advice}".strip() if advice else text
