"""The pipeline, written once: load the inputs, select the rules, run them, gate, decide.

`ortgate lint`, `ortgate run` (after the runner has added its evidence) and the tests all go through
`load_inputs` and `lint`; reporters format the LintResult it returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ortgate.config.deployment import Deployment, OrtRelease, build_deployment, resolve_release
from ortgate.config.expectations import Expectations, decoder_layer_count, resolve_expectations
from ortgate.config.genai import GenaiConfig, load_genai_config
from ortgate.config.model_folder import resolve_model_path
from ortgate.config.policy import Policy, load_policy
from ortgate.config.reads import model_reads, policy_reads
from ortgate.engine.gate import GateConfig, Verdict, decide, gate, selected_rules, stale_baseline_findings
from ortgate.engine.pricing import EstimateHeadline, estimate_summary, price_findings
from ortgate.engine.throughput import CostOverrides, resolve_cost
from ortgate.errors import InputError
from ortgate.findings import Finding, number_occurrences
from ortgate.graph import Graph, build_graph
from ortgate.graph.dump import optimization_mismatch
from ortgate.graph.index import ort_load_refusal
from ortgate.graph.load import read_model_indexed
from ortgate.rules import Rule
from ortgate.rules.context import LintInputs, PolicyInputs, RuleContext
from ortgate.rules.needs import unmet

# Set in the test suite so that a rule's bug fails the test instead of becoming an info finding.
STRICT_ENV = "ORTGATE_STRICT"


@dataclass
class LintRequest:
    """One model to lint, with the policy, optimized dump and genai_config.json given with it."""

    model: str
    policy: str | None = None
    optimized: str | None = None
    config: str | None = None
    cost: CostOverrides | None = None  # `ortgate estimate`'s device / batch / context flags
    ort_version: str | None = None  # --ort-version: judge the deployment on this ONNX Runtime release


def load_inputs(request: LintRequest, progress: Callable[[str], None] | None = None) -> LintInputs:
    note = progress or (lambda _msg: None)
    files = resolve_model_path(request.model)
    config_path = request.config or files.genai_config
    genai: GenaiConfig | None = load_genai_config(config_path) if config_path else None
    policy: Policy | None = load_policy(request.policy) if request.policy else None
    note(f"loading {files.model}")
    proto, weights = read_model_indexed(files.model)
    note(f"indexing {len(proto.graph.node):,} nodes of {files.model.name}")
    model = build_graph(proto, str(files.model), role="model", initializers=weights)
    del proto, weights
    # A pinned release (--ort-version, the policy's) is judged; an assumed one is not enough to refuse the model as
    # bad input: without a pin, only what no release ortgate has measured loads is refused.
    ort = resolve_release(policy, request.ort_version)
    refusal = ort_load_refusal(model, ort.version if ort.pinned else None)
    if refusal is not None:
        raise InputError(refusal, files.model)
    optimized = None
    if request.optimized:
        note(f"loading {request.optimized}")
        proto, weights = read_model_indexed(request.optimized)
        note(f"indexing {len(proto.graph.node):,} nodes of {Path(request.optimized).name}")
        optimized = build_graph(proto, str(request.optimized), role="optimized", reference=model,
                                initializers=weights)
        del proto, weights
        mismatch = optimization_mismatch(model, optimized)
        if mismatch is not None:
            raise InputError(f"not an optimization of {files.model}: {mismatch}", request.optimized)
    note("matching MoE and attention patterns")
    deployment = build_deployment(policy, genai, request.ort_version)
    expect = resolve_expectations(policy, genai, model)
    files_read = [*model_reads(files.model, model.external_data_files, files.genai_config,
                               Path(config_path) if config_path else None), *policy_reads(policy)]
    if optimized is not None:
        files_read += model_reads(Path(optimized.path), optimized.external_data_files)
    return build_inputs(model, optimized, deployment, expect, policy, genai, files_read, request.cost)


def build_inputs(model: Graph, optimized: Graph | None, deployment: Deployment, expect: Expectations,
                 policy: Policy | None, genai: GenaiConfig | None, files_read: Iterable[Path],
                 cost: CostOverrides | None = None, *, priced: bool = True) -> LintInputs:
    """The one place a LintInputs is made: the files read, the throughput block and the cost setup for the graph
    ORT executes (the dump, priced as optimized, when there is one). `priced=False`: no cost setup (policy
    validation prices nothing and never probes the CPU)."""
    throughput, setup, gap = (resolve_cost(policy, deployment, optimized=optimized is not None, overrides=cost)
                              if priced else (None, None, None))
    read = list(files_read)
    overrides = cost or CostOverrides()
    prompt = overrides.prompt or (throughput.prompt_length if throughput is not None else None)
    batches = overrides.batches or (throughput.batch_sizes if throughput is not None else ())
    return LintInputs(model, optimized, deployment, expect, policy, genai, files_read=tuple(dict.fromkeys(read)),
                      cost=setup, throughput=throughput, prompt_length=prompt, batch_sizes=tuple(batches),
                      cost_gap=gap)


def run_rules(inputs: LintInputs | PolicyInputs, rules: Iterable[Rule],
              progress: Callable[[str], None] | None = None) -> list[Finding]:
    findings: list[Finding] = []
    strict = os.environ.get(STRICT_ENV) == "1"
    rules = list(rules)
    for number, rule in enumerate(rules, 1):
        if progress is not None:
            progress(f"rule {number}/{len(rules)}: {rule.code} {rule.name}")
        if unmet(rule.needs, inputs):
            continue  # it finds nothing without them (tests/rule_inputs.check_needs holds every rule case to that)
        ctx = RuleContext(inputs, rule)
        try:
            findings.extend(number_occurrences(list(rule.check(ctx) or ())))
        except InputError:
            raise
        except Exception as exc:  # a CI gate must not crash on an odd graph: say the rule could not decide
            if strict:
                raise
            findings.append(ctx.internal_error(exc))
    model = inputs.model.path if isinstance(inputs, LintInputs) else None  # a policy validated alone: no model
    if model:
        about_policy = {r.code for r in rules if r.policy_only}
        findings = [f if f.code in about_policy else replace(f, models=(model,)) for f in findings]
    return findings


@dataclass(frozen=True)
class ReleaseSummary:
    """The ONNX Runtime release the report judges: where it comes from and, when none is pinned, that it is assumed
    and how to pin it (the JSON report's `inputs.deployment.onnxruntime_version`)."""

    version: str
    source: str
    assumed: bool
    judged_as: str
    pin: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "source": self.source, "assumed": self.assumed, "judged_as": self.judged_as,
                "pin": self.pin}


