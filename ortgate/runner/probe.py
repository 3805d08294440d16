"""The `cpu` device's figures, measured on the spot with ONNX Runtime's CPU provider at a session's thread count.

- bandwidth: a float32 MatMul of one row by a weight larger than the last-level cache (the decode GEMV), bytes of
  the weight / time of the fastest run;
- cache bandwidth: the same with a weight that fits in the last-level cache (models whose step reads less than
  the cache are served from it);
- usable cache: the largest weight, doubling from 16 MiB up to the last-level cache the system reports, that is
  still read at cache speed (its bandwidth nearer the in-cache one than memory's, on a log scale). The reported
  size is the whole socket's, shared with every other core and, on a virtual machine, with other tenants, who may
  leave this process a small part of it;
- per-node time: a chain of 256 tiny Add nodes against a chain of one, per node;
- float32 throughput: a 256 x 1024 x 1024 MatMul.

It allocates the large weight once and keeps the result for the process; how long it takes and how stable it is
on a given machine is printed by benchmarks/estimate_accuracy.py (docs/cost-model.md gives the figures measured).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from ortgate.knowledge.provider_names import CPU

_LARGE_MIN = 256 << 20  # bytes of the out-of-cache weight, at least
_SMALL = 16 << 20  # bytes of the in-cache weight
_CHAIN = 256
_RUNS = 10
_SWEEP_RUNS = 5  # per size of the usable-cache sweep


@dataclass(frozen=True)
class CpuProbe:
    bandwidth_gb_s: float
    cache_bandwidth_gb_s: float
    cache_bytes: int | None  # the last-level cache this process can use at cache speed (None: not known)
    node_us: float
    float_tflops: float
    threads: int
    seconds: float  # how long the probe took
    spread: float  # (slowest - fastest) / fastest of the out-of-cache bandwidth runs
    reported_cache_bytes: int | None = None  # the last-level cache size the system reports

    def describe(self) -> str:
        return (f"probe: {self.bandwidth_gb_s:.1f} GB/s, {self.node_us:.2f} us per node, {self.threads} thread"
                f"{'s' if self.threads != 1 else ''}")


def session_threads(intra_op_num_threads: int | None) -> int:
    """The intra-op threads a CPU session uses: the policy's, else ORT's default (one per core it may run on)."""
    if intra_op_num_threads and intra_op_num_threads > 0:
        return intra_op_num_threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def last_level_cache_bytes() -> int | None:
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best = None
    try:
        for index in base.glob("index*"):
            level = int((index / "level").read_text().strip())
            size = (index / "size").read_text().strip().upper()
            factor = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            value = int(size.rstrip("KMG")) * factor
            if best is None or level > best[0]:
                best = (level, value)
    except (OSError, ValueError):
        return None
    return best[1] if best else None


def at_cache_speed(bandwidth: float, memory: float, in_cache: float) -> bool:
    """A weight read at `bandwidth` is served from the cache: nearer the in-cache bandwidth than memory's, on a log
    scale (the geometric midpoint)."""
    return in_cache > memory and bandwidth >= (memory * in_cache) ** 0.5


@cache
def probe_cpu(threads: int) -> CpuProbe:
    """Measure the CPU (once per process and thread count)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    start = time.perf_counter()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3

    def session(nodes, inputs, outputs):
        graph = helper.make_graph(nodes, "probe", inputs, outputs)
        model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 17)])
        return ort.InferenceSession(model.SerializeToString(), so, providers=[CPU])

    def best_of(run, runs: int = _RUNS) -> tuple[float, float]:
        run()  # warm-up
        times = []
        for _ in range(runs):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        return min(times), max(times)

    f = TensorProto.FLOAT
    matmul = session([helper.make_node("MatMul", ["x", "w"], ["y"])],
                     [helper.make_tensor_value_info("x", f, ["m", "k"]), helper.make_tensor_value_info("w", f, ["k", "n"])],
                     [helper.make_tensor_value_info("y", f, ["m", "n"])])
    cache_bytes = last_level_cache_bytes()
    large = max(_LARGE_MIN, 2 * (cache_bytes or 0))
    k = 4096
    row = np.ones((1, k), dtype=np.float32)

    def weight(nbytes: int) -> np.ndarray:
        return np.full((k, nbytes // (4 * k)), 0.5, dtype=np.float32)

    def rate(w: np.ndarray) -> float:
        """Bytes per second of one row times the [4096, n] weight `w`, one run."""
        t = time.perf_counter()
        matmul.run(None, {"x": row, "w": w})
        return w.nbytes / (time.perf_counter() - t)

    big = weight(large)
    rate(big)  # warm-up
    rates = [rate(big) for _ in range(_RUNS)]
    bandwidth, spread = max(rates), max(rates) / min(rates) - 1.0
    small_weight = weight(_SMALL)
    rate(small_weight)
    cache_bandwidth = max(bandwidth, *(rate(small_weight) for _ in range(20)))
    del small_weight
    usable = cache_bytes
    if cache_bytes and cache_bytes > _SMALL and cache_bandwidth > bandwidth:
        usable, size = _SMALL, 2 * _SMALL
        while size < cache_bytes:
            w = weight(size)
            # Each run of `w` right after a run of it (the cache warm, as in a decode loop), each beside a run of
            # the large weight at the same moment: other work on the machine slows both alike.
            pairs = [(rate(w), rate(w), rate(big))[1:] for _ in range(_SWEEP_RUNS)]
            fast, memory = max(a for a, _ in pairs), max(b for _, b in pairs)
            if not at_cache_speed(fast, memory, cache_bandwidth):
                break
            usable, size = size, 2 * size
        else:  # every size below the reported one was read at cache speed: no sign of a smaller share
            usable = cache_bytes
    del big
    a = np.ones((256, 1024), dtype=np.float32)
    b = np.ones((1024, 1024), dtype=np.float32)
    fastest_gemm, _ = best_of(lambda: matmul.run(None, {"x": a, "w": b}))
    tflops = 2 * 256 * 1024 * 1024 / fastest_gemm / 1e12

    def chain(length: int):
        nodes = [helper.make_node("Add", ["x" if i == 0 else f"t{i}", "x"], [f"t{i + 1}"]) for i in range(length)]
        return session(nodes, [helper.make_tensor_value_info("x", f, [1, 16])],
                       [helper.make_tensor_value_info(f"t{length}", f, [1, 16])])

    tiny = np.ones((1, 16), dtype=np.float32)
    long_chain, short_chain = chain(_CHAIN), chain(1)
    t_long, _ = best_of(lambda: long_chain.run(None, {"x": tiny}), runs=20)
    t_short, _ = best_of(lambda: short_chain.run(None, {"x": tiny}), runs=20)
    node_us = max(0.0, (t_long - t_short) / (_CHAIN - 1)) * 1e6
    return CpuProbe(bandwidth / 1e9, cache_bandwidth / 1e9, usable, node_us, tflops, threads,
                    time.perf_counter() - start, spread, cache_bytes)
