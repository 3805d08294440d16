"""What a rule sees: the evidence (graphs, deployment, expectations, policy) and a way to report."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from ortgate.config.deployment import Deployment, SessionSetup
from ortgate.config.expectations import Expectations
from ortgate.config.genai import GenaiConfig
from ortgate.config.policy import Policy
from ortgate.config.throughput import ThroughputPolicy
from ortgate.cost import CostSetup, Estimate, StepShape, estimate
from ortgate.cost.memory import MemoryEstimate, memory_estimate
from ortgate.errors import printable
from ortgate.findings import Finding, Kind, Location, Severity
from ortgate.graph.index import Graph, Node
from ortgate.knowledge.provider_names import CUDA
from ortgate.rules.advice import producer_fix


class RuleName(Protocol):
    """What a context knows of its rule (ortgate.rules.base.Rule has it): whose findings it makes. A protocol, so
    that this module and the registry do not import each other."""

    @property
    def code(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def severity(self) -> Severity: ...

MAX_RELATED_NODES = 12


# The key `ortgate run` files its RunEvidence (ortgate.evidence) under in LintInputs.evidence. Here, not in
# ortgate.evidence, so that a lint, which has no evidence, never imports that module.
EVIDENCE_KEY = "run"


@dataclass(frozen=True)
class LintInputs:
    """Everything the user gave, loaded once and shared by every rule: a value, never changed in place.

    `ortgate.engine.pipeline.load_inputs` builds it; `ortgate run` derives new values with the run's evidence and
    ORT's optimized dump (`with_evidence`, `with_optimized`)."""

    model: Graph
    optimized: Graph | None
    deployment: Deployment
    expect: Expectations
    policy: Policy | None = None
    genai: GenaiConfig | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)  # run evidence from `ortgate run`
    # Every file the inputs came from (model, its external data, configs, the policy's extends chain, the dump):
    # what no output may ever replace.
    files_read: tuple[Path, ...] = ()
    # The device and decode step the cost model prices (None: no device named, nothing is priced).
    cost: CostSetup | None = None
    throughput: ThroughputPolicy | None = None
    prompt_length: int | None = None  # prompt tokens per sequence the prefill estimate is for (None: none)
    batch_sizes: tuple[int, ...] = ()  # batches `ortgate estimate` sweeps
    # Why a named device is not priced (the `cpu` device without figures: a lint never measures the machine it
    # runs on, so that its report is a function of its inputs). None: priced, or no device named.
    cost_gap: str | None = None
    # The base model this one changes (`--compare BASE_MODEL`), loaded with the same policy: the regression gate
    # (throughput.max_regression) judges the model's estimate against the base's. None: no comparison.
    base: LintInputs | None = None

    @property
    def prefill(self) -> Estimate | None:
        """The prompt phase (time to first token): one step of `prompt_length` new tokens per sequence over a
        context of the prompt, for `cost`'s batch. None without a device or a prompt length."""
        if self.cost is None or not self.prompt_length:
            return None
        found = self.__dict__.get("_prefill")
        if found is None:
            shape = StepShape(self.cost.shape.batch, self.prompt_length, self.prompt_length)
            found = self.__dict__["_prefill"] = estimate(self.executed, replace(self.cost, shape=shape))
        return found

    @property
    def memory(self) -> MemoryEstimate | None:
        """The memory the deployment needs on `cost`'s device (None: no device named)."""
        est = self.estimate
        if est is None:
            return None
        found = self.__dict__.get("_memory")
        if found is None:
            found = self.__dict__["_memory"] = self.memory_at(est.setup.shape.batch)
        return found

    def memory_at(self, batch: int) -> MemoryEstimate | None:
        """The memory the deployment needs at `batch` sequences: the one memory model of `lint`, `estimate` and its
        batch sweep (None: no device named)."""
        est = self.estimate
        if est is None:
            return None
        shape = est.setup.shape
        genai = self.genai
        shared = bool(genai is not None and genai.past_present_share_buffer and genai.max_length)
        if shared:
            assert genai is not None and genai.max_length is not None
            length = genai.max_length
            source = "genai_config.json search.max_length, pre-allocated by past_present_share_buffer"
        else:
            length = max(shape.context, (self.prompt_length or 0) + shape.new_tokens)
            source = ("throughput.context_length" if self.throughput is not None
                      and "context_length" in self.throughput.locations else "the estimate's context: --context, else 2048")
        full = genai.data["model"].get("context_length") if genai is not None else None
        return memory_estimate(
            self.executed, est.model, est.device, batch=batch, kv_length=length, kv_source=source,
            shared_buffer=shared, longest_step=max(self.prompt_length or 0, shape.new_tokens),
            full_context=full if isinstance(full, int) and not isinstance(full, bool) else None,
            stored=self.model, cuda_release=self._cuda_release(est.setup))

    def _cuda_release(self, setup) -> str | None:
        """The deployment's release where the estimate is for the CUDA provider on a GPU (None otherwise)."""
        if not setup.gpu or (setup.provider or CUDA) != CUDA:
            return None
        return setup.ort_release or self.deployment.ort.judged_as

    def __post_init__(self) -> None:
        if self.cost is not None and self.cost.optimized != (self.optimized is not None):
            raise ValueError("LintInputs: the cost setup must price the executed graph "
                             f"(optimized={self.cost.optimized}, dump given: {self.optimized is not None})")

    @cached_property
    def estimate(self) -> Estimate | None:
        """The decode step estimate of the executed graph for `cost` (computed once, on first use)."""
        return None if self.cost is None else estimate(self.executed, self.cost)

    @property
    def graphs(self) -> list[Graph]:
        return [g for g in (self.model, self.optimized) if g is not None]

    @property
    def executed(self) -> Graph:
        """The graph ORT will execute as far as we know: the optimized dump when given, else the model."""
        return self.optimized or self.model

    def with_evidence(self, key: str, value: Any) -> LintInputs:
        """These inputs with one more piece of run evidence."""
        return replace(self, evidence={**self.evidence, key: value})

    def with_optimized(self, optimized: Graph, files: Iterable[Path] = ()) -> LintInputs:
        """These inputs with ORT's optimized dump as the executed graph: the cost model then prices the dump as
        optimized (ORT's fusions are in it already, never applied a second time)."""
        cost = replace(self.cost, optimized=True) if self.cost is not None else None
        return replace(self, optimized=optimized, cost=cost,
                       files_read=tuple(dict.fromkeys((*self.files_read, *files))))