def release_summary(ort: OrtRelease) -> ReleaseSummary:
    """The release the report judges, said for the reports."""
    return ReleaseSummary(ort.version, ort.source, not ort.pinned, ort.judged_as,
                          None if ort.pinned else "execution_provider.onnxruntime_version or --ort-version")


@dataclass(frozen=True)
class ModelSummary:
    """What one linted model was: its files, the policy and provider it was judged for, its size, and the estimate
    of its decode step (the JSON report's `inputs`, or one of its `models`)."""

    model: str
    optimized: str | None = None  # the dump's path, or "optimized graph of MODEL" (`ortgate run`, not kept)
    policy: str | None = None  # the policy's name
    policy_file: str | None = None
    genai_config: str | None = None
    provider: str | None = None
    nodes: int = 0
    layers: int | None = None  # decoder layers found in the graph, whatever the policy expects
    layer_attribution: str | None = None
    estimate: EstimateHeadline | None = None  # the estimate's headline (None: nothing priced)
    release: ReleaseSummary | None = None  # the ONNX Runtime release the deployment is judged on

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"model": self.model, "optimized": self.optimized, "policy": self.policy,
               "policy_file": self.policy_file, "genai_config": self.genai_config, "provider": self.provider,
               "nodes": self.nodes, "layers": self.layers, "layer_attribution": self.layer_attribution}
        if self.release is not None:
            out["deployment"] = {"onnxruntime_version": self.release.to_dict()}
        if self.estimate is not None:
            out["estimate"] = self.estimate.to_dict()
        return out


@dataclass(frozen=True)
class FamilyGap:
    """A rule family that had nothing to judge: its name, code prefix and how many of its rules were selected."""

    family: str
    prefix: str
    rules: int


