"""The policy's `throughput:` block: the device, the targets, the step the estimate is for, and calibrated figures.

    throughput:
      device: h100-sxm               # a device of the catalog (`ortgate estimate --list-devices`)
      min_tokens_per_s: 120          # batch x new tokens per second, at least
      max_ms_per_token: 8            # each sequence's time per output token (the step time), at most
      batch_size: 1                  # sequences per step (default: runner.batch_size, else 1)
      context_length: 4096           # positions each step attends to (default: runner.past_sequence_length + 1)
      batch_sizes: [1, 8, 32]        # batches `ortgate estimate` sweeps
      prompt_length: 2048            # prompt tokens per sequence: the prefill (time to first token) estimate
      max_ttft_ms: 400               # time to first token, at most (needs prompt_length)
      max_memory_share: 0.9          # warn above this share of the device's memory (default 0.9)
      max_regression: 0.05           # fail when tokens/s as exported drops by more than 5% against --compare BASE
      calibration: h100-calibration.yaml   # figures measured by `ortgate run --write-calibration`
      # or inline: calibration: {memory_efficiency: 0.55, kernel_us: 4.0}
      max_p50_latency_ms: 9          # measured by `ortgate run` only (also p90 / p99, min_speedup_vs_default)
      match: "NVIDIA H100*"          # optional glob on the GPU name `ortgate run` reports, when the catalog's miss it

`min_tokens_per_s` and `max_ms_per_token` are judged statically by `ortgate lint` (an estimate for the device)
and measured by `ortgate run` on a machine whose device matches; the latency percentiles and the speedup over
ORT's defaults can only be measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ortgate.config.policy import Policy, confine, policy_schema
from ortgate.config.source import load_yaml
from ortgate.errors import InputError
from ortgate.findings import Location
from ortgate.knowledge.devices import Device, Figure, device_names, find_device, suggest_device

DEFAULT_CONTEXT = 2048
# Targets `ortgate lint` judges statically, and those only a measurement can judge.
STATIC_TARGETS = ("min_tokens_per_s", "max_ms_per_token", "max_ttft_ms")
DEFAULT_MEMORY_SHARE = 0.9
MEASURED_TARGETS = ("max_p50_latency_ms", "max_p90_latency_ms", "max_p99_latency_ms", "min_speedup_vs_default")
TARGETS = STATIC_TARGETS + MEASURED_TARGETS
# Calibration keys -> the Device figure they replace.
CALIBRATION_FIGURES = {
    "bandwidth_gb_s": "bandwidth_gb_s",
    "kernel_us": "kernel_us",
    "graph_kernel_us": "graph_kernel_us",
    "sync_us": "sync_us",
    "memory_efficiency": "memory_efficiency",
    "compute_efficiency": "compute_efficiency",
    "moe_efficiency": "kind_efficiency.moe",
    "cache_bytes": "cache_bytes",
    "cache_bandwidth_gb_s": "cache_bandwidth_gb_s",
    "memory_gib": "memory_gib",
}
CALIBRATION_KEYS = tuple(CALIBRATION_FIGURES) + ("tflops",)
MAX_CALIBRATION_BYTES = 1 << 20


@dataclass(frozen=True)
class StepBounds:
    """The largest step a policy's `throughput:` may describe (its schema's maxima), which the command line's
    --batch / --context / --prompt are held to as well: beyond them an estimate is arithmetic on nonsense."""

    batch: int
    context: int
    prompt: int
    batch_sizes: int  # entries of a batch sweep


def step_bounds() -> StepBounds:
    props = policy_schema()["properties"]["throughput"]["properties"]
    return StepBounds(props["batch_size"]["maximum"], props["context_length"]["maximum"],
                      props["prompt_length"]["maximum"], props["batch_sizes"]["maxItems"])


@dataclass(frozen=True)
class Calibration:
    """Figures a team measured on its own device, replacing the catalog's."""

    figures: dict[str, float]  # calibration key -> value
    tflops: dict[str, float] = field(default_factory=dict)  # dtype -> TFLOP/s
    source: str = ""  # "policy.yaml:12" or the calibration file
    device: str | None = None  # the device the file was measured for (a file names it)
    measured_on: str | None = None
    path: Path | None = None  # the calibration file (None: inline figures)

    def apply(self, device: Device) -> Device:
        changes: dict[str, Any] = {}
        kind_efficiency: dict[str, Figure] = {}
        for key, value in self.figures.items():
            figure = Figure(float(value), f"calibrated: {self.source}", "calibrated")
            target = CALIBRATION_FIGURES[key]
            if target.startswith("kind_efficiency."):
                kind_efficiency[target.split(".", 1)[1]] = figure
            else:
                changes[target] = figure
        if kind_efficiency:
            changes["kind_efficiency"] = kind_efficiency
        if self.tflops:
            changes["tflops"] = {k: Figure(float(v), f"calibrated: {self.source}", "calibrated")
                                 for k, v in self.tflops.items()}
        return device.with_figures(**changes) if changes else device


