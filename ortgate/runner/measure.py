"""Timing a session: IOBinding to fixed device buffers, CUDA graph capture and replay, latency statistics, memory.

One code path for every provider. Inputs are copied once to OrtValues on the session's device and bound; outputs
are bound to buffers ORT allocates on the first (discovery) run and then kept fixed, so the timed loop moves no
data. CUDA graph (`enable_cuda_graph=1`) needs exactly this: fixed buffers, `gpu_graph_id` on every run, a few
regular runs before ORT captures (the discovery run opts out of capture with gpu_graph_id=-1). On CPU, ORT allows
IOBinding with CPU OrtValues, so CI exercises the same plan.
"""

from __future__ import annotations

import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ortgate.evidence import DeviceInfo, Ratio, Stats
from ortgate.knowledge import cuda_graph_capture_facts, device_option, normalize_option_value
from ortgate.runner.inputs import Feeds

GPU_GRAPH_ID_KEY = "gpu_graph_id"  # run config key (onnxruntime_run_options_config_keys.h)
GRAPH_ID_SKIP = -1  # this run neither captures nor replays
CAPTURE_GRAPH_ID = 1  # the annotation id the measured runs capture and replay
# The CUDA EP captures a graph only after this many regular runs (knowledge/ort_facts.json).
RUNS_BEFORE_CAPTURE = cuda_graph_capture_facts().runs_before_capture.value
MIN_GRAPH_WARMUP = RUNS_BEFORE_CAPTURE + 1  # the first timed run is then a replay



class RunTimeout(Exception):
    """The run passed its --timeout."""

    def __init__(self, limit_s: float, phase: str):
        self.limit_s = limit_s
        self.phase = phase
        super().__init__(f"run exceeded --timeout {limit_s:g}s while {phase}")


# ---- the binding plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BindingPlan:
    """Where the buffers live and whether runs capture / replay a CUDA graph."""

    device_type: str  # "cpu" | "cuda"
    device_id: int
    cuda_graph: bool
    graph_id: int  # gpu_graph_id of the measured runs (GRAPH_ID_SKIP without CUDA graph)
    min_warmup: int  # warm-up runs needed before the timed runs measure steady state


def plan_binding(provider: str, effective_options: dict[str, str]) -> BindingPlan:
    """The plan for a session on `provider` with the provider options ORT reports as effective."""
    from ortgate.knowledge import graph_capture_option

    option = device_option(provider)  # the CUDA-family providers: inputs and outputs live in device memory
    if option is not None:
        device_id = int(effective_options.get(option, "0") or 0)
        capture_key = graph_capture_option(provider)
        graph = capture_key is not None and normalize_option_value(effective_options.get(capture_key, "0")) == "1"
        return BindingPlan("cuda", device_id, graph, CAPTURE_GRAPH_ID if graph else GRAPH_ID_SKIP,
                           MIN_GRAPH_WARMUP if graph else 1)
    return BindingPlan("cpu", 0, False, GRAPH_ID_SKIP, 0)


class BoundSession:
    """A session with its inputs and outputs bound to fixed buffers on the plan's device."""

    def __init__(self, session: Any, plan: BindingPlan, feeds: Feeds):
        import onnxruntime as ort

        self.session = session
        self.plan = plan
        self.binding = session.io_binding()
        self.output_names = [o.name for o in session.get_outputs()]
        self._inputs: dict[str, Any] = {}
        for name, array in feeds.arrays.items():
            value = _ortvalue(array, feeds.elem_types[name], plan)
            self._inputs[name] = (value, array)  # keep the host array alive: CPU OrtValues share its memory
            self.binding.bind_ortvalue_input(name, value)
        self.run_options = ort.RunOptions()
        # Always set: run_with_iobinding looks the entry up on every run, and an unset entry costs an exception
        # inside the Python wrapper (~20 us, as much as a tiny model's whole step).
        self.run_options.add_run_config_entry(GPU_GRAPH_ID_KEY, str(plan.graph_id))
        self.output_buffers: dict[str, Any] = {}

    def discover_outputs(self) -> dict[str, tuple[int, ...]]:
        """One run with ORT-allocated outputs on the device (never captured); then keep those buffers bound."""
        import onnxruntime as ort

        for name in self.output_names:
            self.binding.bind_output(name, self.plan.device_type, self.plan.device_id)
        options = ort.RunOptions()
        options.add_run_config_entry(GPU_GRAPH_ID_KEY, str(GRAPH_ID_SKIP))
        self._run(options)
        values = self.binding.get_outputs()
        self.binding.clear_binding_outputs()
        for name, value in zip(self.output_names, values):
            self.output_buffers[name] = value
            self.binding.bind_ortvalue_output(name, value)
        return {name: tuple(v.shape()) for name, v in self.output_buffers.items()}

    def _run(self, options: Any) -> None:
        self.session.run_with_iobinding(self.binding, options)

    def run(self) -> None:
        self.session.run_with_iobinding(self.binding, self.run_options)

    def terminate(self) -> None:
        self.run_options.terminate = True

    def outputs(self) -> dict[str, np.ndarray]:
        """The bound outputs, copied to host memory."""
        return {name: value.numpy() for name, value in self.output_buffers.items()}

    def output_types(self) -> dict[str, str]:
        return {name: value.data_type() for name, value in self.output_buffers.items()}


