"""`ortgate fix` end to end: stage the rewritten model (ortgate.fix), lint it with the same pipeline as `ortgate lint`
(the findings it repaired must be gone), measure original vs fixed on CPU, then put the folder in place.

Nothing is written when verification fails, when a repaired finding is still there, or when anything raises: the
staged folder is removed and OUT is never created.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ortgate.cost import StepShape
from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import LintRequest, lint, load_inputs
from ortgate.findings import Finding
from ortgate.fix.pipeline import FixRequest, FixResult, discard_own_staging, fixable_rules, stage_fix
from ortgate.fix.verify import VerificationError


@dataclass
class Prediction:
    """The cost model's expected time of the step the measurement ran, for the device it ran on (an estimate)."""

    device: str
    figures: str  # where the device's figures come from ("probe": measured on this machine)
    original_ms: float
    fixed_ms: float
    uncounted: list[str] = field(default_factory=list)  # what the model could not count, in either graph

    @property
    def speedup(self) -> float | None:
        return self.original_ms / self.fixed_ms if self.fixed_ms > 0 else None


@dataclass
class FixOutcome:
    result: FixResult
    findings_before: list[Finding] = field(default_factory=list)  # the repaired rules' findings on the input
    findings_after: list[Finding] = field(default_factory=list)  # ... and on the output
    unrepaired: list[Finding] = field(default_factory=list)  # findings of rewritten layers still there (a failure)
    measurement: object | None = None  # ortgate.fix.measure.Measurement
    prediction: Prediction | None = None  # the cost model's estimate of the measured step, original and fixed
    failure: str | None = None

    @property
    def predicted_speedup(self) -> float | None:
        return self.prediction.speedup if self.prediction is not None else None

    @property
    def exit_code(self) -> int:
        return 1 if self.failure else 0


def run_fix(request: FixRequest, *, measure: bool = True, note: Callable[[str], None] | None = None) -> FixOutcome:
    try:
        return _run_fix(request, measure, note)
    except BaseException:
        discard_own_staging(request.output)  # an interrupt between two lines that each clean up
        raise


def _run_fix(request: FixRequest, measure: bool, note: Callable[[str], None] | None) -> FixOutcome:
    say = note or (lambda _m: None)
    staged = stage_fix(request, say)
    result = staged.result
    outcome = FixOutcome(result)
    codes = [c for c, kind in fixable_rules().items() if kind in result.kinds]
    try:
        config = gate_config_from(None, cli_select=codes, cli_ignore=None, fail_on=None)
        say("linting the input")
        outcome.findings_before = lint(load_inputs(LintRequest(result.model)), config).findings
        if staged.folder is None:
            return outcome
        verification = result.verification
        if verification is not None and not verification.passed:
            outcome.failure = _mismatch(result)
            staged.discard()
            return outcome
        say("linting the output")
        assert staged.model_file is not None
        fixed_inputs = load_inputs(LintRequest(str(staged.model_file)))
        outcome.findings_after = lint(fixed_inputs, config).findings
        rewritten_layers = {r.layer for r in result.rewrites}
        outcome.unrepaired = [f for f in outcome.findings_after if f.code == "OGF001" and f.layer in rewritten_layers]
        if outcome.unrepaired:
            outcome.failure = (f"{len(outcome.unrepaired)} moe-not-fused finding(s) remain in rewritten layers "
                               f"{sorted({f.layer for f in outcome.unrepaired}, key=str)}: nothing written")
            staged.discard()
            return outcome
        if measure and request.verify and not result.gained_cache:  # a cache-gaining fix: no common step to time
            from dataclasses import replace

            from ortgate.fix.measure import DECODE, decode_step, measure_pair

            settings = replace(DECODE, dims=dict(request.runner_dims))
            # Estimated first: the CPU probe then runs while no session holds a model's weights.
            say("estimating the decode step with the cost model")
            _, _, step = decode_step(staged.original_graph, settings)
            outcome.prediction = predict(staged.original_graph, fixed_inputs.executed, step)
            del fixed_inputs
            say("measuring original vs fixed on ONNX Runtime CPU")
            assert staged.original is not None
            nodes = result.nodes_before
            build = result.original_build
            skip = (f"the original ({nodes:,} nodes) is not timed: ONNX Runtime did not build its session within "
                    f"{build.limit_s:g} s (a bounded build, stopped at the limit)"
                    if result.original_too_large and build is not None else None)
            outcome.measurement = measure_pair(staged.original, staged.original_bytes_folder, staged.model_file,
                                               staged.original_graph, settings, skip_original=skip)
        staged.commit()
    except VerificationError as exc:
        outcome.failure = f"the fixed model does not run: {exc}; nothing written"
        staged.discard()
    except BaseException:
        staged.discard()
        raise
    return outcome


def predict(original, fixed, shape: StepShape) -> Prediction:
    """The cost model's expected step time of the original and the fixed graph, for the step the measurement times
    on ORT's CPU provider with ORT's default session options: the `cpu` device with the probe's figures for this
    machine, as `ortgate run` estimates a CPU run."""
    from ortgate.cost import CostSetup
    from ortgate.engine.throughput import measured_estimate
    from ortgate.knowledge.devices import find_device
    from ortgate.knowledge.provider_names import CPU

    device = find_device("cpu")
    assert device is not None
    setup = CostSetup(device, shape, CPU)
    before, after = measured_estimate(original, setup), measured_estimate(fixed, setup)
    uncounted = [f"original: {u.what}" for u in before.uncounted] + [f"fixed: {u.what}" for u in after.uncounted]
    return Prediction(before.device.name, before.device.bandwidth_gb_s.confidence or "catalog",
                      before.as_exported.expected_s * 1e3, after.as_exported.expected_s * 1e3, uncounted)


def _mismatch(result: FixResult) -> str:
    v = result.verification
    assert v is not None
    bad = [c.output for c in v.outputs if c.mismatched]
    first = v.first_divergent
    where = (f"; first rewritten node whose output diverges: {first.node} (output {first.value}, max abs diff "
             f"{first.comparison.max_abs_diff:.3g})" if first is not None and first.comparison is not None
             and first.comparison.max_abs_diff is not None else "")
    outputs = f"outputs {', '.join(bad)} differ" if bad else "a rewritten node's output differs"
    return f"verification failed: {outputs}{where}; nothing written"