@dataclass(frozen=True)
class ThroughputPolicy:
    """The `throughput:` block, checked: a catalog device, targets, the step's shape, calibration."""

    device: Device | None
    device_location: Location | None
    targets: dict[str, float]
    locations: dict[str, Location]
    batch_size: int
    new_tokens: int
    context_length: int
    calibration: Calibration | None
    match: str | None
    block_location: Location
    batch_sizes: tuple[int, ...] = ()
    prompt_length: int | None = None
    memory_share: float = DEFAULT_MEMORY_SHARE
    memory_share_given: bool = False
    max_regression: float | None = None  # the share of tokens/s a change may lose against its base (--compare)

    @property
    def static_targets(self) -> dict[str, float]:
        return {k: v for k, v in self.targets.items() if k in STATIC_TARGETS}

    @property
    def measured_only(self) -> dict[str, float]:
        return {k: v for k, v in self.targets.items() if k in MEASURED_TARGETS}

    def where(self, key: str) -> Location:
        return self.locations.get(key, self.block_location)

    def device_with_figures(self) -> Device | None:
        """The catalog device with the calibration's figures (the cpu device still needs its probe)."""
        if self.device is None:
            return None
        return self.calibration.apply(self.device) if self.calibration else self.device

    def matches_reported(self, reported: str) -> bool:
        """Whether the device `ortgate run` reports is the one these targets are for."""
        if self.match:
            from ortgate.evidence import DeviceInfo, device_matches  # `ortgate run` only: a lint never loads evidence

            kind = "cpu" if reported.strip().lower().startswith("cpu") else "gpu"
            return device_matches(self.match, DeviceInfo(kind, reported))
        return self.device is not None and self.device.matches(reported)


def throughput_policy(policy: Policy | None) -> ThroughputPolicy | None:
    """The checked `throughput:` block of `policy`, or None when it has none. Bad values are an InputError (exit 2):
    an unknown device (with a did-you-mean), a target without a device, an unreadable calibration file."""
    if policy is None:
        return None
    block = policy.get("throughput")
    if not isinstance(block, dict):
        return None
    targets = {k: float(block[k]) for k in TARGETS if k in block}
    locations = {k: policy.where("throughput", k) for k in block}
    device = None
    name = block.get("device")
    if name is not None:
        device = find_device(str(name))
        if device is None:
            where = policy.where("throughput", "device")
            hints = suggest_device(str(name))
            hint = (f"; did you mean {' or '.join(repr(h) for h in hints[:3])}?" if hints
                    else f"; known devices: {', '.join(device_names())}")
            raise InputError(f"throughput.device: unknown device {name!r}{hint}", where.file, line=where.line)
    elif targets and not block.get("match"):
        first = next(iter(targets))
        where = policy.where("throughput", first)
        raise InputError(f"throughput.{first}: a throughput target needs throughput.device, the device it is for "
                         f"(one of {', '.join(device_names())})", where.file, line=where.line)
    runner = policy.get("runner") or {}
    batch = int(block.get("batch_size") or runner.get("batch_size") or 1)
    new_tokens = int(runner.get("sequence_length") or 1)
    if "context_length" in block:
        context = int(block["context_length"])
    elif runner.get("past_sequence_length") is not None:
        context = int(runner["past_sequence_length"]) + new_tokens
    else:
        context = DEFAULT_CONTEXT
    calibration = _calibration(policy, block.get("calibration"))
    if calibration is not None and calibration.device and device is not None and calibration.device != device.name:
        where = policy.where("throughput", "calibration")
        raise InputError(f"throughput.calibration: the file was measured for device {calibration.device!r}, "
                         f"the policy's device is {device.name!r}", where.file, line=where.line)
    prompt = block.get("prompt_length")
    if "max_ttft_ms" in targets and prompt is None:
        where = policy.where("throughput", "max_ttft_ms")
        raise InputError("throughput.max_ttft_ms: a time-to-first-token target needs throughput.prompt_length, the "
                         "prompt it is for", where.file, line=where.line)
    share = block.get("max_memory_share")
    tp = ThroughputPolicy(device, policy.where("throughput", "device") if name is not None else None, targets,
                          locations, batch, new_tokens, context, calibration, block.get("match"),
                          policy.where("throughput"), tuple(int(b) for b in block.get("batch_sizes") or ()),
                          int(prompt) if prompt is not None else None,
                          float(share) if share is not None else DEFAULT_MEMORY_SHARE, share is not None,
                          float(block["max_regression"]) if block.get("max_regression") is not None else None)
    if tp.max_regression is not None and device is None:
        where = policy.where("throughput", "max_regression")
        raise InputError(f"throughput.max_regression: a regression gate needs throughput.device, the device the "
                         f"estimates are for (one of {', '.join(device_names())})", where.file, line=where.line)
    checked = tp.device_with_figures()
    if share is not None and checked is not None and checked.memory_gib.value is None:
        where = policy.where("throughput", "max_memory_share")
        raise InputError(f"throughput.max_memory_share: device {checked.name!r} has no memory figure in the catalog "
                         "(give calibration.memory_gib, the memory of the machine it is for)", where.file,
                         line=where.line)
    return tp