@dataclass(frozen=True)
class NotChecked:
    """Rule families that had nothing to judge in any model, for one reason (see unchecked_families)."""

    families: tuple[FamilyGap, ...]
    reason: str

    def text(self) -> str:
        """'session (OGS) and provider (OGP) rules: no policy ...' for reporters."""
        names = [f"{f.family} ({f.prefix})" for f in self.families]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        return f"{listed} rules: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"families": [{"family": f.family, "prefix": f.prefix, "rules": f.rules} for f in self.families],
                "reason": self.reason}


@dataclass(frozen=True)
class LintSummary:
    """What was linted: each model (one, or several under one policy) and the rule families that had nothing to
    judge. The shared policy and provider are the first model's; `nodes` adds up every model's."""

    models: tuple[ModelSummary, ...]
    not_checked: tuple[NotChecked, ...] = ()  # rule families with nothing to judge, by reason (unchecked_families)
    optimized_kept: bool | None = None  # `ortgate run`: False when ORT's optimized dump was judged and not kept

    @property
    def several(self) -> bool:
        return len(self.models) > 1

    @property
    def model(self) -> str | None:
        """The model's path; None for several."""
        return None if self.several else self.models[0].model

    @property
    def policy(self) -> str | None:
        return self.models[0].policy

    @property
    def policy_file(self) -> str | None:
        return self.models[0].policy_file

    @property
    def provider(self) -> str | None:
        return self.models[0].provider

    @property
    def nodes(self) -> int:
        return sum(m.nodes for m in self.models)

    @property
    def layers(self) -> int | None:
        return None if self.several else self.models[0].layers

    @property
    def release(self) -> ReleaseSummary | None:
        """The release the (first) model's deployment is judged on."""
        return self.models[0].release

    @property
    def estimate(self) -> EstimateHeadline | None:
        """The one model's estimate; None for several (each model has its own)."""
        return None if self.several else self.models[0].estimate

    def to_dict(self) -> dict:
        """The JSON report's `inputs` object."""
        if self.several:
            out: dict[str, Any] = {"models": [m.to_dict() for m in self.models], "model": None, "optimized": None,
                   "genai_config": None, "layers": None, "layer_attribution": None, "policy": self.policy,
                   "policy_file": self.policy_file, "provider": self.provider, "nodes": self.nodes}
            if self.models[0].release is not None:
                out["deployment"] = {"onnxruntime_version": self.models[0].release.to_dict()}
        else:
            out = self.models[0].to_dict()
        out["not_checked"] = [gap.to_dict() for gap in self.not_checked]
        if self.optimized_kept is not None:
            out["optimized_kept"] = self.optimized_kept
        return out


@dataclass(frozen=True)
class LintResult:
    """What reporters format: the judged findings, the verdict, and a summary of what was linted. A value: what
    changes it (`ortgate run` naming the dump it did not keep) makes another (dataclasses.replace)."""

    findings: list[Finding]
    verdict: Verdict
    summary: LintSummary
    rules: list[Rule]
    raw: list[Finding] = field(default_factory=list)  # the rules' findings before the gate
    # Against a base model (`--compare`): an ortgate.engine.compare.Comparison, which this module does not import
    # (the comparison lints the base through it).
    comparison: Any = None


def lint(inputs: LintInputs | list[LintInputs], config: GateConfig,
         progress: Callable[[str], None] | None = None) -> LintResult:
    """Run the rules `config` selects over `inputs` (one model, or several under one policy), then gate and
    decide once: one report, one verdict."""
    rules = selected_rules(config)
    return judge(collect(inputs, rules, progress), inputs, config, rules)


def collect(inputs: LintInputs | list[LintInputs], rules: list[Rule],
            progress: Callable[[str], None] | None = None) -> list[Finding]:
    """The rules' findings over `inputs`, priced, before the gate: each fact about a shared file once."""
    many = inputs if isinstance(inputs, list) else [inputs]
    raw: list[Finding] = []
    seen: dict[str, int] = {}
    for one in many:
        found = run_rules(one, rules, progress)
        if one.estimate is not None and progress is not None:
            progress("pricing the findings")
        for f in price_findings(found, one):
            # The same fact about a shared file (the policy, a base it extends) is reported once, not per model;
            # it remembers every model it was found in.
            key = repr(replace(f, models=()))
            if key not in seen:
                seen[key] = len(raw)
                raw.append(f)
            else:
                first = raw[seen[key]]
                raw[seen[key]] = replace(first, models=tuple(dict.fromkeys((*first.models, *f.models))))
    return raw


