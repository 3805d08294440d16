"""What `ortgate run` observes: build the policy's session for real, prove its settings, measure it.

Order: probe the provider -> build the session exactly as the policy declares it (with the optimized dump) ->
compare providers / options / input shapes with the policy -> synthesise inputs -> warm up and time ->
[--compare-default: ORT's default session, and outputs against ORT_DISABLE_ALL] -> [--profile] -> RunEvidence.
The runner observes; the rules and the gate (ortgate.engine) judge.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ortgate.config.deployment import SessionSetup, setup_from_policy
from ortgate.errors import InputError
from ortgate.evidence import Measurement, RunEvidence, SessionEvidence
from ortgate.graph import build_graph
from ortgate.graph.index import Graph
from ortgate.graph.load import read_model
from ortgate.graph.patterns.decoder import cacheless_decoder
from ortgate.knowledge.provider_names import CPU
from ortgate.rules.context import LintInputs
from ortgate.runner.progress import RunProgress
from ortgate.runner.settings import RunnerSettings

PROFILE_MAX_ITERATIONS = 10  # a profile needs a few steps, not the whole measurement


@dataclass
class RunRequest:
    model: str
    policy: str
    config: str | None = None
    dump: str | None = None
    profile: bool | str = False  # True: profile, trace not kept; a path: keep ORT's trace there
    warmup: int | None = None
    iterations: int | None = None
    compare_default: bool = False  # also measure ORT's default session and compare with ORT_DISABLE_ALL
    allow_cpu: bool = False
    allow_custom_ops: bool = False
    timeout_s: float | None = None
    fail_on: str | None = None


def start_evidence(inputs: LintInputs) -> RunEvidence:
    """The evidence `collect` fills in. Created before the run starts, so that whatever stops the run (a failure,
    --timeout) leaves the evidence gathered so far to be judged and reported."""
    from ortgate.runner import session as rs

    policy = inputs.policy
    assert policy is not None
    setup: SessionSetup = inputs.deployment.policy_setup or setup_from_policy(policy)
    # Not probed yet: "available" until the probe says otherwise, so that nothing is reported about a provider
    # this run never got to try.
    provider = rs.provider_check(setup, available=True, reason=None, ran_on=[], substituted=False,
                                 fallback_reason=None)
    evidence = RunEvidence(inputs.model.path, str(policy.path), SessionEvidence(provider))
    note = release_note(inputs)
    if note is not None:
        evidence.notes.append(note)
    return evidence


def release_note(inputs: LintInputs) -> str | None:
    """What the run measures is the onnxruntime installed here; the rules judge the deployment's release (the
    policy's, else the one ortgate assumes). Said where the two differ."""
    import onnxruntime

    installed = str(onnxruntime.__version__)
    ort = inputs.deployment.ort
    if installed == ort.version:
        return None
    judged = "the policy's execution_provider.onnxruntime_version" if ort.pinned else "the release ortgate assumes"
    return (f"measured on onnxruntime {installed}, the release installed here; the rules judge onnxruntime "
            f"{ort.version} ({judged}): a measurement does not speak for the deployment's release")


class SessionRunError(Exception):
    """A session ORT created failed to run: ORT's message, in one line."""

    def __init__(self, session: str, phase: str, message: str):
        self.session, self.phase, self.message = session, phase, message
        super().__init__(message)


