"""The pipeline, written once: load the inputs, select the rules, run them, gate, decide.

`ortgate lint`, `ortgate run` (after the runner has added its evidence) and the tests all go through
`load_inputs` and `lint`; reporters format the LintResult it returns.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from ortgate.config.deployment import Deployment, OrtRelease, build_deployment, resolve_release
from ortgate.config.expectations import Expectations, decoder_layer_count, resolve_expectations
from ortgate.config.genai import GenaiConfig, load_genai_config
from ortgate.config.model_folder import resolve_model_path
from ortgate.config.policy import Policy, load_policy
from ortgate.config.reads import model_reads, policy_reads
from ortgate.engine.gate import GateConfig, Verdict, apply_gate, decide, selected_rules, stale_baseline_findings
from ortgate.engine.pricing import estimate_summary, price_findings
from ortgate.engine.throughput import CostOverrides, resolve_cost
from ortgate.errors import InputError
from ortgate.findings import Finding, number_occurrences
from ortgate.graph import Graph, build_graph
from ortgate.graph.dump import optimization_mismatch
from ortgate.graph.index import ort_load_refusal
from ortgate.graph.load import read_model_indexed
from ortgate.rules import Rule
from ortgate.rules.context import LintInputs, RuleContext
from ortgate.rules.needs import unmet

if TYPE_CHECKING:
    from ortgate.engine.compare import Comparison

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


def run_rules(inputs: LintInputs, rules: Iterable[Rule],
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
    model = getattr(inputs.model, "path", None)  # None: policy validation, which lints no model
    if model:
        about_policy = {r.code for r in rules if r.policy_only}
        findings = [f if f.code in about_policy else replace(f, models=(model,)) for f in findings]
    return findings


@dataclass
class LintResult:
    """What reporters format: the judged findings, the verdict, and a summary of what was linted."""

    findings: list[Finding]
    verdict: Verdict
    summary: dict
    rules: list[Rule]
    raw: list[Finding] = field(default_factory=list)  # the rules' findings before the gate
    comparison: Comparison | None = None  # against a base model (`--compare`, ortgate.engine.compare)


def lint(inputs: LintInputs | list[LintInputs], config: GateConfig,
         progress: Callable[[str], None] | None = None) -> LintResult:
    """Run the rules `config` selects over `inputs` (one model, or several under one policy), then gate and
    decide once: one report, one verdict."""
    rules = selected_rules(config)
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
    return judge(raw, inputs, config, rules)


def judge(raw: list[Finding], inputs: LintInputs | list[LintInputs], config: GateConfig,
          rules: list[Rule]) -> LintResult:
    """Gate the rules' findings (waivers, severities, baseline) and decide the verdict. With several models a
    waiver is unused only when it matched nothing in any of them."""
    findings = apply_gate(raw, config)
    findings = sorted(findings + stale_baseline_findings(config, linted_files(inputs)), key=Finding.sort_key)
    summary = summarize(inputs)
    active = [f for f in findings if f.suppressed is None]
    many = inputs if isinstance(inputs, list) else [inputs]
    for one, one_summary in zip(many, summary.get("models") or [summary]):
        # each model's estimate is for its own graph; config findings (no node) count for every model
        mine = [f for f in active if f.node is None or f.location.file in linted_files(one)]
        estimate = estimate_summary(one, mine)
        if estimate is not None:
            one_summary["estimate"] = estimate
    summary["not_checked"] = unchecked_families(inputs, rules)
    return LintResult(findings, decide(findings, config.fail_on), summary, rules, raw)


def unchecked_families(inputs: LintInputs | list[LintInputs], rules: list[Rule]) -> list[dict]:
    """The rule families selected for this lint that had nothing to judge in any model, with why: a lint without a
    policy says what it did not check instead of passing in silence. From the rules' own needs
    (ortgate.rules.needs): a family is named when its rules that need a declaration (a session, a provider, a
    policy, genai_config.json) are most of its selected rules and every one of them lacks one in every model; the
    reason is its first such rule's, in the first model. Families that share a reason are listed together."""
    from ortgate.rules.base import FAMILIES
    from ortgate.rules.needs import DECLARATIONS, missing_declaration

    many = inputs if isinstance(inputs, list) else [inputs]
    by_reason: dict[str, list[dict]] = {}
    for prefix, family in FAMILIES.items():
        selected = [r for r in rules if r.code.startswith(prefix)]
        declaring = [r for r in selected if any(n in DECLARATIONS for n in r.needs)]
        if not declaring or 2 * len(declaring) <= len(selected):
            continue
        reasons = [[missing_declaration(r.needs, one, family) for r in declaring] for one in many]
        if all(all(each) for each in reasons):
            by_reason.setdefault(str(reasons[0][0]), []).append(
                {"family": family, "prefix": prefix, "rules": len(selected)})
    return [{"families": families, "reason": reason} for reason, families in by_reason.items()]


def not_checked_text(gap: dict) -> str:
    """'session (OGS) and provider (OGP) rules: no policy ...' for reporters."""
    names = [f"{f['family']} ({f['prefix']})" for f in gap["families"]]
    listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{listed} rules: {gap['reason']}"


def linted_files(inputs: LintInputs | list[LintInputs]) -> list[str]:
    """The files findings can be about: the model, the optimized dump, genai_config.json, the policy chain (of
    every model linted)."""
    if isinstance(inputs, list):
        return list(dict.fromkeys(p for one in inputs for p in linted_files(one)))
    return [p for p in (inputs.model.path, inputs.optimized.path if inputs.optimized else None,
                        str(inputs.genai.path) if inputs.genai else None,
                        *(str(p) for p in (inputs.policy.chain if inputs.policy else ()))) if p]


def release_summary(ort: OrtRelease) -> dict:
    """The release the report judges: where it comes from and, when none is pinned, that it is assumed and how to
    pin it."""
    return {"version": ort.version, "source": ort.source, "assumed": not ort.pinned, "judged_as": ort.judged_as,
            "pin": None if ort.pinned else "execution_provider.onnxruntime_version or --ort-version"}


def summarize(inputs: LintInputs | list[LintInputs]) -> dict:
    """What was linted. Several models: `models` lists each one's summary; the shared policy and provider and
    the total node count stay at the top, `model` is None."""
    if isinstance(inputs, list):
        if len(inputs) == 1:
            return summarize(inputs[0])
        each = [summarize(one) for one in inputs]
        return {"models": each, "model": None, "optimized": None, "genai_config": None, "layers": None,
                "layer_attribution": None, "policy": each[0]["policy"], "policy_file": each[0]["policy_file"],
                "provider": each[0]["provider"], "deployment": each[0]["deployment"],
                "nodes": sum(s["nodes"] for s in each)}
    model = inputs.model
    return {
        "model": model.path,
        "optimized": inputs.optimized.path if inputs.optimized else None,
        "policy": inputs.policy.name if inputs.policy else None,
        "policy_file": str(inputs.policy.path) if inputs.policy else None,
        "genai_config": str(inputs.genai.path) if inputs.genai else None,
        "provider": inputs.deployment.provider,
        "deployment": {"onnxruntime_version": release_summary(inputs.deployment.ort)},
        "nodes": len(model.nodes),
        "layers": decoder_layer_count(model),  # found in the graph, whatever the policy expects
        "layer_attribution": model.layer_source,
    }