def judge(raw: list[Finding], inputs: LintInputs | list[LintInputs], config: GateConfig,
          rules: list[Rule]) -> LintResult:
    """Gate the rules' findings (waivers, severities, baseline) and decide the verdict. With several models a
    waiver is unused only when it matched nothing in any of them."""
    gated = gate(raw, config)
    stale = stale_baseline_findings(config, linted_files(inputs), gated.matched)
    findings = sorted(gated.findings + stale, key=Finding.sort_key)
    active = [f for f in findings if f.suppressed is None]
    many = inputs if isinstance(inputs, list) else [inputs]
    models = []
    for one in many:
        # each model's estimate is for its own graph; config findings (no node) count for every model
        mine = [f for f in active if f.node is None or f.location.file in linted_files(one)]
        models.append(replace(summarize(one), estimate=estimate_summary(one, mine)))
    summary = LintSummary(tuple(models), tuple(unchecked_families(inputs, rules)))
    return LintResult(findings, decide(findings, config.fail_on), summary, rules, raw)


def unchecked_families(inputs: LintInputs | list[LintInputs], rules: list[Rule]) -> list[NotChecked]:
    """The rule families selected for this lint that had nothing to judge in any model, with why: a lint without a
    policy says what it did not check instead of passing in silence. From the rules' own needs
    (ortgate.rules.needs): a family is named when its rules that need a declaration (a session, a provider, a
    policy, genai_config.json) are most of its selected rules and every one of them lacks one in every model; the
    reason is its first such rule's, in the first model. Families that share a reason are listed together."""
    from ortgate.rules.base import FAMILIES
    from ortgate.rules.needs import DECLARATIONS, missing_declaration

    many = inputs if isinstance(inputs, list) else [inputs]
    by_reason: dict[str, list[FamilyGap]] = {}
    for prefix, family in FAMILIES.items():
        selected = [r for r in rules if r.code.startswith(prefix)]
        declaring = [r for r in selected if any(n in DECLARATIONS for n in r.needs)]
        if not declaring or 2 * len(declaring) <= len(selected):
            continue
        reasons = [[missing_declaration(r.needs, one, family) for r in declaring] for one in many]
        if all(all(each) for each in reasons):
            by_reason.setdefault(str(reasons[0][0]), []).append(FamilyGap(family, prefix, len(selected)))
    return [NotChecked(tuple(families), reason) for reason, families in by_reason.items()]


def not_checked_text(gap: NotChecked) -> str:
    """'session (OGS) and provider (OGP) rules: no policy ...' for reporters."""
    return gap.text()


def linted_files(inputs: LintInputs | list[LintInputs]) -> list[str]:
    """The files findings can be about: the model, the optimized dump, genai_config.json, the policy chain (of
    every model linted)."""
    if isinstance(inputs, list):
        return list(dict.fromkeys(p for one in inputs for p in linted_files(one)))
    return [p for p in (inputs.model.path, inputs.optimized.path if inputs.optimized else None,
                        str(inputs.genai.path) if inputs.genai else None,
                        *(str(p) for p in (inputs.policy.chain if inputs.policy else ()))) if p]


def summarize(inputs: LintInputs) -> ModelSummary:
    """What one linted model was (its estimate is added once its findings are judged)."""
    model = inputs.model
    return ModelSummary(
        model=model.path,
        optimized=inputs.optimized.path if inputs.optimized else None,
        policy=inputs.policy.name if inputs.policy else None,
        policy_file=str(inputs.policy.path) if inputs.policy else None,
        genai_config=str(inputs.genai.path) if inputs.genai else None,
        provider=inputs.deployment.provider,
        nodes=len(model.nodes),
        layers=decoder_layer_count(model),  # found in the graph, whatever the policy expects
        layer_attribution=model.layer_source,
        release=release_summary(inputs.deployment.ort),
    )