@dataclass(frozen=True)
class PolicyInputs:
    """What `ortgate policy validate` gives the rules that judge a policy alone (`@rule(policy_only=True)`): the
    policy and the session it declares. There is no model, no dump, no genai_config.json and no run: a rule that
    reaches for one is told so (NoModel), and its finding says it could not decide, as lint says of a rule that
    raised."""

    policy: Policy
    deployment: Deployment
    expect: Expectations = field(default_factory=Expectations)
    files_read: tuple[Path, ...] = ()


class NoModel(LookupError):
    """A rule asked for a graph of inputs that have none (a policy validated alone)."""


class RuleContext:
    def __init__(self, inputs: LintInputs | PolicyInputs, rule: RuleName):
        self.given = inputs
        self.rule = rule

    # Evidence ------------------------------------------------------------------------------------
    @property
    def inputs(self) -> LintInputs:
        """The inputs of a lint (a model and what came with it); NoModel for a policy validated alone."""
        if isinstance(self.given, PolicyInputs):
            raise NoModel(f"{self.rule.code} {self.rule.name} reads a model, and `ortgate policy validate` has none")
        return self.given

    @property
    def model(self) -> Graph:
        return self.inputs.model

    @property
    def optimized(self) -> Graph | None:
        return self.inputs.optimized

    @property
    def executed(self) -> Graph:
        return self.inputs.executed

    @property
    def deployment(self) -> Deployment:
        return self.given.deployment

    @property
    def expect(self) -> Expectations:
        return self.given.expect

    @property
    def policy(self) -> Policy | None:
        return self.given.policy

    # Reporting -----------------------------------------------------------------------------------
    def finding(
        self,
        message: str,
        *,
        node: Node | None = None,
        graph: Graph | None = None,
        location: Location | None = None,
        layer: int | None = None,
        fix: str | None = None,
        fix_form: str | None = None,
        related: Iterable[Node] = (),
        properties: dict[str, Any] | None = None,
    ) -> Finding:
        """A violation of this rule about a graph node (give node and graph) or a config key (give location).

        Its severity is the rule's: a fact of another severity is another rule's. Its layer is `layer`, else the
        node's, unless `related` holds nodes of other layers: a finding about several layers (every norm's epsilon,
        an attribute on every MoE node) is the model's, with no layer. The fix is said for the tool that made the
        model (rules.advice): never recommending that tool, and, given `fix_form` (a form of
        knowledge/producers.json), saying which of its releases writes that form."""
        if location is None:
            graph = graph or self.model
            location = Location(graph.path, label=graph.label)
        related = list(related)
        # the first MAX_RELATED_NODES names only: a finding about an expert loop relates thousands of nodes
        related_names = tuple(islice((n.display_name for n in related if n is not node), MAX_RELATED_NODES))
        if layer is None and node is not None:
            layer = node.layer
            if layer is not None and any(n.layer is not None and n.layer != layer for n in related):
                layer = None
        if fix and isinstance(self.given, LintInputs):  # a policy validated alone has no model, nor its producer
            fix = producer_fix(self.given.model, fix, fix_form)
        role = (graph or self.model).role if node is not None else None
        return Finding(
            code=self.rule.code,
            rule=self.rule.name,
            severity=self.rule.severity,
            message=printable(" ".join(message.split())),
            location=location,
            node=node.display_name if node is not None else None,
            op_type=printable(node.key) if node is not None else None,
            layer=layer,
            graph=node.graph if node is not None else None,
            fix=printable(" ".join(fix.split())) if fix else None,
            related_nodes=related_names,
            properties=tuple(sorted((properties or {}).items())),
            anchor=f"{role}:{node.key}" if node is not None else None,
            position=node.index if node is not None else None,
        )

    def undecided(self, reason: str, *, graph: Graph | None = None, node: Node | None = None,
                  location: Location | None = None, properties: dict[str, Any] | None = None) -> Finding:
        """The rule cannot decide on this input: said as an info finding of its own kind, never a crash or a silent
        pass. The gate never re-levels it: a policy that makes the rule an error does not make ignorance one."""
        found = self.finding(f"could not decide: {reason}", graph=graph, node=node, location=location,
                             properties=properties)
        return replace(found, severity=Severity.INFO, kind=Kind.UNDECIDED)

    def internal_error(self, exc: Exception) -> Finding:
        """The rule raised on this input: an info finding of its own kind (a gate must not crash on an odd graph)."""
        where = self.given.model.path if isinstance(self.given, LintInputs) else str(self.given.policy.path)
        found = self.finding(f"could not decide: internal error {type(exc).__name__}: {exc}", location=Location(where))
        return replace(found, severity=Severity.INFO, kind=Kind.INTERNAL_ERROR)