def collect(request: RunRequest, inputs: LintInputs, settings: RunnerSettings, deadline, progress: RunProgress,
            workdir: Path, evidence: RunEvidence,
            on_dump: Callable[[LintInputs], None] | None = None) -> LintInputs:
    """Fill `evidence` and return the inputs the rules judge the run with: `inputs` with the session's optimized
    dump as the executed graph (`LintInputs.with_optimized`: priced as optimized) once ORT wrote one, else
    `inputs`. `on_dump` receives those inputs as soon as the dump is read (a --timeout report uses them). ORT
    refusing to create or run a session, and --timeout, end the run and are recorded in `evidence.failures` (the
    runtime rules report them); bad input is an InputError."""
    from ortgate.runner import session as rs
    from ortgate.runner.measure import RunTimeout

    evidence.timeout_s = settings.timeout_s
    judged = [inputs]

    def dumped(new: LintInputs) -> None:
        judged[0] = new
        if on_dump is not None:
            on_dump(new)

    try:
        _collect(request, inputs, settings, deadline, progress, workdir, evidence, dumped)
    except rs.SessionCreationError as exc:
        _failed(evidence, "load", exc.session, f"creating the {exc.session} session", exc.detail, inputs)
    except SessionRunError as exc:
        _failed(evidence, "run", exc.session, exc.phase, exc.message, inputs)
    except RunTimeout as exc:
        _failed(evidence, "timeout", _session_of(exc.phase), exc.phase, str(exc), inputs)
    return judged[0]


def record_timeout(evidence: RunEvidence, timeout, inputs: LintInputs) -> None:
    """--timeout passed while ORT could not be interrupted: what the report says about it."""
    _failed(evidence, "timeout", _session_of(timeout.phase), timeout.phase, str(timeout), inputs)


def _session_of(phase: str) -> str:
    for label in ("policy", "default", "reference", "profiled"):
        if label in phase or (label == "reference" and "ORT_DISABLE_ALL" in phase):
            return label
    return "policy"


def _failed(evidence: RunEvidence, kind: str, session: str, phase: str, message: str, inputs: LintInputs) -> None:
    from ortgate.evidence import RunFailure
    from ortgate.runner.session import failing_node

    evidence.failures.append(RunFailure(kind, session, phase, message, failing_node(message)))
    if evidence.measurement is None and evidence.skipped is None:
        what = "the run passed --timeout" if kind == "timeout" else f"ORT could not {'create' if kind == 'load' else 'run'} the {session} session"
        evidence.skipped = f"{what} ({phase})"


def _collect(request: RunRequest, inputs: LintInputs, settings: RunnerSettings, deadline, progress: RunProgress,
             workdir: Path, evidence: RunEvidence, dumped: Callable[[LintInputs], None]) -> None:
    from ortgate.runner import session as rs

    policy = inputs.policy
    assert policy is not None
    setup: SessionSetup = inputs.deployment.policy_setup or setup_from_policy(policy)
    libraries = tuple(rs.custom_op_libraries(inputs.model, setup, allowed=request.allow_custom_ops))
    requested = setup.provider_name or CPU

    deadline.enter(f"probing {requested}")
    progress.note(f"probing {requested}")
    available, reason = rs.provider_availability(requested)
    substituted = not available and request.allow_cpu
    evidence.session.provider = rs.provider_check(setup, available=available, reason=reason, ran_on=[],
                                                  substituted=substituted, fallback_reason=None)
    if not available and not request.allow_cpu:
        evidence.skipped = f"{requested} is not available on this machine (pass --allow-cpu to run on CPU)"
        return
    run_provider = CPU if substituted else requested

    # The policy session, exactly as declared (on CPU with --allow-cpu), with the optimized dump.
    from ortgate.runner.measure import MemoryProbe, plan_binding

    requested_options = {k: str(s.value) for k, s in setup.provider_options.items()} if not substituted else {}
    memory = MemoryProbe(plan_binding(run_provider, requested_options))
    memory.start()
    dump_path = request.dump or str(workdir / (Path(inputs.model.path).stem + ".optimized.onnx"))
    deadline.enter("creating the policy session")
    progress.note(f"creating the policy session on {run_provider}")
    built = rs.create_session(inputs.model.path, setup, kind="policy", provider=run_provider if substituted else None,
                              dump_path=dump_path, libraries=libraries, record_placement=True,
                              large_model=bool(inputs.model.external_data_files))
    session = built.session
    evidence.notes.extend(built.notes)
    ran_on = list(session.get_providers())
    evidence.session = _session_evidence(setup, built, inputs.model, ran_on, available, reason, substituted,
                                         request.dump is not None)
    if built.dump is not None and built.dump.path:
        progress.note("loading the optimized dump")
        dump_graph = optimized_graph(built.dump.path, inputs.model, kept=request.dump is not None)
        inputs = inputs.with_optimized(dump_graph)
        dumped(inputs)
        if substituted:
            evidence.notes.append(f"the optimized dump is {CPU}'s: {requested} would optimize differently")

    feeds = _feeds(inputs, setup, settings, session)
    evidence.dims = dict(feeds.dims)
    evidence.feeds = feeds.describe()

    effective = session.get_provider_options().get(ran_on[0], {})
    evidence.measurement, policy_bound = _measure(
        "policy", session, ran_on[0], effective, feeds, settings, deadline, progress, memory, evidence,
        prefill=cacheless_decoder(inputs.model) is not None)
    policy_outputs, output_types = policy_bound.outputs(), policy_bound.output_types()
    del session, built

    if request.compare_default:
        # The policy session stays alive so that the two sessions can be timed in turn, round by round: their ratio
        # then has a spread, and a difference inside the machine's noise is said to be.
        evidence.baseline, evidence.correctness = _baseline(inputs, ran_on[0], feeds, settings, deadline, progress,
                                                            libraries, policy_outputs, output_types, evidence,
                                                            policy_bound)
    del policy_bound
    if request.profile:
        evidence.profile = _profile(request, inputs, setup, run_provider if substituted else None, feeds, settings,
                                    deadline, progress, libraries, workdir, evidence)


