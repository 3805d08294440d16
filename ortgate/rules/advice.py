"""Fix advice that knows the tool that made the model.

A model records the tool that wrote it (ModelProto.producer_name / producer_version). When knowledge/producers.json
knows that tool, a finding's fix never recommends it as it already ran: the sentences that do are left out, and the
rule's fused form (`form`) is said in that tool's terms: which release writes it, or what turned it off.
"""

from __future__ import annotations

import re

from ortgate.graph.index import Graph, Node
from ortgate.knowledge.families import model_family
from ortgate.knowledge.producers import known_producers, producer_of

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


FIX_COMMAND = "ortgate fix MODEL -o OUT"
WAIVE = ("what remains is to waive the finding in the policy (`waivers:` with the rule, the node and a `reason`) or to "
         "accept the cost its price shows")


def _family_key(family: object) -> str | None:
    """The model_families.json key of a declared family (policy model.family, genai_config.json model.type), or
    its spelling with only letters and digits when ortgate has no entry for it."""
    if not isinstance(family, str) or not family.strip():
        return None
    known = model_family(family)
    return known.name if known is not None else re.sub(r"[^a-z0-9]", "", family.lower())


def builder_advice(family: object, provider: str | None, writes: str, form: str | None = None) -> str:
    """A sentence recommending each known builder that writes `writes` ('it' in the sentence) for this model: only
    for a family it builds (every one it builds is listed when the family is not declared), with the flags of the
    deployment's execution provider; '' when no builder applies."""
    key = _family_key(family)
    said: list[str] = []
    for tool in known_producers():
        if not tool.builds or tool.command is None:
            continue
        if key is not None and not tool.builds_family(key):
            continue
        produced = tool.forms.get(form) if form else None
        if provider is not None and produced is not None and produced.providers and provider not in produced.providers:
            continue
        command = tool.command_for(provider)
        if command is None:
            continue
        if key is not None:
            families = tool.builds[key]
        else:  # the family is not declared: say which it builds, and which of those a reader may take it for it refuses
            refused = f"; it refuses {', '.join(tool.refuses.values())}" if tool.refuses else ""
            families = f"the families it builds ({', '.join(tool.builds.values())}{refused})"
        said.append(f"{tool.label} writes {writes} for {families}: {command}.")
    return " ".join(said)


def fusion_fix_advice(what: str) -> str:
    """The sentence that names `ortgate fix` for a form its onnxscript fusions repair where their patterns match."""
    return (f"`{FIX_COMMAND}` rewrites {what} with onnxscript's ort_fusions where their patterns match, and says per "
            "layer what it fused and what it left (`--dry-run` writes nothing).")


# torch.onnx writes the sequence ops for a torch.split / chunk / unbind whose pieces it cannot make static.
_TORCH_SEQUENCE_OPS = frozenset({"SplitToSequence", "SequenceAt", "ConcatFromSequence", "SequenceConstruct",
                                 "SequenceInsert", "SequenceLength"})


def torch_export_advice(graph: Graph, node: Node) -> str:
    """How to export without `node` when torch.onnx wrote it (a sequence op from a dynamic split), else ''."""
    if graph.producer_name.lower() != "pytorch" or node.op_type not in _TORCH_SEQUENCE_OPS:
        return ""
    return (f"torch.onnx writes {node.op_type} for a torch.split / chunk / unbind whose pieces it cannot make static: "
            "re-export with static split sizes (a Python int list, or torch.chunk of a fixed count), or in a dtype the "
            "kernels take (float16 or float32: `model.to(torch.float16)` before torch.onnx.export).")