def _ortvalue(array: np.ndarray, elem_type: int, plan: BindingPlan):
    import onnxruntime as ort
    from onnx import TensorProto

    if elem_type == TensorProto.BFLOAT16:
        host = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, TensorProto.BFLOAT16)
        if plan.device_type == "cpu":
            return host
        device = ort.OrtValue.ortvalue_from_shape_and_type(list(array.shape), TensorProto.BFLOAT16,
                                                          plan.device_type, plan.device_id)
        device.update_inplace(host)
        return device
    return ort.OrtValue.ortvalue_from_numpy(array, plan.device_type, plan.device_id)


# ---- the loop ------------------------------------------------------------------------------------------------


class Deadline:
    """--timeout. `check` raises RunTimeout between runs; a watchdog sets the running session's terminate flag so
    that a long run stops too. When `hard_exit` is set and the process is still busy `grace_s` after the limit
    (e.g. inside session creation, which ORT cannot interrupt), the watchdog calls `on_hard_exit(timeout)` (which
    writes the reports it can and returns the exit code) and exits the process with that code; without a callback,
    or when it fails, it prints one line and exits with `exit_code`."""

    def __init__(self, limit_s: float | None, *, hard_exit: bool = False, grace_s: float = 10.0, exit_code: int = 1,
                 on_hard_exit: Callable[[RunTimeout], int] | None = None):
        self.limit_s = limit_s
        self.started = time.monotonic()
        self.phase = "starting"
        self.hard_exit = hard_exit
        self.grace_s = grace_s
        self.exit_code = exit_code
        self.on_hard_exit = on_hard_exit
        self._current: BoundSession | None = None
        self._done = threading.Event()
        self._watchdog: threading.Thread | None = None

    def __enter__(self) -> Deadline:
        if self.limit_s is not None:
            self._watchdog = threading.Thread(target=self._watch, name="ortgate-timeout", daemon=True)
            self._watchdog.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()

    @property
    def expired(self) -> bool:
        return self.limit_s is not None and time.monotonic() - self.started > self.limit_s

    def enter(self, phase: str, bound: BoundSession | None = None) -> None:
        self.check()
        self.phase = phase
        self._current = bound

    def check(self) -> None:
        if self.expired:
            raise RunTimeout(self.limit_s, self.phase)  # type: ignore[arg-type]

    def _watch(self) -> None:
        assert self.limit_s is not None
        if self._done.wait(self.limit_s):
            return
        current = self._current
        if current is not None:
            current.terminate()
        if self._done.wait(self.grace_s) or not self.hard_exit:
            return
        from ortgate.runner.session import original_stderr_fd

        timeout = RunTimeout(self.limit_s, self.phase)
        code = self.exit_code
        if self.on_hard_exit is not None:
            try:
                code = self.on_hard_exit(timeout)
            except BaseException as exc:  # the process ends either way: say why in one line
                message = f"ortgate: error: {timeout} (and the report could not be written: {exc})\n"
                os.write(original_stderr_fd(), message.encode())
            os._exit(code)
        os.write(original_stderr_fd(), f"ortgate: error: {timeout}\n".encode())
        os._exit(code)


Tick = Callable[[int], None]


def timed_runs(bound: BoundSession, warmup: int, iterations: int, deadline: Deadline, *,
               label: str = "policy", tick: Tick | None = None) -> list[float]:
    """Warm-up runs, then `iterations` timed runs; per-run latency in seconds."""
    deadline.enter(f"warming up the {label} session", bound)
    try:
        for i in range(warmup):
            deadline.check()
            bound.run()
            if tick:
                tick(i + 1)
        deadline.enter(f"measuring the {label} session", bound)
        latencies: list[float] = []
        clock = time.perf_counter
        run = bound.run
        for i in range(iterations):
            deadline.check()
            start = clock()
            run()
            latencies.append(clock() - start)
            if tick:
                tick(warmup + i + 1)
    except RunTimeout:
        raise
    except Exception:
        if deadline.expired:
            raise RunTimeout(deadline.limit_s, deadline.phase) from None  # type: ignore[arg-type]
        raise
    return latencies


