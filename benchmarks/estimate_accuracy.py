"""How close the decode cost model's estimate comes to what the runner measures: on this machine's CPU, or on
CUDA with `--provider cuda` (benchmarks/gpu_check.sh runs it there).

Two generated models wide enough to be bandwidth-bound (tests/models/qwen_moe.py; real, random weights): 4 decoder
layers, 16 experts (CPU: hidden 1024, intermediate 512, float32; CUDA: hidden 2048, 64 experts of intermediate 768,
float16), top-2, GroupQueryAttention and fused norms in both, one with its experts as a dense all-experts loop (every
expert's gate/up/down MatMuls on every token, the torch export form) and one with com.microsoft.MoE. Each is
measured with `ortgate run` (the policy's session, IOBinding, on CUDA with CUDA graph capture; p50 of the timed
runs) and estimated, for the device the run used, with the probe's figures on CPU (at the session's thread count,
no calibration) and the device catalog's on CUDA. Everything is repeated ROUNDS times, the two models alternating;
the fastest round (the least disturbed by other work on the machine) and the median are printed with every round.

Printed: the probe's figures and how stable the probe is (CPU), then per model the bytes and launches of a step, the
predicted and measured step times and their ratio, the rate at which the MatMul and MoE kernels read their weights
(CPU: one profiled run of each model, the estimate's bytes over ORT's kernel time), and the predicted and measured speedup
of fusing the experts.
Target: the predicted speedup within +-40% of the measured one (printed as PASS/FAIL).

    python benchmarks/estimate_accuracy.py [--provider cpu|cuda] [--rounds 3] [--iterations 20] [--threads N]
        [--probe-repeats 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET = 0.40  # predicted speedup within +-40% of the measured one
COMMON = dict(layers=4, top_k=2, kv_num_heads=2, head_dim=128, vocab=2048, attention="gqa", rotary="fused",
              norm="fused", naming="genai", weights="random", max_position=512)
SHAPES = {
    "cpu": dict(hidden=1024, moe_intermediate=512, experts=16, num_heads=8, dtype="float32"),
    "cuda": dict(hidden=2048, moe_intermediate=768, experts=64, num_heads=16, dtype="float16"),
}
FORMS = {"dense-loop": dict(moe="dense_loop", gate_up="separate"), "fused": dict(moe="fused")}


def policy_text(provider: str, threads: int | None, iterations: int) -> str:
    session = f"  intra_op_num_threads: {threads}\n" if threads else ""
    if provider == "cuda":
        ep = 'execution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: "1"}}\n'
        throughput = ""  # the run's device is looked up in the catalog by the name nvidia-smi reports
    else:
        ep = "execution_provider: {name: CPUExecutionProvider}\n"
        throughput = "throughput: {device: cpu}\n"  # no calibration: the probe's figures
    return ("name: estimate-accuracy\n" + ep +
            "session:\n  graph_optimization_level: ORT_ENABLE_ALL\n"
            "  free_dimension_overrides: {batch_size: 1, sequence_length: 1}\n" + session + throughput +
            f"runner: {{batch_size: 1, sequence_length: 1, past_sequence_length: 127, warmup: 5, "
            f"iterations: {iterations}}}\n")


def measure(model: Path, policy: Path):
    from ortgate.engine.run import run_reference
    from ortgate.runner.collect import RunRequest

    outcome = run_reference(RunRequest(str(model), str(policy)))
    m, e = outcome.evidence.measurement, outcome.evidence.estimate
    if m is None or not e or e.get("device") is None:
        raise SystemExit(f"{model}: nothing measured or estimated ({outcome.evidence.skipped})")
    return m.stats.p50_ms, e


def kernel_rates(model: Path, policy: Path) -> dict[str, tuple[float, float]]:
    """One profiled run: per op type that reads weights (MatMul, MoE), the estimate's bytes per step and ORT's
    kernel time per run for it, on the graph ORT ran."""
    from ortgate.engine.run import run_reference
    from ortgate.runner.collect import RunRequest

    outcome = run_reference(RunRequest(str(model), str(policy), profile=True))
    est, profile = outcome.estimate, outcome.evidence.profile
    if est is None or profile is None:
        return {}
    nodes = est.model.graph.nodes  # type: ignore[attr-defined]
    nbytes: dict[str, float] = {}
    for i, nc in est.model.costs.items():  # type: ignore[attr-defined]
        op = nodes[i].op_type
        nbytes[op] = nbytes.get(op, 0.0) + nc.cost.bytes
    us = {o["op_type"]: o["avg_us_per_run"] for o in profile.op_types}
    return {op: (nbytes[op], us[op]) for op in ("MatMul", "MoE") if nbytes.get(op) and us.get(op)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probe-repeats", type=int, default=5, help="CPU: run the probe this many times")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--threads", type=int, help="intra-op threads (default: ORT's, one per core)")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)

    from ortgate.runner.probe import probe_cpu, session_threads
    from tests.models.qwen_moe import ModelSpec, build_model, save_model

    with tempfile.TemporaryDirectory(prefix="ortgate-estimate-accuracy-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        policy = work / f"{args.provider}.yaml"
        policy.write_text(policy_text(args.provider, args.threads, args.iterations))
        models = {}
        for name, form in FORMS.items():
            folder = work / name
            folder.mkdir(exist_ok=True)
            path = folder / "model.onnx"
            if not path.exists():
                save_model(build_model(ModelSpec(**COMMON, **SHAPES[args.provider], **form)), path, external_data=True)
            models[name] = path
        if args.provider == "cpu":
            threads = session_threads(args.threads)
            probes = []
            for _ in range(max(1, args.probe_repeats)):
                probe_cpu.cache_clear()
                probes.append(probe_cpu(threads))
            probe = probes[-1]  # the one the estimates below use (the probe is kept for the process)
        measured: dict[str, list[float]] = {n: [] for n in models}
        estimates: dict[str, dict] = {}
        for _ in range(args.rounds):
            for name, path in models.items():
                p50, est = measure(path, policy)
                measured[name].append(p50)
                estimates[name] = est
        if args.provider == "cpu":
            def span(values, fmt):
                v = sorted(values)
                return f"{fmt(v[0])} / {fmt(statistics.median(v))} / {fmt(v[-1])}"

            print(f"probe, {len(probes)} times at {threads} intra-op thread(s), min / median / max: duration "
                  f"{span([p.seconds for p in probes], lambda x: f'{x:.2f} s')}; memory bandwidth "
                  f"{span([p.bandwidth_gb_s for p in probes], lambda x: f'{x:.2f}')} GB/s; in-cache bandwidth "
                  f"{span([p.cache_bandwidth_gb_s for p in probes], lambda x: f'{x:.1f}')} GB/s; usable cache "
                  f"{span([(p.cache_bytes or 0) / 2**20 for p in probes], lambda x: f'{x:,.0f}')} MiB of the "
                  f"{(probe.reported_cache_bytes or 0) / 2**20:,.0f} MiB the system reports; per node "
                  f"{span([p.node_us for p in probes], lambda x: f'{x:.2f}')} us")
            print(f"the estimates use the last probe: {probe.bandwidth_gb_s:.2f} GB/s from memory, "
                  f"{probe.cache_bandwidth_gb_s:.1f} GB/s from a usable cache of "
                  f"{(probe.cache_bytes or 0) / 2**20:,.0f} MiB, {probe.node_us:.2f} us per node")
        else:
            e = next(iter(estimates.values()))
            print(f"device: {e['reported']} -> catalog device {e['device']} ({e['figures']} figures)")
        print(f"{'model':<11} {'bytes/step':>11} {'launches':>8} {'predicted':>10} {'measured p50':>13} "
              f"{'measured/predicted':>18}  {'median p50':>11}  rounds (ms)")
        fastest, medians = {}, {}
        for name in models:
            e = estimates[name]
            best = fastest[name] = min(measured[name])
            medians[name] = statistics.median(measured[name])
            print(f"{name:<11} {e['bytes_per_step'] / 2**20:>7.1f} MiB {e['kernel_launches']:>8} "
                  f"{e['ms_per_step_expected']:>7.2f} ms {best:>10.2f} ms {best / e['ms_per_step_expected']:>18.2f}  "
                  f"{medians[name]:>8.2f} ms  {', '.join(f'{x:.2f}' for x in measured[name])}")
        # CPU only: on CUDA the runs replay a captured CUDA graph, whose kernels ORT's profiler does not time.
        rates = {name: kernel_rates(path, policy) for name, path in models.items()} if args.provider == "cpu" else {}
        if rates:
            print("weights read per kernel (one profiled run each; the estimate's bytes / ORT's kernel time): " + "; ".join(
                f"{name} {op} {b / 2**20:.1f} MiB in {us / 1e3:.2f} ms = {b / us / 1e3:.2f} GB/s"
                for name, found in rates.items() for op, (b, us) in found.items()))
        predicted = estimates["dense-loop"]["ms_per_step_expected"] / estimates["fused"]["ms_per_step_expected"]
        actual = fastest["dense-loop"] / fastest["fused"]
        typical = medians["dense-loop"] / medians["fused"]
        error = predicted / actual - 1
        print(f"speedup of fusing the experts: predicted {predicted:.2f}x, measured {actual:.2f}x on the fastest "
              f"rounds ({typical:.2f}x on the medians); predicted / measured - 1 = {error:+.0%}; target within "
              f"+-{TARGET:.0%}: {'PASS' if abs(error) <= TARGET else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
