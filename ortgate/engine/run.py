"""`ortgate run`: the runner builds the policy's session for real and collects evidence; the same rules and
gate as `ortgate lint` then judge what it saw."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import LintRequest, LintResult, lint, load_inputs
from ortgate.engine.throughput import run_estimate
from ortgate.errors import InputError
from ortgate.evidence import EVIDENCE_KEY, RunEvidence
from ortgate.rules.context import LintInputs
from ortgate.runner.collect import RunRequest, collect
from ortgate.runner.progress import RunProgress
from ortgate.runner.settings import runner_settings


@dataclass
class RunOutcome:
    result: LintResult
    evidence: RunEvidence
    inputs: LintInputs
    estimate: object | None = None  # the cost model's Estimate for the device the run used (ortgate.cost)


def run_reference(request: RunRequest, *, progress: RunProgress | None = None, hard_exit: bool = False,
                  before_writing: Callable[[LintInputs], None] | None = None) -> RunOutcome:
    """Everything `ortgate run` does short of printing. Raises InputError (exit 2) or RunTimeout.

    `before_writing(inputs)` runs once every input file is known and before ORT writes the dump or the trace:
    the place to refuse an output that would replace an input."""
    from ortgate.runner.measure import Deadline

    progress = progress or RunProgress(enabled=False)
    progress.note("loading the model and policy")
    inputs = load_inputs(LintRequest(request.model, request.policy, None, request.config))
    if inputs.policy is None:
        raise InputError("`ortgate run` needs --policy: the session it builds is the policy's")
    settings = runner_settings(inputs.policy, warmup=request.warmup, iterations=request.iterations,
                               timeout_s=request.timeout_s)
    if before_writing is not None:
        before_writing(inputs)
    with ExitStack() as stack, Deadline(settings.timeout_s, hard_exit=hard_exit) as deadline:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ortgate-run-")))
        evidence = collect(request, inputs, settings, deadline, progress, workdir)
        inputs.evidence[EVIDENCE_KEY] = evidence
        progress.note("running the rules")
        config = gate_config_from(inputs.policy, cli_select=None, cli_ignore=None, fail_on=request.fail_on)
        result = lint(inputs, config)
        if request.dump is None and inputs.optimized is not None:
            result.summary["optimized_kept"] = False
        progress.note("estimating the measured device")
        found = run_estimate(inputs, evidence)
    est = None
    if found is not None:
        evidence.estimate, est = found
    return RunOutcome(result, evidence, inputs, est)