def _calibration(policy: Policy, value: Any) -> Calibration | None:
    if value is None:
        return None
    where = policy.where("throughput", "calibration")
    if isinstance(value, dict):
        return _calibration_from(value, f"{Path(where.file).name}:{where.line}" if where.line else where.file,
                                 where.file, where.line)
    path = calibration_file(policy)
    assert path is not None
    if not path.is_file():
        raise InputError(f"throughput.calibration: {value!r} is not a file (resolved to {path})", where.file,
                         line=where.line)
    if path.stat().st_size > MAX_CALIBRATION_BYTES:
        raise InputError("calibration file larger than 1 MiB", path)
    doc = load_yaml(path)
    data = doc.data
    if not isinstance(data, dict) or not isinstance(data.get("figures"), dict):
        raise InputError("not an ortgate calibration file (expected a mapping with `figures`, as "
                         "`ortgate run --write-calibration` writes it)", path)
    calibration = _calibration_from(data["figures"], str(path), str(path), doc.line_of(("figures",)))
    return Calibration(calibration.figures, calibration.tflops, str(path), data.get("device"), data.get("measured_on"),
                       path)


def calibration_file(policy: Policy) -> Path | None:
    """The calibration file the policy names (relative to the policy file that names it), confined as `extends:`
    is (ortgate.config.policy.confine); None when it names none or gives the figures inline."""
    value = policy.get("throughput", "calibration")
    if value is None or isinstance(value, dict):
        return None
    where = policy.where("throughput", "calibration")
    path = Path(where.file).parent / str(value)
    confine(path, Path(where.file), f"throughput.calibration: {value!r}", where.line, "a calibration file")
    return path


def _calibration_from(data: dict, source: str, file: str, line: int | None) -> Calibration:
    figures: dict[str, float] = {}
    tflops: dict[str, float] = {}
    for key, value in data.items():
        if key not in CALIBRATION_KEYS:
            import difflib

            hint = difflib.get_close_matches(str(key), CALIBRATION_KEYS, n=1)
            raise InputError(f"calibration: unknown figure {key!r}"
                             + (f"; did you mean {hint[0]!r}?" if hint else f"; known: {', '.join(CALIBRATION_KEYS)}"),
                             file, line=line)
        if key == "tflops":
            if not isinstance(value, dict) or not all(_positive(v) for v in value.values()):
                raise InputError("calibration.tflops: expected a mapping of dtype -> TFLOP/s (positive numbers)",
                                 file, line=line)
            tflops = {str(k): float(v) for k, v in value.items()}
            continue
        if not _positive(value) or (key.endswith("efficiency") and float(value) > 1.0):
            bound = " in (0, 1]" if key.endswith("efficiency") else " above 0"
            raise InputError(f"calibration.{key}: expected a number{bound}, got {value!r}", file, line=line)
        figures[key] = float(value)
    return Calibration(figures, tflops, source)


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