def optimized_graph(dump_path: str, model: Graph, *, kept: bool) -> Graph:
    """The session's optimized model as a graph the rules read, its layers carried from `model` where node names
    survived. A temporary dump is deleted when the run ends, so its findings point at MODEL, labelled as its
    optimized graph, never at a file that no longer exists."""
    graph = build_graph(read_model(dump_path), dump_path if kept else model.path, role="optimized", reference=model)
    graph.label = None if kept else f"optimized graph of {model.path}"
    return graph


def _session_evidence(setup: SessionSetup, built, model: Graph, ran_on: list[str], available: bool,
                      reason: str | None, substituted: bool, dump_kept: bool) -> SessionEvidence:
    from dataclasses import replace

    from ortgate.runner import session as rs
    from ortgate.runner.inputs import graph_signature, session_signature

    session = built.session
    provider = rs.provider_check(setup, available=available, reason=reason, ran_on=ran_on, substituted=substituted,
                                 fallback_reason=built.fallback_reason)
    options = None
    if not substituted and ran_on and ran_on[0] == provider.requested:
        options = rs.option_checks(setup, session.get_provider_options().get(ran_on[0], {}))
    session_inputs = session_signature(session)
    dump = built.dump
    if dump is not None and dump.path:
        dump = replace(dump, kept=dump_kept)
    return SessionEvidence(
        provider=provider,
        options=options,
        dims=rs.dim_checks(setup, graph_signature(model), session_inputs),
        input_shapes={s.name: list(s.shape) if s.shape is not None else None for s in session_inputs},
        placement=rs.placement(session),
        dump=dump,
        ort_messages=built.messages,
    )


