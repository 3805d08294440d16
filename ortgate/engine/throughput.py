"""The device and decode step the cost model prices: the policy's `throughput:` block (or `ortgate estimate`'s
flags), its calibration, and for the `cpu` device the probe's figures measured on this machine."""

from __future__ import annotations

from dataclasses import dataclass

from ortgate.config.deployment import Deployment
from ortgate.config.policy import Policy
from ortgate.config.throughput import DEFAULT_CONTEXT, ThroughputPolicy, throughput_policy
from ortgate.cost import CostSetup, StepShape
from ortgate.errors import InputError
from ortgate.knowledge import graph_capture_option
from ortgate.knowledge.devices import Device, Figure, device_names, find_device, suggest_device
from ortgate.knowledge.provider_names import CPU
from ortgate.rules.context import LintInputs

TRUE_VALUES = ("1", "true", "True")


@dataclass(frozen=True)
class CostOverrides:
    """`ortgate estimate`'s flags: they replace what the policy says."""

    device: str | None = None
    batch: int | None = None
    context: int | None = None
    prompt: int | None = None  # prompt tokens per sequence (the prefill estimate)
    batches: tuple[int, ...] = ()  # batches to sweep (`--batch 1,8,32`)
    probe: bool = False  # `ortgate estimate --probe`: measure this machine for a `cpu` device without figures


UNMEASURED_CPU = ("the cpu device has no figures of its own: ortgate measures no machine unless asked, so that a "
                  "report is a function of its inputs. Calibrate once with `ortgate run MODEL --policy P "
                  "--write-calibration FILE` and name FILE in throughput.calibration, or measure this machine for "
                  "one estimate with `ortgate estimate MODEL --device cpu --probe` (both need ONNX Runtime: "
                  "pip install 'ortgate[cpu]')")


def needs_figures(device: Device) -> bool:
    """Whether `device` lacks the figures an estimate needs (the `cpu` device before a calibration or a probe)."""
    return device.kind == "cpu" and (device.bandwidth is None or device.kernel_us.value is None)


def device_named(name: str, source: str = "--device") -> Device:
    device = find_device(name)
    if device is None:
        hints = suggest_device(name)
        hint = (f"; did you mean {' or '.join(repr(h) for h in hints[:3])}?" if hints
                else f"; known devices: {', '.join(device_names())}")
        raise InputError(f"{source}: unknown device {name!r}{hint}")
    return device


def resolve_cost(policy: Policy | None, deployment: Deployment, *, optimized: bool,
                 overrides: CostOverrides | None = None
                 ) -> tuple[ThroughputPolicy | None, CostSetup | None, str | None]:
    """The policy's throughput block, the CostSetup it prices (None: no device named anywhere, or a device without
    figures) and why a named device is not priced (None: priced, or none named). `optimized`: the executed graph is
    ORT's optimized dump."""
    overrides = overrides or CostOverrides()
    tp = throughput_policy(policy)
    if overrides.device is not None:
        device = device_named(overrides.device)
    elif tp is not None and tp.device is not None:
        device = tp.device
    else:
        return tp, None, None
    if tp is not None and tp.calibration is not None and tp.device is not None and tp.device.name == device.name:
        device = tp.calibration.apply(device)
    if needs_figures(device):
        if not overrides.probe:
            return tp, None, UNMEASURED_CPU
        device = with_probe(device, _threads(deployment), tp)
    shape = _shape(tp, overrides)
    primary = deployment.primary
    provider = primary.provider_name if primary is not None else None
    if device.kind == "cpu":
        provider = CPU
    elif provider == CPU:
        provider = None  # a CPU session priced on a GPU: the GPU's usual provider
    option = graph_capture_option(provider) if provider else None
    cuda_graph = bool(primary is not None and option and primary.option(option) in TRUE_VALUES)
    level = primary.effective_optimization_level if primary is not None else None
    return tp, CostSetup(device, shape, provider, level, cuda_graph, optimized=optimized,
                         ort_release=deployment.ort.judged_as), None


def _shape(tp: ThroughputPolicy | None, overrides: CostOverrides) -> StepShape:
    batch = overrides.batch or (tp.batch_size if tp else 1)
    new_tokens = tp.new_tokens if tp else 1
    context = overrides.context or (tp.context_length if tp else DEFAULT_CONTEXT)
    return StepShape(batch, new_tokens, context)