ROUNDS = 5  # rounds two sessions are timed in, in turn, for a ratio with its spread


def alternated_rounds(bounds: Sequence[BoundSession], iterations: int, deadline: Deadline, *,
                      labels: Sequence[str], rounds: int = ROUNDS) -> list[list[list[float]]]:
    """Per session, per round, the latencies (seconds) of `iterations` runs in all, split over `rounds` rounds in
    which every session runs in turn (the order reversed every other round), so that what changes on the machine
    while measuring (clock, other load, caches) falls on every session alike. Sessions are warm."""
    per = max(1, iterations // rounds)
    out: list[list[list[float]]] = [[] for _ in bounds]
    for r in range(rounds):
        order = list(range(len(bounds)))
        for i in order if r % 2 == 0 else order[::-1]:
            out[i].append(timed_runs(bounds[i], 0, per, deadline, label=labels[i]))
    return out


def round_ratio(numerator: list[list[float]], denominator: list[list[float]]) -> Ratio:
    """numerator p50 / denominator p50 round by round (alternated_rounds' rounds): the median ratio, its spread, and
    whether the two sessions' per-round p50 intervals overlap (within noise)."""
    a = [statistics.median(r) for r in numerator]
    b = [statistics.median(r) for r in denominator]
    ratios = sorted(x / y for x, y in zip(a, b) if y > 0)
    if not ratios:
        raise ValueError("no timed rounds")
    overlap = min(a) <= max(b) and min(b) <= max(a)
    return Ratio(statistics.median(ratios), ratios[0], ratios[-1], len(ratios), overlap)


def latency_stats(latencies_s: list[float]) -> Stats:
    """Percentiles by nearest rank: with few iterations p99 is honestly the slowest run, not an interpolation."""
    if not latencies_s:
        raise ValueError("no timed runs")
    ms = sorted(x * 1000.0 for x in latencies_s)

    def rank(p: float) -> float:
        return ms[max(0, math.ceil(p / 100.0 * len(ms)) - 1)]

    return Stats(len(ms), sum(ms) / len(ms), ms[0], rank(50), rank(90), rank(99), ms[-1])


def tokens_per_second(batch_size: int, new_tokens: int, stats: Stats) -> float:
    return batch_size * new_tokens / (stats.p50_ms / 1000.0) if stats.p50_ms > 0 else 0.0


# ---- device and memory --------------------------------------------------------------------------------------


def device_info(plan: BindingPlan) -> DeviceInfo:
    if plan.device_type == "cuda":
        name = _nvidia_smi(["--query-gpu=name"], plan.device_id)
        return DeviceInfo("gpu", name or f"cuda:{plan.device_id}")
    return DeviceInfo("cpu", f"cpu: {_cpu_model()}")


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _nvidia_smi(query: list[str], device_id: int) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *query, "--format=csv,noheader,nounits", "-i", str(device_id)],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    out = done.stdout.strip().splitlines()
    return out[0].strip() if done.returncode == 0 and out else None


@dataclass
class MemoryProbe:
    """Peak memory of one measured phase. CPU: the process's peak RSS growth (VmHWM is reset first where Linux
    allows). GPU: device memory in use after the phase minus before it, from nvidia-smi (not a peak)."""

    plan: BindingPlan
    before: int | None = None
    reset: bool = False

    def start(self) -> None:
        if self.plan.device_type == "cuda":
            self.before = _gpu_memory_used(self.plan.device_id)
            return
        self.reset = _reset_peak_rss()
        self.before = _proc_status_bytes("VmRSS")

    def stop(self) -> tuple[int | None, str | None]:
        if self.plan.device_type == "cuda":
            after = _gpu_memory_used(self.plan.device_id)
            if after is None or self.before is None:
                return None, None
            return max(0, after - self.before), "GPU memory in use after the run minus before it (nvidia-smi)"
        peak = _proc_status_bytes("VmHWM")
        if peak is None or self.before is None:
            return None, None
        what = "process peak RSS growth (CPU)" if self.reset else "process peak RSS growth since start (CPU)"
        return max(0, peak - self.before), what


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _proc_status_bytes(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(re.findall(r"\d+", line)[0]) * 1024
    except (OSError, IndexError, ValueError):
        return None
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024 if field_name == "VmHWM" else None
    except (ImportError, ValueError):
        return None


def _gpu_memory_used(device_id: int) -> int | None:
    text = _nvidia_smi(["--query-gpu=memory.used"], device_id)
    try:
        return int(float(text)) * 1024 * 1024 if text else None
    except ValueError:
        return None