def _feeds(inputs: LintInputs, setup: SessionSetup, settings: RunnerSettings, session):
    from ortgate.runner import inputs as ri

    policy = inputs.policy
    assert policy is not None  # `ortgate run` requires a policy (engine.run checks it first)
    signature = ri.graph_signature(inputs.model)
    overrides = {name: (int(s.value), s.location) for name, s in setup.free_dimension_overrides.items()}
    dims, step = ri.resolve_dims(signature, settings, overrides,
                                 window=ri.sliding_window(inputs.model, inputs.genai),
                                 head=ri.head_size(policy, inputs.genai), policy_file=str(policy.path))
    context = inputs.genai.data["model"].get("context_length") if inputs.genai else None
    if isinstance(context, int) and not isinstance(context, bool) and step.context > context:
        loc = settings.where("past_sequence_length") or settings.where("sequence_length")
        raise InputError(f"past {step.past} + {step.new_tokens} new tokens exceed the model's "
                         f"context_length {context} (genai_config.json): lower runner.past_sequence_length",
                         loc.file if loc else policy.path, line=loc.line if loc else None)
    feeds = ri.synthesize(signature, dims, step, ri.token_inputs(inputs.model, inputs.genai),
                          policy_file=str(policy.path))
    for spec in ri.session_signature(session):
        array = feeds.arrays.get(spec.name)
        if array is None or spec.shape is None:
            continue
        for axis, (want, have) in enumerate(zip(spec.shape, array.shape)):
            if isinstance(want, int) and want != have:
                raise InputError(f"input {spec.name!r}: the session pins axis {axis} to {want} but the runner's dims "
                                 f"give {have}; set runner.dims to agree with session.free_dimension_overrides",
                                 policy.path)
    return feeds


def _measure(label: str, session, provider: str, effective: dict[str, str], feeds, settings: RunnerSettings,
             deadline, progress: RunProgress, memory, evidence: RunEvidence,
             iterations: int | None = None, prefill: bool = False) -> tuple[Measurement, Any]:
    """The session measured, and its bound session (outputs of the last run, ready for more runs)."""
    from ortgate.runner.measure import (
        BoundSession,
        device_info,
        latency_stats,
        plan_binding,
        timed_runs,
        tokens_per_second,
    )
    from ortgate.runner.session import captured_output

    plan = plan_binding(provider, effective)
    warmup = settings.warmup
    if warmup < plan.min_warmup:
        evidence.notes.append(f"{label} session: {plan.min_warmup} warm-up runs instead of {warmup}: CUDA graph "
                              "captures after the first regular runs")
        warmup = plan.min_warmup
    iterations = iterations or settings.iterations
    bound = BoundSession(session, plan, feeds)
    deadline.enter(f"running the {label} session once", bound)
    try:
        with captured_output():  # the first run is where a bad input fails: ORT's log line must not leak
            bound.discover_outputs()
    except Exception as exc:
        if deadline.expired:
            from ortgate.runner.measure import RunTimeout

            raise RunTimeout(deadline.limit_s, deadline.phase) from None
        raise SessionRunError(label, f"running the {label} session once on the synthesised inputs",
                              _one_line(exc)) from None
    with progress.phase(f"{label} session: {warmup} warm-up + {iterations} timed runs", warmup + iterations) as tick:
        try:
            latencies = timed_runs(bound, warmup, iterations, deadline, label=label, tick=tick)
        except Exception as exc:
            from ortgate.runner.measure import RunTimeout

            if isinstance(exc, RunTimeout):
                raise
            raise SessionRunError(label, f"measuring the {label} session", _one_line(exc)) from None
    peak, source = memory.stop() if memory is not None else (None, None)
    stats = latency_stats(latencies)
    device = device_info(plan)
    step = feeds.step
    measurement = Measurement(
        label=label, provider=provider, device=device.name, device_kind=device.kind,
        batch_size=step.batch, new_tokens=step.new_tokens, warmup=warmup, stats=stats,
        tokens_per_second=tokens_per_second(step.batch, step.new_tokens, stats),
        io_binding=True, cuda_graph=plan.cuda_graph, peak_memory_bytes=peak, memory_source=source,
        latencies_ms=[round(x * 1000.0, 4) for x in latencies], prefill=prefill,
    )
    return measurement, bound


