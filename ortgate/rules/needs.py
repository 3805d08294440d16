"""What a rule needs to find anything, declared on the rule (`@rule(..., needs=(...))`), and whether given inputs have
it. A rule whose need is unmet yields nothing on those inputs (tests/test_rule_cases.py checks it on every case), so
the engine may skip it, and lint names what it did not check.

A rule's needs are preconditions, not everything it reads: a rule that also needs, say, CUDA among the providers
declares `provider`, and finds nothing on a CPU deployment all the same. Some needs are about the graphs (an MoE
layer, an attention, a KV cache): each is checked with a look-up in the graph index, never a pattern match, so a rule
that cannot apply to a model costs that look-up and nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable

from ortgate.graph.index import DEFAULT_DOMAIN, MS_DOMAIN, Graph
from ortgate.rules.context import EVIDENCE_KEY, LintInputs

# Need -> what it is (`ortgate rules --format json` and `ortgate explain` say it), in the order reasons are given.
NEEDS = {
    "session": "a declared session: a policy's session or execution_provider block, or genai_config.json",
    "provider": "a declared execution provider",
    "policy": "a policy (--policy)",
    "genai_config": "genai_config.json",
    "optimized": "ORT's optimized dump of the model (--optimized, or the one `ortgate run` writes)",
    "evidence": "what `ortgate run` saw: its session, measurement and outputs",
    "throughput": "the policy's throughput block",
    "device": "a device the cost model prices (the policy's throughput.device, or estimate's --device)",
    "moe": "an MoE layer in a graph: a com.microsoft MoE or QMoE node, or a TopK / ArgMax an unfused one routes by",
    "attention": "an attention in a graph: a fused attention node (GroupQueryAttention, MultiHeadAttention, Attention, "
                 "...) or a Softmax a decomposed one is built on",
    "kv_cache": "a KV cache in the model: a graph output that holds one, or an input carrying state between steps",
    "base": "a base model to compare with (--compare BASE_MODEL, the Action's compare-ref)",
}

# The needs a lint can be given (a policy, genai_config.json): a family of rules that all lack one is named on the
# report's `not checked:` line. The others are optional evidence (a dump, a run, a throughput block), not a gap.
DECLARATIONS = ("session", "provider", "policy", "genai_config")

_NO_SESSION = "no policy (nor genai_config.json) declares the session: pass --policy"
_GENAI_NO_SESSION = "no policy declares the session, and genai_config.json declares none of it: pass --policy"


def has(need: str, inputs: LintInputs) -> bool:
    """Whether `inputs` meet `need`."""
    if need == "session":
        return bool(inputs.deployment.setups)
    if need == "provider":
        return inputs.deployment.provider is not None
    if need == "policy":
        return inputs.policy is not None
    if need == "genai_config":
        return inputs.genai is not None
    if need == "optimized":
        return inputs.optimized is not None
    if need == "evidence":
        return EVIDENCE_KEY in inputs.evidence
    if need == "throughput":
        return inputs.throughput is not None
    if need == "device":
        return inputs.cost is not None
    if need == "moe":
        return any(_has_moe(g) for g in inputs.graphs)
    if need == "attention":
        return any(_has_attention(g) for g in inputs.graphs)
    if need == "base":
        return inputs.base is not None
    if need == "kv_cache":
        return any(_has_kv_cache(g) for g in inputs.graphs)
    raise ValueError(f"unknown need {need!r}")


def _has_moe(graph: Graph) -> bool:
    """What every MoE block (graph.patterns.moe.moe_blocks) is found from: a fused MoE / QMoE node, or a selection
    op (TopK, ArgMax) an unfused block's routing picks its experts with. Without either there is no block."""
    from ortgate.graph.patterns.moe import SELECTION_OPS
    from ortgate.knowledge.moe import MOE_OPS

    return (any(graph.count(MS_DOMAIN, op) for op in MOE_OPS)
            or any(graph.count(DEFAULT_DOMAIN, op) for op in SELECTION_OPS))


def _has_attention(graph: Graph) -> bool:
    """A fused attention node, or a Softmax: every attention core (graph.patterns.attention) is built on one."""
    from ortgate.graph.patterns.attention import FUSED_ATTENTION_OPS

    return any(graph.count(domain, op) for domain, op in FUSED_ATTENTION_OPS) or bool(graph.count(DEFAULT_DOMAIN,
                                                                                                 "Softmax"))


def _has_kv_cache(graph: Graph) -> bool:
    from ortgate.graph.patterns.decoder import cache_outputs, carries_state

    return any(carries_state(i) for i in graph.inputs) or bool(cache_outputs(graph))


def unmet(needs: Iterable[str], inputs: LintInputs) -> tuple[str, ...]:
    """The needs `inputs` lack, in NEEDS order (empty: the rule has what it needs). A rule with one is skippable."""
    wanted = set(needs)
    return tuple(n for n in NEEDS if n in wanted and not has(n, inputs))


def missing_declaration(needs: Iterable[str], inputs: LintInputs, family: str) -> str | None:
    """Why a rule with these needs had nothing to judge, said for the `not checked:` line: the first declaration it
    lacks (None: it lacks none). A rule needing both a policy and genai_config.json compares the two."""
    wanted = set(needs)
    lacking = [n for n in unmet(wanted, inputs) if n in DECLARATIONS]
    if not lacking:
        return None
    first = lacking[0]
    no_session = _GENAI_NO_SESSION if inputs.genai is not None else _NO_SESSION
    compares = {"policy", "genai_config"} <= wanted
    if first == "session":
        return no_session
    if first == "provider":
        return no_session if not inputs.deployment.setups else \
            "no execution provider is declared: set execution_provider.name"
    if first == "policy":
        if compares and inputs.genai is not None:
            return f"{family} compares a policy with genai_config.json, and no policy is given: pass --policy"
        return _NO_SESSION if inputs.genai is None else "no policy is given: pass --policy"
    if compares:
        return f"{family} compares the policy with genai_config.json, and there is none"
    return "there is no genai_config.json"
