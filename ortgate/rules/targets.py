"""What the graph rules need to know about where the model will run: the target provider and optimization level,
and which graph to judge (ORT's optimized dump when given: what is still decomposed there certainly runs so).

Not a rule module: it registers nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from ortgate.config.deployment import ORT_DEFAULT_OPTIMIZATION_LEVEL
from ortgate.graph.index import Graph, Node
from ortgate.knowledge.fusions import fusions_version, optimizer_pass, pass_applies
from ortgate.knowledge.provider_names import ACL, CPU, CUDA, DML, ROCM
from ortgate.rules.context import RuleContext

T = TypeVar("T")
_SHORT_PROVIDER = {CPU: "CPU", CUDA: "CUDA", ROCM: "ROCm",
                   DML: "DirectML", ACL: "ACL"}


@dataclass(frozen=True)
class Target:
    provider: str | None  # None: the deployment names none (ORT then runs on CPU)
    level: str  # the effective graph optimization level
    origin: str  # "policy", "genai_config.json", or "no deployment given"

    @property
    def provider_label(self) -> str:
        return self.provider or f"{CPU} (no provider declared)"


def target(ctx: RuleContext) -> Target:
    deployment = ctx.deployment
    setup = deployment.primary
    if setup is None:
        return Target(None, ORT_DEFAULT_OPTIMIZATION_LEVEL, "no deployment given")
    # The level comes from the declaration that sets one (the policy's first), the provider from the primary.
    leveled = next((s for s in (deployment.policy_setup, deployment.genai_setup)
                    if s is not None and s.optimization_level is not None), setup)
    return Target(setup.provider_name, leveled.effective_optimization_level, leveled.label)


def judged_graph(ctx: RuleContext) -> tuple[Graph, bool]:
    """(the graph ORT executes as far as we know, whether it is the optimized dump)."""
    return ctx.executed, ctx.optimized is not None


def short_providers(providers: Iterable[str]) -> str:
    """"CPU/CUDA/DirectML" for a list of provider names."""
    return "/".join(_SHORT_PROVIDER.get(p, p) for p in providers) or "no provider"


def ort_pass_note(pass_name: str, tgt: Target, repaired: bool, form_providers: Iterable[str] | None = None) -> str:
    """One sentence: does ORT's optimizer pass `pass_name` run (and repair the pattern) for this target.

    form_providers: the providers for which the pass matches this particular form (None: not form-specific)."""
    info = optimizer_pass(pass_name)
    providers = short_providers(info.providers)
    where = f"{tgt.provider_label} at {tgt.level}"
    if repaired:
        return (f"ORT's {pass_name} ({info.level} and above, {providers}; ORT {fusions_version()}) is expected to "
                f"rewrite it at session creation for {where}: confirm with an optimized dump (--optimized)")
    if not pass_applies(pass_name, tgt.provider, tgt.level):
        return f"ORT's {pass_name} ({info.level}+, {providers}) does not run for {where}"
    others = sorted(set(form_providers or ()))
    if others:
        return (f"ORT's {pass_name} (ORT {fusions_version()}) matches this form only on {short_providers(others)}, not on "
                f"{tgt.provider_label}, so it runs as exported")
    return f"ORT's {pass_name} (ORT {fusions_version()}) does not match this form, so it runs as exported"


def by_layer(items: Iterable[T], node_of: Callable[[T], Node], layer_of: Callable[[T], int | None]
             ) -> list[tuple[tuple[str | None, int | None], list[T]]]:
    """Group items per (subgraph path, layer), layers in order, the main graph first and model-level last."""
    groups: dict[tuple[str | None, int | None], list[T]] = defaultdict(list)
    for item in items:
        groups[(node_of(item).graph, layer_of(item))].append(item)
    return sorted(groups.items(), key=lambda kv: (kv[0][0] or "", kv[0][1] is None, kv[0][1] or 0))


def layer_text(layer: int | None) -> str:
    """"in layer 3", or "outside the decoder layers" (final norm, lm_head)."""
    return f"in layer {layer}" if layer is not None else "outside the decoder layers"


def counted(names: Iterable[str]) -> str:
    """'Pow x4, Sqrt x4' from a sequence of names."""
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{k} x{v}" if v > 1 else k for k, v in counts.items())