def _baseline(inputs: LintInputs, provider: str, feeds, settings: RunnerSettings, deadline, progress: RunProgress,
              libraries: tuple[str, ...], policy_outputs: dict, output_types: dict, evidence: RunEvidence,
              policy_bound=None):
    from ortgate.evidence import Correctness
    from ortgate.runner import session as rs
    from ortgate.runner.compare import compare_outputs
    from ortgate.runner.measure import BoundSession, plan_binding

    # No memory figure for the default session: it reuses memory the policy session freed, so its RSS growth
    # would understate it.
    deadline.enter("creating ORT's default session")
    progress.note(f"creating ORT's default session on {provider}")
    default = rs.create_session(inputs.model.path, None, kind="default", provider=provider, libraries=libraries)
    effective = default.session.get_provider_options().get(provider, {})
    baseline, default_bound = _measure("default", default.session, provider, effective, feeds, settings, deadline,
                                       progress, None, evidence)
    if policy_bound is not None:
        from ortgate.runner.measure import alternated_rounds, round_ratio

        progress.note("timing the policy and default sessions in alternated rounds")
        policy_rounds, default_rounds = alternated_rounds([policy_bound, default_bound], settings.iterations, deadline,
                                                          labels=["policy", "default"])
        evidence.versus_default = round_ratio(default_rounds, policy_rounds)
    del default, default_bound

    deadline.enter("creating the ORT_DISABLE_ALL reference session")
    progress.note("running the ORT_DISABLE_ALL reference session")
    reference = rs.create_session(inputs.model.path, None, kind="reference", provider=provider, libraries=libraries)
    bound = BoundSession(reference.session, plan_binding(provider, {}), feeds)
    deadline.enter("running the ORT_DISABLE_ALL reference session", bound)
    try:
        with rs.captured_output():
            bound.discover_outputs()
    except Exception as exc:
        if deadline.expired:
            from ortgate.runner.measure import RunTimeout

            raise RunTimeout(deadline.limit_s, deadline.phase) from None
        raise SessionRunError("reference", "running the ORT_DISABLE_ALL reference session", _one_line(exc)) from None
    from ortgate.runner.inputs import written_positions

    written = written_positions(inputs.model, feeds.step)
    correctness = Correctness(f"ORT_DISABLE_ALL on {provider}",
                              compare_outputs(policy_outputs, bound.outputs(), output_types, written))
    return baseline, correctness


def _profile(request: RunRequest, inputs: LintInputs, setup: SessionSetup, provider: str | None, feeds,
             settings: RunnerSettings, deadline, progress: RunProgress, libraries: tuple[str, ...], workdir: Path,
             evidence: RunEvidence):
    from ortgate.runner import session as rs
    from ortgate.runner.profile import load_profile, summarize_profile

    deadline.enter("creating the profiled session")
    progress.note("creating the profiled session")
    built = rs.create_session(inputs.model.path, setup, kind="policy", provider=provider,
                              profile_prefix=str(workdir / "ortgate_profile"), libraries=libraries)
    session = built.session
    ran = session.get_providers()[0]
    effective = session.get_provider_options().get(ran, {})
    iterations = min(settings.iterations, PROFILE_MAX_ITERATIONS)
    _measure("profiled", session, ran, effective, feeds, settings, deadline, progress, None, evidence,
             iterations=iterations)
    trace = session.end_profiling()
    kept = None
    if isinstance(request.profile, str):
        _copy_replacing(trace, Path(request.profile))
        kept = request.profile
    return summarize_profile(load_profile(trace), file=kept)


def _one_line(exc: BaseException) -> str:
    from ortgate.runner.session import _first_line

    return _first_line(exc)


def _copy_replacing(source: Path, target: Path) -> None:
    """Copy to a temporary file beside `target`, then rename: an interrupted copy never leaves half a trace."""
    target = target.resolve()
    if target.exists() and not target.is_file():  # a FIFO or a device is written in place, never replaced
        shutil.copyfile(source, target)
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", target) from None
    finally:
        tmp.unlink(missing_ok=True)