def judged_setups(ctx: RuleContext, value_of: Callable[[SessionSetup], Any]) -> list[SessionSetup]:
    """The declarations a rule about one setting judges, so that each fact is reported once.

    `value_of` gives a setup's value of the setting, comparable the way ORT reads it, or None when unset. The
    policy's declaration is always judged. genai_config.json's is judged alone when there is no policy, and beside
    the policy when the two target different providers, or when genai_config.json sets the value itself and the
    policy either leaves it unset or sets the same value. A value it leaves unset has the same default as the
    policy's (the policy's finding says it); a value that differs from the policy's is config-drift's.
    """
    policy, genai = ctx.deployment.policy_setup, ctx.deployment.genai_setup
    if policy is None or genai is None or policy.provider_name != genai.provider_name:
        return [s for s in (policy, genai) if s is not None]
    mine, theirs = value_of(policy), value_of(genai)
    if theirs is None or (mine is not None and mine != theirs):
        return [policy]
    return [policy, genai]


def layers_text(nodes: Iterable[Node]) -> str:
    """'in layer 3', 'in layers 0-39', 'in layers 0, 4, 8', or '' when no node has a layer."""
    layers = sorted({n.layer for n in nodes if n.layer is not None})
    if not layers:
        return ""
    if len(layers) == 1:
        return f"in layer {layers[0]}"
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"in layers {layers[0]}-{layers[-1]}"
    shown = ", ".join(str(layer) for layer in layers[:12])
    return f"in layers {shown}{', ...' if len(layers) > 12 else ''}"
