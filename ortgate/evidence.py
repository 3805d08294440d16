"""Run evidence: what `ortgate run` saw the real ONNX Runtime session do.

Plain data, no ONNX Runtime import: the runtime rules (ortgate/rules/runtime.py) read it from
`LintInputs.evidence[EVIDENCE_KEY]` (ortgate.rules.context), the reporters print it. The runner observes; the rules
and the gate judge.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from dataclasses import dataclass, field
from typing import Any

from ortgate.findings import Location


@dataclass(frozen=True)
class ProviderCheck:
    """The provider the policy asks for, whether this machine can create it, and what the session runs on."""

    requested: str
    location: Location | None  # execution_provider.name in the policy (None: not declared, ORT's CPU default)
    available: bool
    unavailable_reason: str | None = None  # ORT's own words when the provider cannot be created here
    ran_on: tuple[str, ...] = ()  # session.get_providers(); empty when no session was built
    substituted: bool = False  # --allow-cpu: the same config ran on CPUExecutionProvider instead
    fallback_reason: str | None = None  # "EP Error ..." that ORT printed while falling back

    @property
    def ran(self) -> str | None:
        return self.ran_on[0] if self.ran_on else None


@dataclass(frozen=True)
class OptionCheck:
    """One requested provider option against `get_provider_options()` after session creation."""

    key: str
    requested: str
    effective: str | None  # None: the provider reports no such option
    applied: bool
    location: Location | None = None


@dataclass(frozen=True)
class DimCheck:
    """One free-dimension override against the session's input shapes."""

    dim: str
    value: int
    status: str  # "pinned" | "unresolved" (still symbolic) | "no-such-dim" (no input has it: ORT ignored it)
    inputs: tuple[str, ...] = ()  # "input_ids[1]", ... where the dim is (still) symbolic
    location: Location | None = None


@dataclass(frozen=True)
class DumpEvidence:
    path: str | None  # where the optimized model was written (None: not written)
    kept: bool  # False: a temporary file, deleted after linting
    reason: str | None = None  # why there is no dump


@dataclass
class SessionEvidence:
    provider: ProviderCheck
    options: list[OptionCheck] | None = None  # None: not verifiable (no session, or another provider ran)
    dims: list[DimCheck] = field(default_factory=list)
    input_shapes: dict[str, list | None] = field(default_factory=dict)  # after overrides, as the session reports them
    placement: dict[str, dict[str, int]] | None = None  # provider -> op type -> nodes (ORT's assignment info)
    dump: DumpEvidence | None = None
    ort_messages: list[str] = field(default_factory=list)  # ORT's warnings/errors while creating the session


@dataclass(frozen=True)
class Stats:
    """Latency statistics of the timed iterations, in milliseconds (percentiles by nearest rank)."""

    iterations: int
    mean_ms: float
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


@dataclass
class Measurement:
    label: str  # "policy" (the fixed config) | "default" (ORT's default session)
    provider: str  # the provider the session really ran on
    device: str  # "cpu: <model name>" or the GPU's name
    device_kind: str  # "cpu" | "gpu"
    batch_size: int
    new_tokens: int  # tokens per sequence in one step (the query length)
    warmup: int
    stats: Stats
    tokens_per_second: float  # batch_size * new_tokens / p50 latency
    io_binding: bool = True
    cuda_graph: bool = False
    peak_memory_bytes: int | None = None
    memory_source: str | None = None  # what peak_memory_bytes is: "process peak RSS growth (CPU)", ...
    latencies_ms: list[float] = field(default_factory=list)
    # The graph has no KV cache: the step ran the whole sequence it was given, a prefill, not a decode step
    prefill: bool = False


@dataclass(frozen=True)
class Ratio:
    """One session's p50 over another's, from rounds in which the two ran in turn (so that the machine's drift falls
    on both alike): the median of the per-round ratios, their spread, and whether the two sessions' per-round p50
    intervals overlap, in which case the difference is within the noise of this machine."""

    value: float  # median over the rounds of numerator p50 / denominator p50
    low: float  # the smallest per-round ratio
    high: float  # the largest
    rounds: int
    within_noise: bool  # the per-round p50 intervals [min, max] of the two sessions overlap

    def describe(self, digits: int = 2) -> str:
        """'1.87x (1.52x-2.10x over 5 alternated rounds)', with '; within noise' when the intervals overlap."""
        spread = f"{self.low:.{digits}f}x-{self.high:.{digits}f}x over {self.rounds} alternated rounds"
        return f"{self.value:.{digits}f}x ({spread}{'; within noise' if self.within_noise else ''})"


