"""`ortgate run`: the runner builds the policy's session for real and collects evidence; the same rules and
gate as `ortgate lint` then judge what it saw.

ORT refusing the model and --timeout are evidence, not errors: the run stops, and the report (with every static
finding and what was measured so far) still comes out, failing the gate."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from ortgate.engine.baseline import Baseline
from ortgate.engine.gate import GateConfig, gate_config_from, rebaseline, selected_rules
from ortgate.engine.pipeline import LintRequest, LintResult, judge, linted_files, load_inputs
from ortgate.engine.pipeline import collect as collect_findings
from ortgate.engine.throughput import run_estimate
from ortgate.errors import InputError
from ortgate.evidence import RunEvidence
from ortgate.rules.context import EVIDENCE_KEY, LintInputs
from ortgate.runner.collect import RunRequest, collect, record_timeout, start_evidence
from ortgate.runner.progress import RunProgress
from ortgate.runner.settings import runner_settings


@dataclass
class RunOutcome:
    result: LintResult
    evidence: RunEvidence
    inputs: LintInputs
    config: GateConfig  # what judged the run (against the baseline it writes, when it writes one)
    estimate: object | None = None  # the cost model's Estimate for the device the run used (ortgate.cost)
    baseline_text: str | None = None  # what to write to RunGate.write_baseline_to (None: no baseline to write)


@dataclass
class RunGate:
    """How the gate judges the run: rule selection and a findings baseline, as for `ortgate lint`."""

    select: list[str] | None = None
    ignore: list[str] | None = None
    baseline: Baseline | None = None
    baseline_path: str | None = None
    preview: bool = False  # rules in preview run too (--preview)
    # --write-baseline FILE, or the --baseline file --prune-baseline rewrites: the run judges against what it
    # writes there (the caller writes RunOutcome.baseline_text)
    write_baseline_to: str | None = None
    prune: bool = False


def run_reference(request: RunRequest, *, progress: RunProgress | None = None, hard_exit: bool = False,
                  before_writing: Callable[[LintInputs], None] | None = None, gate: RunGate | None = None,
                  emit: Callable[[RunOutcome], int] | None = None) -> RunOutcome:
    """Everything `ortgate run` does short of printing. Raises InputError (exit 2) on bad input.

    `before_writing(inputs)` runs once every input file is known and before ORT writes the dump or the trace:
    the place to refuse an output that would replace an input. `emit(outcome)` writes the reports and returns the
    exit code: with `hard_exit`, when --timeout passes inside a call ORT cannot interrupt, it is called from the
    watchdog with what the run has so far, and the process then exits with its code."""
    from ortgate.runner.measure import Deadline

    gate = gate or RunGate()
    progress = progress or RunProgress(enabled=False)
    progress.note("loading the model and policy")
    inputs = load_inputs(LintRequest(request.model, request.policy, None, request.config))
    if inputs.policy is None:
        raise InputError("`ortgate run` needs --policy: the session it builds is the policy's")
    settings = runner_settings(inputs.policy, warmup=request.warmup, iterations=request.iterations,
                               timeout_s=request.timeout_s)
    # Before the run: a typo in the policy's rules block or a bad baseline must not cost a long run.
    config = gate_config_from(inputs.policy, cli_select=gate.select, cli_ignore=gate.ignore, fail_on=request.fail_on,
                              baseline=gate.baseline, baseline_path=gate.baseline_path, preview=gate.preview)
    if before_writing is not None:
        before_writing(inputs)
    evidence = start_evidence(inputs)
    latest = [inputs]  # the inputs the run has so far: with ORT's dump once the policy session wrote it

    def judged() -> RunOutcome:
        inputs = latest[0].with_evidence(EVIDENCE_KEY, evidence)
        progress.note("running the rules")
        rules = selected_rules(config)
        raw = collect_findings(inputs, rules)
        judged_by, text = config, None
        if gate.write_baseline_to is not None:
            text, judged_by = rebaseline(raw, config, linted_files(inputs), gate.write_baseline_to, prune=gate.prune)
        result = judge(raw, inputs, judged_by, rules)
        if inputs.optimized is not None and inputs.optimized.label:
            label = inputs.optimized.label
            summary = replace(result.summary, optimized_kept=False,
                              models=tuple(replace(m, optimized=label) for m in result.summary.models))
            result = replace(result, summary=summary)
        est = None
        if evidence.measurement is not None:
            progress.note("estimating the measured device")
            found = run_estimate(inputs, evidence)
            if found is not None:
                evidence.estimate, est = found
        return RunOutcome(result, evidence, inputs, judged_by, est, text)

    def abandoned(timeout) -> int:
        assert emit is not None
        record_timeout(evidence, timeout, inputs)
        return emit(judged())

    on_hard_exit = abandoned if emit is not None else None
    with ExitStack() as stack, Deadline(settings.timeout_s, hard_exit=hard_exit, on_hard_exit=on_hard_exit) as deadline:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ortgate-run-")))
        latest[0] = collect(request, inputs, settings, deadline, progress, workdir, evidence,
                            on_dump=lambda new: latest.__setitem__(0, new))
        return judged()