def _threads(deployment: Deployment) -> int | None:
    primary = deployment.primary
    if primary is None:
        return None
    setting = primary.session_attributes.get("intra_op_num_threads")
    return int(setting.value) if setting is not None and isinstance(setting.value, int) else None


def with_probe(device: Device, threads: int | None, tp: ThroughputPolicy | None = None) -> Device:
    """The cpu device with the figures its probe measures on this machine (a calibration's figures still win)."""
    from ortgate.runner.probe import probe_cpu, session_threads

    try:
        probe = probe_cpu(session_threads(threads))
    except ModuleNotFoundError as exc:
        if exc.name != "onnxruntime":
            raise
        raise InputError("measuring this machine's CPU (the cpu device without a calibration) needs ONNX Runtime, "
                         "which is not installed: pip install 'ortgate[cpu]', or name a calibration in "
                         "throughput.calibration") from None
    source = (f"probe on this machine: {probe.threads} intra-op thread{'s' if probe.threads != 1 else ''}, "
              f"{probe.seconds:.2f} s, spread {probe.spread:.0%} between runs")
    figures = {
        "bandwidth_gb_s": Figure(round(probe.bandwidth_gb_s, 2), source, "probe"),
        "cache_bandwidth_gb_s": Figure(round(probe.cache_bandwidth_gb_s, 2), source, "probe"),
        "kernel_us": Figure(round(probe.node_us, 3), source, "probe"),
        "graph_kernel_us": Figure(round(probe.node_us, 3), source, "probe"),
        "tflops": {"float": Figure(round(probe.float_tflops, 4), source, "probe")},
    }
    if probe.cache_bytes:
        reported = (f" (the system reports {probe.reported_cache_bytes / 2**20:,.0f} MiB)"
                    if probe.reported_cache_bytes else "")
        figures["cache_bytes"] = Figure(float(probe.cache_bytes), "the largest weight the probe read at cache speed, "
                                        f"doubling from 16 MiB{reported}", "probe")
    keep = {k: getattr(device, k) for k in ("bandwidth_gb_s", "kernel_us", "graph_kernel_us")
            if getattr(device, k).value is not None}
    device = device.with_figures(**figures)
    if keep:
        device = device.with_figures(**keep)
    if tp is not None and tp.calibration is not None and tp.device is not None and tp.device.name == device.name:
        device = tp.calibration.apply(device)
    return device


# ---- `ortgate run`: the estimate beside the measurement, and the calibration it can write -------------------------


def measured_estimate(graph, setup: CostSetup, threads: int | None = None, tp: ThroughputPolicy | None = None):
    """The cost model's Estimate of `graph` for a step a measurement ran: a `cpu` device without figures of its own
    gets the probe's, measured on this machine with the session's intra-op threads (`threads`, None: ORT's default)."""
    from dataclasses import replace

    from ortgate.cost import estimate

    device = setup.device
    if needs_figures(device):
        setup = replace(setup, device=with_probe(device, threads, tp))
    return estimate(graph, setup)


