"""Runtime rules (OGR): what `ortgate run` saw the real ONNX Runtime session do.

These rules read the run evidence (`ortgate.evidence.RunEvidence`, in `LintInputs.evidence["run"]`) and
say nothing when there is none (plain `ortgate lint`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortgate.findings import Location, Severity
from ortgate.knowledge import compute_ops, memcpy_ops
from ortgate.knowledge.provider_names import CPU
from ortgate.rules.base import rule
from ortgate.rules.context import EVIDENCE_KEY, RuleContext

if TYPE_CHECKING:
    from ortgate.config.throughput import ThroughputPolicy
    from ortgate.evidence import RunEvidence

COMPUTE_OPS = compute_ops()
MEMCPY_OPS = frozenset(memcpy_ops())


def run_evidence(ctx: RuleContext) -> RunEvidence | None:
    evidence = ctx.inputs.evidence.get(EVIDENCE_KEY)
    if evidence is None:
        return None  # a lint: ortgate.evidence is never imported
    from ortgate.evidence import RunEvidence

    return evidence if isinstance(evidence, RunEvidence) else None


def _policy_location(ctx: RuleContext, *key: str) -> Location:
    if ctx.policy is not None:
        return ctx.policy.where(*key)
    return Location(ctx.model.path)


def _provider_location(ctx: RuleContext, run: RunEvidence) -> Location:
    return run.session.provider.location or _policy_location(ctx, "execution_provider")


@rule("OGR001", "ep-unavailable", Severity.ERROR, needs=("evidence",))
def ep_unavailable(ctx: RuleContext):
    """The execution provider the policy asks for cannot be created on the machine that ran the check.

    ## What it checks
    Before building the session, `ortgate run` creates the policy's provider on a one-node model and checks
    that the session really runs on it. `onnxruntime.get_available_providers()` cannot answer this:
    onnxruntime-gpu lists CUDAExecutionProvider and TensorrtExecutionProvider on machines without a GPU or
    without the CUDA / cuDNN libraries. With `--allow-cpu` the same config runs on CPUExecutionProvider
    instead, and ep-substituted says so.

    ## Why it costs throughput
    Asked for an unavailable provider, ORT logs an error and builds a CPU session: a CI job that "passes"
    there measured CPU, and a server deployed that way runs on the CPU while reporting no failure.

    ## Bad
    ```yaml evidence
    session:
      provider:
        requested: CUDAExecutionProvider
        available: false
        unavailable_reason: "libcublasLt.so.13: cannot open shared object file"
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
    ```

    ## Fix
    Run on a machine with the provider and its libraries (onnxruntime-gpu 1.31 needs CUDA 13 and cuDNN 9 on
    the library path), or pass `--allow-cpu` to check the config on CPU knowing that the figures are CPU's.
    """
    run = run_evidence(ctx)
    if run is None or run.session.provider.available or run.session.provider.substituted:
        return
    provider = run.session.provider
    reason = provider.unavailable_reason or "ORT did not create it"
    yield ctx.finding(
        f"{provider.requested} cannot be created on this machine: {reason}; nothing was measured",
        location=_provider_location(ctx, run),
        fix=f"Run on a machine with {provider.requested} and its libraries, or pass --allow-cpu to run the same "
            "config on CPU (figures labelled CPU).",
        properties={"provider": provider.requested},
    )


@rule("OGR009", "ep-substituted", Severity.INFO, needs=("evidence",))
def ep_substituted(ctx: RuleContext):
    """The policy's provider cannot be created here, and `--allow-cpu` ran the same config on CPUExecutionProvider.

    ## What it checks
    What ep-unavailable checks, when `ortgate run --allow-cpu` was asked to run the policy's session options on
    CPUExecutionProvider instead of a provider this machine cannot create. Every figure of the run is then a CPU
    figure, and the provider's options could not be verified.

    ## Why it costs throughput
    Nothing is lost on the deployment: this is a CI machine without the target device checking the config and
    the graph. The finding keeps anyone from reading the CPU figures as the GPU's.

    ## Bad
    ```yaml evidence
    session:
      provider:
        requested: CUDAExecutionProvider
        available: false
        unavailable_reason: no CUDA-capable device is detected
        ran_on: [CPUExecutionProvider]
        substituted: true          # ortgate run --allow-cpu
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
    ```

    ## Fix
    Nothing to fix; measure on the target device for figures that count.
    """
    run = run_evidence(ctx)
    if run is None or run.session.provider.available or not run.session.provider.substituted:
        return
    provider = run.session.provider
    yield ctx.finding(
        f"{provider.requested} cannot be created on this machine "
        f"({provider.unavailable_reason or 'ORT did not create it'}); the policy's config ran on {CPU} instead "
        "(--allow-cpu): every figure in this report is a CPU figure",
        location=_provider_location(ctx, run),
        properties={"provider": provider.requested, "ran_on": CPU},
    )


@rule("OGR002", "ep-fallback", Severity.ERROR, needs=("evidence",))
def ep_fallback(ctx: RuleContext):
    """The session runs on another execution provider than the one the policy asks for.

    ## What it checks
    After the session is created, `session.get_providers()[0]` against the policy's
    `execution_provider.name`, when the provider itself can be created on this machine (else see
    ep-unavailable). The message quotes the "EP Error" ORT printed while falling back.

    ## Why it costs throughput
    Python's `InferenceSession` catches a provider error (an option the provider rejects, a library that does
    not load, an out-of-memory at creation), prints "Falling back to ['CPUExecutionProvider']" and returns a
    working CPU session. Every step then runs on CPU and nothing fails.

    ## Bad
    ```yaml evidence
    session:
      provider:
        requested: CUDAExecutionProvider
        available: true
        ran_on: [CPUExecutionProvider]
        fallback_reason: "EP Error: unknown provider option cuda_graph_enable_partial. Falling back to ['CPUExecutionProvider']"
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
    ```

    ## Fix
    Read the quoted EP error: remove the option the provider rejects (see unknown-provider-option), fix its
    value, or free the device memory. Pass `enable_fallback=0` to `InferenceSession` in production code so a
    provider error fails loudly instead.
    """
    run = run_evidence(ctx)
    if run is None:
        return
    provider = run.session.provider
    if not provider.available or provider.substituted or provider.ran is None or provider.ran == provider.requested:
        return
    reason = f": {provider.fallback_reason}" if provider.fallback_reason else ""
    yield ctx.finding(
        f"the session runs on {', '.join(provider.ran_on)} although the policy asks for {provider.requested}, "
        f"which this machine can create{reason}",
        location=_provider_location(ctx, run),
        fix="Fix what made the provider fail (the EP error above); in production pass enable_fallback=0 so that a "
            "provider error raises instead of silently running on CPU.",
        properties={"provider": provider.requested, "ran_on": provider.ran},
    )


@rule("OGR003", "option-not-applied", Severity.ERROR, needs=("evidence",))
def option_not_applied(ctx: RuleContext):
    """A provider option of the policy is not in effect in the created session.

    ## What it checks
    Each key of the policy's `execution_provider.options` against `session.get_provider_options()` after
    creation, compared the way ORT parses them (booleans 0/1/true/false/True/False are equal). An option the
    provider reports with another value, or does not report at all, is not in effect.

    ## Why it costs throughput
    The provider decides what it honours: a key it ignores (the CPU provider ignores every option), a value it
    clamps or overrides, a build without the feature. A policy that says `enable_cuda_graph: "1"` on a session
    that reports "0" runs thousands of kernel launches per token that the policy claims are gone.

    ## Bad
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
      options:
        - {key: enable_cuda_graph, requested: "1", effective: "0", applied: false}
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
      options:
        - {key: enable_cuda_graph, requested: "1", effective: "1", applied: true}
    ```

    ## Fix
    Use a key the provider honours (its option catalog lists them), with a value of the documented type. CPU
    settings are session options (threads, arenas), not provider options.
    """
    run = run_evidence(ctx)
    if run is None:
        return
    provider = run.session.provider
    if run.session.options is None:
        setup = ctx.deployment.policy_setup
        if provider.substituted and setup is not None and setup.provider_options:
            yield ctx.undecided(f"{provider.requested}'s options were not verified: the session ran on {CPU} "
                                "(--allow-cpu)")
        return
    for check in run.session.options:
        if check.applied:
            continue
        actual = "does not report it" if check.effective is None else f"reports {check.effective!r}"
        yield ctx.finding(
            f"{provider.requested} option {check.key}={check.requested!r} is not in effect: the session {actual}",
            location=check.location or _provider_location(ctx, run),
            fix=f"Use an option {provider.requested} honours (see its option catalog), with a valid value.",
            properties={"provider": provider.requested, "option": check.key, "requested": check.requested,
                        "effective": check.effective},
        )


@rule("OGR004", "free-dim-unresolved", Severity.ERROR, needs=("evidence",))
def free_dim_unresolved(ctx: RuleContext):
    """A free-dimension override of the policy did not make the session's input shapes concrete.

    ## What it checks
    Each `session.free_dimension_overrides` entry against the input shapes the created session reports
    (`session.get_inputs()`): the dim must be gone from every input (pinned). An override naming a dim no
    input has is ignored by ORT without a word; the static rule free-dim-override-unknown reports it, and
    the run's report lists it as "no-such-dim".

    ## Why it costs throughput
    A pinned dim lets ORT fold shape computations, plan memory statically and select kernels for the real
    shape; CUDA graph capture needs fixed shapes. A dim the session still reports symbolic was not pinned,
    whatever the policy says, and the policy only looks fixed.

    ## Bad
    ```yaml evidence
    session:
      provider: {requested: CPUExecutionProvider, available: true, ran_on: [CPUExecutionProvider]}
      dims:
        - {dim: batch_size, value: 1, status: unresolved, inputs: ["input_ids[0]"]}
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CPUExecutionProvider, available: true, ran_on: [CPUExecutionProvider]}
      dims:
        - {dim: batch_size, value: 1, status: pinned}
    ```

    ## Fix
    Use the dim names of the model's inputs (`ortgate run` lists the session's input shapes in its JSON
    report), and check that no `free_dimension_overrides_by_denotation` entry conflicts with the override.
    """
    run = run_evidence(ctx)
    if run is None:
        return
    for check in run.session.dims:
        if check.status == "unresolved":
            yield ctx.finding(
                f"free-dimension override {check.dim}={check.value} did not apply: the session's inputs still have "
                f"symbolic {check.dim!r} ({', '.join(check.inputs[:4])})",
                location=check.location or _policy_location(ctx, "session", "free_dimension_overrides"),
                fix="Check the dim name and that no denotation override conflicts with it.",
                properties={"dim": check.dim, "value": check.value},
            )


@rule("OGR005", "optimization-changed-outputs", Severity.ERROR, needs=("evidence",))
def optimization_changed_outputs(ctx: RuleContext):
    """The policy's session computes different outputs than ORT_DISABLE_ALL on the same inputs.

    ## What it checks
    With `ortgate run --compare-default`, every output of the policy session against the same provider's
    session at ORT_DISABLE_ALL (no graph optimization), element-wise within a dtype-aware tolerance
    (float32: rtol 1e-3, atol 1e-4; float16: 1e-2, 1e-2; bfloat16: 2e-2, 2e-2; integers exact).

    ## Why it costs throughput
    A fusion must compute the same function faster. If results change beyond rounding, the speedup is a
    bug: a fused pattern matched something it should not have, or a kernel mishandles this shape. Shipping
    it trades correctness for tokens per second without anyone deciding to.

    ## Bad
    ```yaml evidence
    session:
      provider: {requested: CPUExecutionProvider, available: true, ran_on: [CPUExecutionProvider]}
    correctness:
      reference: ORT_DISABLE_ALL on CPUExecutionProvider
      outputs:
        - {output: logits, dtype: float, shape: [1, 1, 256], rtol: 0.001, atol: 0.0001, max_abs_diff: 0.41,
           mismatched: 57, total: 256}
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CPUExecutionProvider, available: true, ran_on: [CPUExecutionProvider]}
    correctness:
      reference: ORT_DISABLE_ALL on CPUExecutionProvider
      outputs:
        - {output: logits, dtype: float, shape: [1, 1, 256], rtol: 0.001, atol: 0.0001, max_abs_diff: 3.1e-7,
           mismatched: 0, total: 256}
    ```

    ## Fix
    Find the fusion (compare `--dump` against the model; bisect with graph_optimization_level and the
    session's disabled optimizers), report it to ONNX Runtime with the model, and pin a level or disable the
    optimizer that changes results until it is fixed.
    """
    run = run_evidence(ctx)
    if run is None or run.correctness is None:
        return
    for comparison in run.correctness.outputs:
        if comparison.ok:
            continue
        if comparison.max_abs_diff is None:
            detail = comparison.note or "not comparable"
        else:
            detail = (f"{comparison.mismatched} of {comparison.total} elements differ beyond atol {comparison.atol:g} "
                      f"+ rtol {comparison.rtol:g} (max |diff| {comparison.max_abs_diff:.3g})")
        yield ctx.finding(
            f"output {comparison.output!r} ({comparison.dtype}) differs from {run.correctness.reference}: {detail}",
            location=Location(ctx.model.path),
            fix="Find the fusion that changes results (compare the --dump with the model, lower "
                "graph_optimization_level to bisect) and disable it until ONNX Runtime fixes it.",
            properties={"output": comparison.output, "mismatched": comparison.mismatched},
        )


THRESHOLDS = (
    ("min_tokens_per_s", "tokens per second", lambda run: run.measurement.tokens_per_second, "min"),
    ("max_ms_per_token", "time per output token (ms, the p50 step)", lambda run: run.measurement.stats.p50_ms, "max"),
    ("max_p50_latency_ms", "p50 latency (ms)", lambda run: run.measurement.stats.p50_ms, "max"),
    ("max_p90_latency_ms", "p90 latency (ms)", lambda run: run.measurement.stats.p90_ms, "max"),
    ("max_p99_latency_ms", "p99 latency (ms)", lambda run: run.measurement.stats.p99_ms, "max"),
    ("min_speedup_vs_default", "speedup over ORT's default session", lambda run: run.speedup_vs_default, "min"),
)


@rule("OGR006", "throughput-target-missed", Severity.ERROR, needs=("evidence",))
def throughput_target_missed(ctx: RuleContext):
    """The measured throughput or latency misses a target in the policy's `throughput:` block.

    ## What it checks
    `min_tokens_per_s`, `max_ms_per_token` (the p50 step), `max_p50_latency_ms`, `max_p90_latency_ms`,
    `max_p99_latency_ms` and `min_speedup_vs_default` (needs `--compare-default`) against the runner's
    measurement. The targets apply only where the device the run used is `throughput.device` (a catalog device,
    matched by the GPU name the run reports, or `cpu`) or matches `throughput.match` (a glob such as
    "NVIDIA H100*"); without either, wherever the policy's own provider ran. Elsewhere each target is reported as
    undecided (not applicable on this machine), never as passed.

    ## Why it costs throughput
    Static rules predict; this is the measurement. A target in the policy turns "the model got slower" into
    a failing check in the pull request that made it slower.

    ## Bad
    ```yaml
    throughput: {device: h100-sxm, min_tokens_per_s: 120}
    ```

    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
    measurement:
      label: policy
      provider: CUDAExecutionProvider
      device: NVIDIA H100 80GB HBM3
      device_kind: gpu
      batch_size: 1
      new_tokens: 1
      warmup: 5
      stats: {iterations: 50, mean_ms: 14.0, min_ms: 13.1, p50_ms: 14.0, p90_ms: 14.6, p99_ms: 15.2, max_ms: 15.9}
      tokens_per_second: 71.4
    ```

    ## Good
    ```yaml
    throughput: {device: h100-sxm, min_tokens_per_s: 120}
    ```

    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
    measurement:
      label: policy
      provider: CUDAExecutionProvider
      device: NVIDIA H100 80GB HBM3
      device_kind: gpu
      batch_size: 1
      new_tokens: 1
      warmup: 5
      stats: {iterations: 50, mean_ms: 7.6, min_ms: 7.4, p50_ms: 7.6, p90_ms: 7.9, p99_ms: 8.3, max_ms: 8.8}
      tokens_per_second: 131.0
    ```

    ## Fix
    Look at the other findings of the same run first (fallback, unfused MoE/attention, CUDA graph off), then
    at `--profile`'s per-op table for where the time goes.
    """

    run = run_evidence(ctx)
    block = (ctx.policy.get("throughput") if ctx.policy else None) or {}
    targets = [t for t in THRESHOLDS if t[0] in block]
    if run is None or not targets:
        return
    not_applicable = _targets_not_applicable(run, ctx.inputs.throughput, ", ".join(t[0] for t in targets))
    if not_applicable is not None:
        reason, where, properties = not_applicable
        yield ctx.undecided(reason, location=_policy_location(ctx, *where), properties=properties)
        return
    m = run.measurement
    assert m is not None  # _targets_not_applicable says so when there is no measurement
    for key, label, measure, kind in targets:
        target, value = float(block[key]), measure(run)
        if value is None:
            yield ctx.undecided(f"throughput.{key} was not checked: measure the default session with --compare-default",
                                location=_policy_location(ctx, "throughput", key))
        elif value < target if kind == "min" else value > target:
            yield ctx.finding(
                f"{label} is {value:.4g} on {m.device} ({m.provider}); the policy asks for "
                f"{'at least' if kind == 'min' else 'at most'} {target:g}",
                location=_policy_location(ctx, "throughput", key),
                fix="Fix the run's other findings first; `ortgate run --profile` shows where the time goes.",
                properties={"target": key, "measured": round(value, 4), "limit": target, "device": m.device},
            )


def _targets_not_applicable(run: RunEvidence, tp: ThroughputPolicy | None, keys: str
                            ) -> tuple[str, tuple[str, ...], dict] | None:
    """Why the throughput targets cannot be judged on this run (the policy key to point at, properties), or None."""
    m = run.measurement
    if m is None:
        return f"throughput targets ({keys}) were not checked: {run.skipped or 'nothing was measured'}", ("throughput",), {}
    named = tp is not None and (tp.device is not None or tp.match is not None)
    if tp is not None and named and not tp.matches_reported(m.device):
        wanted = tp.device.name if tp.device is not None else repr(tp.match)
        key = "device" if tp.device is not None else "match"
        return ((f"throughput targets ({keys}) are not applicable on this machine: the run used {m.device}, the "
                f"targets are for device {wanted}"), ("throughput", key), {"device": m.device})
    if not named and run.cpu_figures:
        return ((f"throughput targets ({keys}) are not applicable on this machine: they are for "
                f"{run.session.provider.requested} and this run measured CPU (--allow-cpu)"), ("throughput",), {})
    return None


@rule("OGR007", "optimized-dump-unavailable", Severity.WARNING, needs=("evidence",))
def optimized_dump_unavailable(ctx: RuleContext):
    """ORT could not save the session's optimized model, so what it executes was not linted.

    ## What it checks
    `ortgate run` saves the optimized graph (`optimized_model_filepath`) and lints it with the graph rules.
    ORT refuses to save a graph in which a provider compiled nodes into engines (TensorRT, CANN graph mode);
    the runner then builds the session without the dump and says so here.

    ## Why it costs throughput
    The rules that read the optimized graph (FusedMatMul, fused norms, MoE and GQA surviving optimization)
    could not check the graph that runs; their silence is not a pass.

    ## Bad
    ```yaml evidence
    session:
      provider: {requested: TensorrtExecutionProvider, available: true, ran_on: [TensorrtExecutionProvider]}
      dump: {path: null, kept: false, reason: "Unable to serialize model as it contains compiled nodes"}
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
      dump: {path: model.optimized.onnx, kept: true}
    ```

    ## Fix
    Lint the optimized graph of the same model with a provider that does not compile (CUDA), or rely on
    `--profile`'s per-op table for the TensorRT deployment.
    """
    run = run_evidence(ctx)
    if run is None or run.session.dump is None or run.session.dump.path is not None:
        return
    yield ctx.finding(
        f"the optimized model was not linted: {run.session.dump.reason or 'ORT did not write it'}",
        location=_provider_location(ctx, run),
        fix="Lint the optimized dump of a provider that does not compile nodes (e.g. CUDA), or use --profile.",
    )


@rule("OGR008", "compute-off-requested-provider", Severity.WARNING, needs=("evidence",))
def compute_off_requested_provider(ctx: RuleContext):
    """Compute-heavy nodes run on the CPU provider in a session created for a GPU provider.

    ## What it checks
    ORT's graph assignment of the created session (`session.get_provider_graph_assignment_info()`): the
    compute-heavy nodes (MatMul, MoE, GroupQueryAttention, norms, ...) assigned to CPUExecutionProvider when
    the policy's provider is another one, and the Memcpy nodes copying between devices. Shape-computation
    nodes that GPU providers leave on CPU on purpose are not counted.

    ## Why it costs throughput
    A node without a kernel for the session's provider and dtype silently runs on CPU, with a device copy on
    each side: an fp32 GroupQueryAttention in a CUDA session (CUDA's GQA kernels are fp16/bf16 only) moves
    the KV cache to the host every step. CUDA graph capture fails outright when Memcpy nodes exist.

    ## Bad
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
      placement:
        CUDAExecutionProvider: {MatMul: 14, MoE: 2}
        CPUExecutionProvider: {GroupQueryAttention: 2, MemcpyToHost: 2, MemcpyFromHost: 2, Shape: 2}
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
      placement:
        CUDAExecutionProvider: {MatMul: 14, MoE: 2, GroupQueryAttention: 2}
        CPUExecutionProvider: {Shape: 2}
    ```

    ## Fix
    Export the model in a dtype the provider has kernels for (fp16/bf16 on CUDA), or replace the op; the
    kernel-coverage rules name the missing kernel.
    """
    run = run_evidence(ctx)
    if run is None or run.session.placement is None:
        return
    provider = run.session.provider
    if provider.requested == CPU or provider.substituted or provider.ran != provider.requested:
        return
    on_cpu = {op: n for op, n in run.session.placement.get(CPU, {}).items() if op in COMPUTE_OPS}
    memcpy = sum(n for ops in run.session.placement.values() for op, n in ops.items() if op in MEMCPY_OPS)
    if not on_cpu and not memcpy:
        return
    parts = []
    if on_cpu:
        parts.append(f"compute nodes on {CPU}: " + ", ".join(f"{op} x{n}" for op, n in sorted(on_cpu.items())))
    if memcpy:
        parts.append(f"{memcpy} Memcpy node{'s' if memcpy != 1 else ''} copy between devices")
    yield ctx.finding(
        f"{provider.requested} session: " + "; ".join(parts),
        location=_provider_location(ctx, run),
        fix=f"Give every compute node a {provider.requested} kernel (fp16/bf16 for CUDA's contrib ops).",
        properties={"provider": provider.requested, "cpu_ops": dict(sorted(on_cpu.items())), "memcpy": memcpy},
    )


def _failure_node(ctx: RuleContext, name: str | None):
    """The node ORT named, in the model or (a node ORT's optimizer made) in the optimized graph."""
    if not name:
        return None, None
    for graph in ctx.inputs.graphs:
        for node in graph.nodes:
            if node.name == name:
                return node, graph
    return None, None


@rule("OGR010", "session-failed", Severity.ERROR, needs=("evidence",))
def session_failed(ctx: RuleContext):
    """ONNX Runtime refused to create or to run a session of the model as the policy configures it.

    ## What it checks
    `ortgate run` creates the policy's session and runs it on inputs synthesised from the model's signature
    (and, with `--compare-default`, ORT's default and ORT_DISABLE_ALL sessions). When ORT raises instead (the
    model does not load, a kernel rejects an input, a node has no implementation for its types), the run stops
    there and this finding carries ORT's own message and the node it names. The static findings of the same
    report are unaffected.

    ## Why it costs throughput
    A model ORT cannot load or run serves nothing at all. Such models are shipped: an exporter writes an op
    with an input layout its kernel does not accept (onnxruntime-genai 0.18's Qwen3.5-MoE export feeds a 3-D
    position_ids to com.microsoft RotaryEmbedding, whose kernel takes 1-D or 2-D), and nothing checks it
    before a server tries to start.

    ## Bad
    ```yaml evidence
    session:
      provider: {requested: CPUExecutionProvider, available: true, ran_on: [CPUExecutionProvider]}
    failures:
      - kind: run
        session: policy
        phase: running the policy session once
        node: /model/layers.0/attn/rotary_emb
        message: "Input 'position_ids' is expected to have 0, 1, or 2 dimensions, got 3"
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CPUExecutionProvider, available: true, ran_on: [CPUExecutionProvider]}
    failures: []     # the session was created and ran
    ```

    ## Fix
    Read ORT's message: it names the node and the input or attribute it rejects. Re-export the model so that
    node matches its kernel's contract (`ortgate explain` of the graph findings on that node often says how),
    or run a newer ORT release whose kernel accepts it, and set the policy's provider to one that implements
    the node.
    """
    run = run_evidence(ctx)
    if run is None:
        return
    for failure in run.failures:
        if failure.kind == "timeout":
            continue
        node, graph = _failure_node(ctx, failure.node)
        what = "create" if failure.kind == "load" else "run"
        where = f"node {failure.node!r}: " if failure.node and node is None else ""
        yield ctx.finding(
            f"ORT could not {what} the {failure.session} session ({failure.phase}): {where}{failure.message}",
            node=node, graph=graph, location=None if node is not None else Location(ctx.model.path),
            fix="Make the node ORT names match its kernel's contract (re-export), or use an ORT release or "
                "provider that implements it; the message above is ORT's own.",
            properties={"session": failure.session, "stage": failure.kind, "ort_node": failure.node or ""},
        )


@rule("OGR011", "run-timeout", Severity.ERROR, needs=("evidence",))
def run_timeout(ctx: RuleContext):
    """`ortgate run` passed its `--timeout` before it finished: what it did not get to was not checked.

    ## What it checks
    `--timeout S` (or the policy's `runner.timeout_s`) bounds the whole run. When it passes, the run stops
    (a session run is interrupted; session creation, which ORT cannot interrupt, is abandoned after a grace
    period) and the report says in which phase. Everything measured before that point, and the static
    findings, are reported as usual.

    ## Why it costs throughput
    A model whose session takes minutes to create, or whose decode step takes seconds, is a deployment
    problem in itself (cold starts, health checks that kill the server), and a CI gate that hangs is switched
    off. A run that never finished proves nothing, so it fails the gate instead of passing silently.

    ## Bad
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true}
    timeout_s: 60
    failures:
      - {kind: timeout, session: policy, phase: creating the policy session, message: "passed --timeout 60s"}
    ```

    ## Good
    ```yaml evidence
    session:
      provider: {requested: CUDAExecutionProvider, available: true, ran_on: [CUDAExecutionProvider, CPUExecutionProvider]}
    timeout_s: 60
    failures: []     # the run finished within --timeout
    ```

    ## Fix
    Raise `--timeout` (or `runner.timeout_s`) if the machine is simply slow; lower `runner.iterations` or
    `runner.past_sequence_length` for a shorter measurement; if session creation is what takes the time, look
    at the optimizer (graph_optimization_level, a TensorRT engine build without an engine cache).
    """
    run = run_evidence(ctx)
    if run is None:
        return
    for failure in run.failures:
        if failure.kind != "timeout":
            continue
        limit = f" {run.timeout_s:g}s" if run.timeout_s is not None else ""
        yield ctx.finding(
            f"the run passed --timeout{limit} while {failure.phase}: nothing after that point was measured or "
            "checked",
            location=_policy_location(ctx, "runner", "timeout_s") if ctx.policy is not None and
            ctx.policy.get("runner", "timeout_s") is not None else Location(ctx.model.path),
            fix="Raise --timeout (or runner.timeout_s), shorten the measurement (runner.iterations, "
                "runner.past_sequence_length), or find what makes session creation slow.",
            properties={"phase": failure.phase, "session": failure.session},
        )
