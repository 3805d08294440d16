"""The device catalog (devices.json) and the per-op cost figures (op_costs.json) the decode cost model reads.

Every figure carries its source and a confidence marker. The `cpu` entry's bandwidth, throughput and per-node
time are measured on the spot (`Figure.value` is None in the catalog: the caller fills them from a probe).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from ortgate.knowledge.kernels import op_key, parse_op_key
from ortgate.knowledge.loader import build, read_json

DEVICES_JSON = Path(__file__).with_name("devices.json")
OP_COSTS_JSON = Path(__file__).with_name("op_costs.json")

# Confidence markers, from the most to the least trusted.
CONFIDENCES = ("calibrated", "probe", "datasheet", "published", "derived", "default", "estimate", "uncertain")
# dtype names as the graph index spells them -> the catalog's throughput key.
_FLOPS_DTYPE = {
    "bfloat16": "bfloat16", "float16": "float16", "float": "float", "float32": "float", "double": "float",
    "float8e4m3fn": "float8", "float8e5m2": "float8", "float8e4m3fnuz": "float8", "float8e5m2fnuz": "float8",
    # weight-only quantized GEMMs compute in the activation dtype; int8 tensor throughput is not used
}


@dataclass(frozen=True)
class Figure:
    """One number with where it comes from. `value` None: not known (the `cpu` device before its probe)."""

    value: float | None
    source: str
    confidence: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Figure:
        value = data.get("value")
        return cls(None if value is None else float(value), str(data.get("source", "")), str(data.get("confidence", "")))

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "confidence": self.confidence}


@dataclass(frozen=True)
class Device:
    """What the cost model needs to know of a device: bandwidth, peak throughput per dtype, per-kernel and
    per-sync times, default efficiencies (and per-kind memory efficiencies, e.g. the fused MoE kernel's)."""

    name: str
    label: str
    kind: str  # "gpu" | "npu" | "cpu"
    match: tuple[str, ...]  # globs on the device name `ortgate run` reports
    bandwidth_gb_s: Figure
    tflops: Mapping[str, Figure]
    kernel_us: Figure
    graph_kernel_us: Figure
    sync_us: Figure
    memory_efficiency: Figure
    compute_efficiency: Figure
    kind_efficiency: Mapping[str, Figure] = field(default_factory=dict)
    # A last-level cache large enough to hold a small model's weights (CPUs): a step that reads less than it is
    # served at the cache's bandwidth. None on GPUs, whose caches are far smaller than any model.
    cache_bytes: Figure = Figure(None, "no cache figure", "default")
    cache_bandwidth_gb_s: Figure = Figure(None, "no cache figure", "default")
    # Memory capacity in GiB (None: not in the catalog, as for the cpu device, whose memory is the machine's).
    memory_gib: Figure = Figure(None, "no memory figure", "default")
    # NVIDIA compute capability, major.minor (None: not an NVIDIA GPU, or not in the catalog).
    compute_capability: Figure = Figure(None, "no compute capability in the catalog", "default")

    @property
    def memory_bytes(self) -> float | None:
        v = self.memory_gib.value
        return None if v is None else v * 2**30

    @property
    def bandwidth(self) -> float | None:
        """Bytes per second."""
        v = self.bandwidth_gb_s.value
        return None if v is None else v * 1e9

    def step_bandwidth(self, step_bytes: float) -> float | None:
        """Bytes per second for a step reading `step_bytes`: the cache's when the whole step fits in it (with room
        for activations: 80% of it), else memory's."""
        size, fast = self.cache_bytes.value, self.cache_bandwidth_gb_s.value
        if size and fast and step_bytes <= 0.8 * size:
            return max(fast * 1e9, self.bandwidth or 0.0)
        return self.bandwidth

    def peak_flops(self, dtype: str | None) -> float | None:
        """FLOP/s for a compute dtype (None: not in the catalog for this device)."""
        key = _FLOPS_DTYPE.get(dtype or "", None)
        figure = self.tflops.get(key) if key else None
        if figure is None:  # an integer or unknown dtype: the device's fastest 16-bit rate is the fairest floor
            figure = self.tflops.get("float16") or self.tflops.get("bfloat16") or self.tflops.get("float")
        return None if figure is None or figure.value is None else figure.value * 1e12

    def efficiency(self, kind: str | None) -> float:
        figure = self.kind_efficiency.get(kind or "") if kind else None
        figure = figure or self.memory_efficiency
        return figure.value if figure.value is not None else 1.0

    @property
    def is_gpu_like(self) -> bool:
        return self.kind in ("gpu", "npu")

    def matches(self, reported: str) -> bool:
        """Whether the device name `ortgate run` reports ("NVIDIA H100 80GB HBM3", "cpu: ...") is this device."""
        if self.kind == "cpu":
            return reported.strip().lower().startswith("cpu")
        low = reported.strip().lower()
        return any(fnmatch.fnmatchcase(low, glob.lower()) for glob in self.match)

    def with_figures(self, **figures: Any) -> Device:
        """A copy with some figures replaced (a probe's or a calibration's)."""
        kind_eff = figures.pop("kind_efficiency", None)
        tflops = figures.pop("tflops", None)
        device = replace(self, **figures)
        if kind_eff:
            device = replace(device, kind_efficiency={**self.kind_efficiency, **kind_eff})
        if tflops:
            device = replace(device, tflops={**self.tflops, **tflops})
        return device

    def figures(self) -> dict[str, Any]:
        """Every figure with its source and confidence (what `ortgate estimate --format json` prints)."""
        return {
            "bandwidth_gb_s": self.bandwidth_gb_s.to_dict(),
            "tflops": {k: v.to_dict() for k, v in sorted(self.tflops.items())},
            "kernel_us": self.kernel_us.to_dict(),
            "graph_kernel_us": self.graph_kernel_us.to_dict(),
            "sync_us": self.sync_us.to_dict(),
            "memory_efficiency": self.memory_efficiency.to_dict(),
            "compute_efficiency": self.compute_efficiency.to_dict(),
            "kind_efficiency": {k: v.to_dict() for k, v in sorted(self.kind_efficiency.items())},
            "cache_bytes": self.cache_bytes.to_dict(),
            "cache_bandwidth_gb_s": self.cache_bandwidth_gb_s.to_dict(),
            "memory_gib": self.memory_gib.to_dict(),
            "compute_capability": self.compute_capability.to_dict(),
        }


# ---- devices.json and op_costs.json, as their schemas ------------------------------------------------------------

Confidence = Literal["calibrated", "probe", "datasheet", "published", "derived", "default", "estimate", "uncertain"]


@dataclass(frozen=True)
class _FigureEntry:
    """devices.json: one figure with its source and confidence."""

    value: float | None
    source: str
    confidence: Confidence

    def figure(self) -> Figure:
        return Figure(self.value, self.source, self.confidence)


@dataclass(frozen=True)
class _DeviceEntry:
    """devices.json: one device's figures."""

    label: str
    kind: Literal["gpu", "npu", "cpu"]
    match: tuple[str, ...]
    bandwidth_gb_s: _FigureEntry
    tflops: Mapping[str, _FigureEntry]
    kernel_us: _FigureEntry | None = None
    graph_kernel_us: _FigureEntry | None = None
    sync_us: _FigureEntry | None = None
    memory_efficiency: _FigureEntry | None = None
    compute_efficiency: _FigureEntry | None = None
    kind_efficiency: Mapping[str, _FigureEntry] = field(default_factory=dict)
    cache_bytes: _FigureEntry | None = None
    cache_bandwidth_gb_s: _FigureEntry | None = None
    memory_gib: _FigureEntry | None = None
    compute_capability: _FigureEntry | None = None


@dataclass(frozen=True)
class _DevicesFile:
    """devices.json."""

    schema: Literal[1]
    about: str
    defaults: Mapping[str, Mapping[str, _FigureEntry]]  # device kind -> figure name -> default figure
    devices: Mapping[str, _DeviceEntry]

    def __post_init__(self) -> None:
        known = {f.name for f in fields(_DeviceEntry)}
        for kind, figures in self.defaults.items():
            unknown = set(figures) - known
            if unknown:
                raise ValueError(f"defaults.{kind}: {sorted(unknown)} are not device figures")


_CATALOG = build(_DevicesFile, read_json(DEVICES_JSON), DEVICES_JSON.name)


def device_names() -> list[str]:
    return sorted(_CATALOG.devices)


def suggest_device(name: str) -> list[str]:
    """Catalog names close to a misspelt one ("h100" -> h100-nvl, h100-pcie, h100-sxm); [] if none is."""
    low = name.strip().lower().replace("_", "-").replace(" ", "-")
    names = device_names()
    prefixed = [n for n in names if n.startswith(low) or (low.startswith(n) and len(n) > 2)]
    if prefixed:
        return prefixed
    return difflib.get_close_matches(low, names, n=3, cutoff=0.5)


def find_device(name: str) -> Device | None:
    """A catalog device by name (case-insensitive; "_" and " " read as "-"), or None."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    data = _CATALOG.devices.get(key)
    return None if data is None else _device(key, data)


def _build(name: str, data: _DeviceEntry) -> Device:
    defaults = _CATALOG.defaults.get("gpu", {})

    def fig(key: str) -> Figure:
        entry = getattr(data, key)
        if entry is not None:
            return entry.figure()
        if data.kind != "cpu" and key in defaults:
            return defaults[key].figure()
        return Figure(None, "not in the catalog", "default")

    return Device(
        name=name,
        label=data.label,
        kind=data.kind,
        match=data.match,
        bandwidth_gb_s=fig("bandwidth_gb_s"),
        tflops={k: v.figure() for k, v in data.tflops.items()},
        kernel_us=fig("kernel_us"),
        graph_kernel_us=fig("graph_kernel_us"),
        sync_us=fig("sync_us"),
        memory_efficiency=fig("memory_efficiency"),
        compute_efficiency=fig("compute_efficiency"),
        kind_efficiency={k: v.figure() for k, v in data.kind_efficiency.items()},
        cache_bytes=data.cache_bytes.figure() if data.cache_bytes else Figure(None, "no cache figure", "default"),
        cache_bandwidth_gb_s=(data.cache_bandwidth_gb_s.figure() if data.cache_bandwidth_gb_s
                              else Figure(None, "no cache figure", "default")),
        memory_gib=data.memory_gib.figure() if data.memory_gib else Figure(None, "no memory figure", "default"),
        compute_capability=(data.compute_capability.figure() if data.compute_capability
                            else Figure(None, "no compute capability in the catalog", "default")),
    )


_DEVICES: dict[str, Device] = {}


def _device(name: str, data: _DeviceEntry) -> Device:
    if name not in _DEVICES:
        _DEVICES[name] = _build(name, data)
    return _DEVICES[name]


def device_for_reported_name(reported: str) -> Device | None:
    """The catalog device whose globs match the name `ortgate run` reports, or None."""
    for name in device_names():
        device = find_device(name)
        if device is not None and device.matches(reported):
            return device
    return None


# ---- op costs -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpCosts:
    """GPU kernel launches per node, ops that launch nothing, ops that wait on the host."""

    ort_version: str
    default_launches: int
    launches: Mapping[str, Figure]  # op key ("com.microsoft.MoE") -> kernels per node
    no_launch: Mapping[str, str]  # op key -> why it launches nothing
    host_sync: Mapping[str, str]  # op key -> why it synchronises with the host

    def gpu_launches(self, key: str) -> int:
        if key in self.no_launch:
            return 0
        figure = self.launches.get(key)
        return int(figure.value) if figure is not None and figure.value is not None else self.default_launches


def _op_key(key: str) -> str:
    return op_key(*parse_op_key(key))


@dataclass(frozen=True)
class _OpCostsFile:
    """op_costs.json."""

    schema: Literal[1]
    ort_version: str
    about: str
    default_launches: int
    launches: Mapping[str, _FigureEntry]  # [domain.]op_type -> kernels per node
    no_launch_ops: Mapping[str, str]
    host_sync_ops: Mapping[str, str]


def _load_op_costs() -> OpCosts:
    data = build(_OpCostsFile, read_json(OP_COSTS_JSON), OP_COSTS_JSON.name)
    return OpCosts(
        ort_version=data.ort_version,
        default_launches=data.default_launches,
        launches={_op_key(k): v.figure() for k, v in data.launches.items()},
        no_launch={_op_key(k): v for k, v in data.no_launch_ops.items()},
        host_sync={_op_key(k): v for k, v in data.host_sync_ops.items()},
    )


_OP_COSTS = _load_op_costs()


def op_costs() -> OpCosts:
    return _OP_COSTS