def run_estimate(inputs: LintInputs, evidence) -> tuple[dict, object] | None:
    """The estimate for the device the run used and the graph it ran (ORT's dump when there is one), beside the
    measured p50 step: (plain dict for the report, the Estimate). None when nothing was measured or the device is
    not in the catalog."""
    from ortgate.knowledge.devices import device_for_reported_name

    m = evidence.measurement
    if m is None:
        return None
    tp = inputs.throughput
    if m.device_kind == "cpu":
        device = find_device("cpu")
    elif tp is not None and tp.device is not None and tp.matches_reported(m.device):
        device = tp.device
    else:
        device = device_for_reported_name(m.device)
    if device is None:
        return ({"device": None, "reported": m.device,
                 "note": f"{m.device} is not in ortgate's device catalog: no estimate to compare with"}, None)
    calibrated = False
    if tp is not None and tp.calibration is not None and tp.device is not None and tp.device.name == device.name:
        device = tp.calibration.apply(device)
        calibrated = True
    context = int(evidence.dims.get("total_sequence_length") or 0) or (
        int(evidence.dims.get("past_sequence_length", 0)) + m.new_tokens) or DEFAULT_CONTEXT
    setup = CostSetup(device, StepShape(m.batch_size, m.new_tokens, context), m.provider,
                      inputs.deployment.primary.effective_optimization_level if inputs.deployment.primary else None,
                      m.cuda_graph, optimized=inputs.optimized is not None,
                      ort_release=inputs.deployment.ort.judged_as)
    est = measured_estimate(inputs.executed, setup, _threads(inputs.deployment), tp)
    device = est.device
    step = est.as_exported
    measured_s = m.stats.p50_ms / 1e3
    return ({
        "estimate": True,
        "device": device.name,
        "reported": m.device,
        "figures": "calibrated" if calibrated else device.bandwidth_gb_s.confidence,
        "graph": inputs.executed.path,
        "batch_size": m.batch_size,
        "new_tokens": m.new_tokens,
        "context_length": context,
        "ms_per_step_expected": round(step.expected_s * 1e3, 6),
        "ms_per_step_ceiling": round(step.ceiling_s * 1e3, 6),
        "tokens_per_s_expected": None if step.tokens_per_s_expected is None else round(step.tokens_per_s_expected, 3),
        "tokens_per_s_ceiling": None if step.tokens_per_s_ceiling is None else round(step.tokens_per_s_ceiling, 3),
        "tokens_per_s_measured": round(m.tokens_per_second, 3),
        "measured_vs_expected": round(step.expected_s / measured_s, 4) if measured_s > 0 else None,
        "bytes_per_step": round(step.totals.bytes),
        "kernel_launches": step.totals.launches,
    }, est)


def calibration_yaml(est, evidence, policy_path: str) -> str:
    """A calibration file from a run: the device's figures as the estimate used them, with the memory efficiency
    (or, when launches dominate the step, the per-kernel time) fitted so that the estimate meets the measured p50."""
    import yaml

    m = evidence.measurement
    step = est.as_exported
    device = est.device
    measured = m.stats.p50_ms / 1e3
    roofline = step.totals.roofline_cache_s if step.in_cache else step.totals.roofline_s
    overhead = step.overhead_s
    efficiency = device.memory_efficiency.value or 1.0
    kernel = step.kernel_us
    if roofline >= overhead and measured > overhead:
        efficiency = max(0.01, min(1.0, efficiency * roofline / (measured - overhead)))
        fitted = "memory_efficiency"
    elif step.totals.launches and measured > roofline:
        kernel = (measured - roofline - step.totals.syncs * step.sync_us * 1e-6) / step.totals.launches * 1e6
        fitted = "kernel_us" if not step.cuda_graph else "graph_kernel_us"
    else:
        fitted = "nothing (the measurement is below the estimate's floor)"
    figures: dict = {"bandwidth_gb_s": round(device.bandwidth_gb_s.value or 0.0, 3)}
    if device.cache_bytes.value and device.cache_bandwidth_gb_s.value:
        figures["cache_bytes"] = int(device.cache_bytes.value)
        figures["cache_bandwidth_gb_s"] = round(device.cache_bandwidth_gb_s.value, 3)
    key = "graph_kernel_us" if step.cuda_graph and device.is_gpu_like else "kernel_us"
    figures[key] = round(kernel, 4)
    if device.kind == "cpu":
        figures["graph_kernel_us"] = round(kernel, 4)
    figures["memory_efficiency"] = round(efficiency, 4)
    tflops = {k: round(v.value, 4) for k, v in device.tflops.items() if v.value is not None}
    if tflops:
        figures["tflops"] = tflops
    document = {
        "device": device.name,
        "measured_on": m.device,
        "fitted": fitted,
        "figures": figures,
        "evidence": {
            "model": evidence.model,
            "policy": policy_path,
            "provider": m.provider,
            "cuda_graph": m.cuda_graph,
            "batch_size": m.batch_size,
            "new_tokens": m.new_tokens,
            "context_length": est.setup.shape.context,
            "measured_ms_per_step_p50": round(m.stats.p50_ms, 6),
            "estimated_ms_per_step_before": round(step.expected_s * 1e3, 6),
            "bytes_per_step": round(step.totals.bytes),
            "kernel_launches": step.totals.launches,
        },
    }
    header = (f"# ortgate calibration: {device.name} figures measured by `ortgate run` on {m.device}.\n"
              "# Name this file in a policy (throughput.calibration) so `ortgate lint` estimates with these figures.\n"
              "# Calibrate on a model like the ones you gate: a tiny model measures dispatch, not bandwidth.\n")
    return header + yaml.safe_dump(document, sort_keys=False)