@dataclass(frozen=True)
class OutputComparison:
    output: str
    dtype: str
    shape: tuple[int, ...]
    rtol: float
    atol: float
    max_abs_diff: float | None
    mismatched: int  # elements outside atol + rtol * |reference| (NaN/Inf placement differences count)
    total: int
    compared: bool = True  # False: this dtype is not compared (reason in note)
    note: str | None = None

    @property
    def ok(self) -> bool:
        return not self.compared or self.mismatched == 0


@dataclass
class Correctness:
    reference: str  # "ORT_DISABLE_ALL on <provider>"
    outputs: list[OutputComparison] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outputs)


@dataclass
class ProfileSummary:
    """ORT's profiling JSON, summed: time per op type and per provider, nodes per provider, Memcpy nodes."""

    file: str | None
    runs: int
    op_types: list[dict[str, Any]]  # {op_type, provider, calls, total_us, avg_us_per_run, share}
    providers: list[dict[str, Any]]  # {provider, nodes, calls, total_us, share}
    memcpy_nodes: int
    memcpy_calls: int
    arena_peak_bytes: int | None = None  # max mem_in_use_peak ORT reported on node events
    note: str | None = None


@dataclass(frozen=True)
class RunFailure:
    """Something `ortgate run` could not do: ORT refused to create or to run a session, or the run passed --timeout.

    A failure is evidence like any other: the runtime rules turn it into a finding, so the report still comes out
    with the static findings beside it."""

    kind: str  # "load" (ORT refused to create the session) | "run" (a session run failed) | "timeout"
    session: str  # which session: "policy" | "default" | "reference" | "profiled"
    phase: str  # what the runner was doing: "creating the policy session", "running the policy session once", ...
    message: str  # ORT's own words (one line), or the timeout
    node: str | None = None  # the node ORT named, when it named one


@dataclass
class RunEvidence:
    model: str
    policy: str
    session: SessionEvidence
    dims: dict[str, int] = field(default_factory=dict)  # every symbolic dim's value in the synthesised inputs
    feeds: dict[str, dict[str, Any]] = field(default_factory=dict)  # input -> {shape, dtype, kind}
    measurement: Measurement | None = None
    baseline: Measurement | None = None
    # the default session's p50 over the policy session's, from alternated rounds (None: not measured that way)
    versus_default: Ratio | None = None
    correctness: Correctness | None = None
    profile: ProfileSummary | None = None
    skipped: str | None = None  # why nothing was measured
    notes: list[str] = field(default_factory=list)
    failures: list[RunFailure] = field(default_factory=list)  # what ORT refused, or where --timeout stopped the run
    timeout_s: float | None = None
    # the decode cost model's estimate for the device the run used, beside the measurement (never mixed with it)
    estimate: dict[str, Any] | None = None

    @property
    def speedup_vs_default(self) -> float | None:
        """Default session p50 / policy p50: above 1 the fixed config is faster (from alternated rounds when run)."""
        if self.versus_default is not None:
            return self.versus_default.value
        if self.measurement is None or self.baseline is None or self.measurement.stats.p50_ms <= 0:
            return None
        return self.baseline.stats.p50_ms / self.measurement.stats.p50_ms

    @property
    def cpu_figures(self) -> bool:
        """Every figure is a CPU figure although the policy asked for another provider (--allow-cpu)."""
        return self.session.provider.substituted

    def to_dict(self) -> dict[str, Any]:
        data = _plain(self)
        data["speedup_vs_default"] = self.speedup_vs_default
        data["cpu_figures"] = self.cpu_figures
        return data


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


@dataclass
class DeviceInfo:
    kind: str  # "cpu" | "gpu"
    name: str


def device_matches(pattern: str, device: DeviceInfo) -> bool:
    """The throughput block's `device`: "cpu", or a glob on the GPU's name (case-insensitive)."""
    if pattern.strip().lower() == "cpu":
        return device.kind == "cpu"
    return device.kind == "gpu" and fnmatch.fnmatchcase(device.name.lower(), pattern.strip().lower())
