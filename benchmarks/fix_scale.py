"""Wall time and peak RSS of `ortgate fix` on a 48-layer, 128-expert dense-loop MoE model with real random weights.

The model is the test generator's dense all-experts loop (tests/models/qwen_moe.py, moe="dense_loop"): its graph is
built with external-data stubs, then the data file is filled tensor by tensor with seeded normal(0, 0.02) values, so
the model is a few GB on disk and never whole in this process's memory. `ortgate fix` then runs in a fresh process
(peak RSS from wait4), once with --no-verify and once with verification (which also lints, measures, and prints
the cost model's estimate of the same step beside the measurement).

Target (printed as PASS/FAIL): peak RSS of `ortgate fix --no-verify` below 1.5 GB plus the largest single tensor it
reads or writes. With verification the report prints the peak too: ORT then holds the original model's weights.

Then the fixed model's decode step (1 x 1 new token after 16 cached, the runner's synthesised inputs) is timed in
fresh processes, --sessions of each, 20 runs per session after 3 warm-up runs: with ORT's default session options
(intra-op threads = cores, spinning thread pool) and with one intra-op thread. Each prints wall p50 and min, the
process CPU time per step (user + sys over the timed runs), major page faults during them, and the 1-minute load
average. Wall time follows how many other processes share the cores; CPU time per step with one thread does not.

    python benchmarks/fix_scale.py [--layers 48] [--experts 128] [--hidden 256] [--intermediate 128] [--sessions 3]
                                   [--decomposed] [--runs dry-run,no-verify,verified,fusions-only]
                                   [--workdir DIR --keep]
    python benchmarks/fix_scale.py --time-decode FIXED/model.onnx [--threads 1] [--no-arena] [--busy N]

--time-decode times one session and prints one JSON line; --busy N runs N busy-loop processes beside it (ended
when it is done), to show what sharing the cores does to the figures.

Files go to a temporary folder (or --workdir) and are removed afterwards unless --keep (the fixed model is then
DIR/out/model.onnx). `ortgate fix --dry-run` is timed first: every run has the norm, rotary and attention
fusions on. With --decomposed the skeleton's norms, rotary and attention are decomposed (the generator's
norm/rotary/attention="decomposed"), so onnxscript's fusions walk the whole graph instead of being skipped for
having nothing to fuse; --runs picks the fix runs to time (fusions-only: --dry-run --ignore moe-not-fused, so the
MoE loops stay and the fusions walk every node). Measured on the 2-core development machine (shared with other
work, load average 1-3), the 48-layer x 128-expert decomposed skeleton (58,501 nodes):

    python benchmarks/fix_scale.py --decomposed --hidden 64 --intermediate 32 --runs dry-run,fusions-only --sessions 0

--dry-run 31.2 s (the MoE rewrite leaves 3,009 nodes to the fusions), fusions-only 104.5 s (all 58,501 nodes). The
same with --layers 2 / 4 (2,473 / 4,909 nodes), fusions-only: 5.3 / 11.0 s; before the fusions bounded onnxscript's
two-end-node matching (ortgate.fix.fusions), 27.6 / 84.0 s, growing with the square of the graph.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RSS_BUDGET = 1.5e9  # bytes, plus the largest single tensor


def build(folder: Path, args) -> tuple[Path, int, int, int]:
    from tests.models.qwen_moe import ModelSpec, build_model

    spec = ModelSpec(layers=args.layers, experts=args.experts, top_k=8, hidden=args.hidden,
                     moe_intermediate=args.intermediate, moe="dense_loop", weights="external_stub", vocab=1024,
                     num_heads=4, kv_num_heads=2, head_dim=args.hidden // 4, stub_location="model.onnx.data",
                     **({"norm": "decomposed", "rotary": "decomposed", "attention": "decomposed"}
                        if args.decomposed else {}))
    model = build_model(spec)
    folder.mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save_model(model, path)
    rng = np.random.default_rng(0)
    total, largest = 0, 0
    with open(folder / "model.onnx.data", "wb") as f:
        for tensor in model.graph.initializer:
            info = {e.key: e.value for e in tensor.external_data}
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            count = int(np.prod(tensor.dims)) if tensor.dims else 1
            values = (rng.standard_normal(count, dtype=np.float32) * 0.02).astype(
                onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type))
            f.seek(int(info["offset"]))
            f.write(values.tobytes())
            total += values.nbytes
            largest = max(largest, values.nbytes)
    return path, len(model.graph.node), total, largest


def run_fix(model: Path, out: Path, *extra: str) -> tuple[int, float, int, str]:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ortgate", "fix", str(model), "-o", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    return os.waitstatus_to_exitcode(status), wall, usage.ru_maxrss * 1024, output


def time_decode(model: Path, threads: int | None, arena: bool = True) -> dict:
    """One fresh session of `model`, timed as `ortgate fix` times the fixed model (ortgate.fix.measure.DECODE)."""
    import onnxruntime as ort

    from ortgate.fix.measure import DECODE
    from ortgate.graph import build_graph
    from ortgate.runner.inputs import graph_signature, head_size, resolve_dims, sliding_window, synthesize, token_inputs
    from ortgate.runner.measure import BoundSession, Deadline, latency_stats, plan_binding, timed_runs
    from ortgate.runner.session import CPU

    graph = build_graph(onnx.load(str(model), load_external_data=False), str(model))
    signature = graph_signature(graph)
    dims, step = resolve_dims(signature, DECODE, {}, window=sliding_window(graph, None), head=head_size(None, None),
                              policy_file=None)
    feeds = synthesize(signature, dims, step, token_inputs(graph, None))
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.enable_cpu_mem_arena = arena
    session = ort.InferenceSession(str(model), options, providers=[CPU])
    bound = BoundSession(session, plan_binding(CPU, {}), feeds)
    bound.discover_outputs()
    with Deadline(None) as deadline:
        timed_runs(bound, DECODE.warmup, 0, deadline)
        before = resource.getrusage(resource.RUSAGE_SELF)
        load = os.getloadavg()[0]
        runs = timed_runs(bound, 0, DECODE.iterations, deadline)
        after = resource.getrusage(resource.RUSAGE_SELF)
    stats = latency_stats(runs)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / len(runs)
    return {"threads": threads or "default", "arena": arena, "p50_ms": stats.p50_ms, "min_ms": stats.min_ms, "cpu_ms": cpu * 1000,
            "major_faults": after.ru_majflt - before.ru_majflt, "load1": load}


def decode_report(model: Path, sessions: int) -> list[str]:
    lines = [(f"decode step of the fixed model (ORT CPU, 1 x 1 new token after 16 cached, p50 of 20 runs per "
              f"session, {sessions} fresh sessions each; {os.cpu_count()} cores):")]
    for label, threads in (("ORT default session options", None), ("1 intra-op thread", 1)):
        results = []
        for _ in range(sessions):
            proc = subprocess.run([sys.executable, __file__, "--time-decode", str(model),
                                   *(["--threads", str(threads)] if threads else [])],
                                  capture_output=True, text=True, check=True)
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))

        def each(key: str, fmt: str = ".1f", results: list[dict] = results) -> str:
            return " / ".join(f"{r[key]:{fmt}}" for r in results)

        lines.append(f"    {label}: wall p50 {each('p50_ms')} ms (min {each('min_ms')}); CPU {each('cpu_ms')} ms per "
                     f"step; major page faults {each('major_faults', 'd')}; load average {each('load1', '.2f')}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--sessions", type=int, default=3, help="fresh sessions per decode-step setting")
    ap.add_argument("--decomposed", action="store_true",
                    help="decomposed norms, rotary and attention, so the onnxscript fusions run")
    ap.add_argument("--runs", default="dry-run,no-verify,verified",
                    help="comma-separated fix runs to time: dry-run, no-verify, verified, fusions-only (--dry-run "
                         "--ignore moe-not-fused: the MoE loops stay, so the fusions walk the whole graph)")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--time-decode", metavar="MODEL", help="time one session of MODEL's decode step; print JSON")
    ap.add_argument("--threads", type=int, help="with --time-decode: intra-op threads (default: ORT's)")
    ap.add_argument("--no-arena", action="store_true", help="with --time-decode: CPU memory arena off")
    ap.add_argument("--busy", type=int, default=0, help="with --time-decode: busy-loop processes beside it")
    args = ap.parse_args()
    if args.time_decode:
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        try:
            result = time_decode(Path(args.time_decode), args.threads, arena=not args.no_arena)
        finally:
            for proc in busy:
                proc.kill()
                proc.wait()
        print(json.dumps({**result, "busy": args.busy}))
        return 0
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ortgate-fix-scale-"))
    try:
        t = time.perf_counter()
        model, nodes, weight_bytes, largest_in = build(work / "in", args)
        print(f"model: {args.layers} layers x {args.experts} experts (hidden {args.hidden}, intermediate "
              f"{args.intermediate}), dense all-experts loop, {nodes:,} nodes, {weight_bytes / 1e9:.2f} GB of weights; "
              f"written in {time.perf_counter() - t:.0f} s")
        # The largest tensor `fix` writes: one layer's fused fc1 [E, 2I, H] (float32).
        largest_out = args.experts * 2 * args.intermediate * args.hidden * 4
        largest = max(largest_in, largest_out)
        budget = RSS_BUDGET + largest
        ok = True
        # Every run has the norm, rotary and attention fusions on (no --select): on this graph they find nothing to
        # take, which must cost seconds, not the minutes onnxscript's matchers spend walking ~59k nodes.
        runs = set(args.runs.split(","))
        for label, extra in (("--dry-run", ("--dry-run",)), ("--no-verify", ("--no-verify",)), ("verified", ()),
                             ("--dry-run --ignore moe-not-fused", ("--dry-run", "--ignore", "moe-not-fused"))):
            name = {"--dry-run --ignore moe-not-fused": "fusions-only"}.get(label, label.lstrip("-"))
            if name not in runs:
                continue
            out = work / f"out-{name}"
            code, wall, rss, output = run_fix(model, out, *extra)
            if code != 0:
                print(output[-3000:])
                print(f"ortgate fix {label}: exit {code}")
                return 1
            within = rss < budget
            ok = ok and (within or label != "--no-verify")
            print(f"ortgate fix {label}: {wall:.1f} s wall, peak RSS {rss / 1e9:.2f} GB "
                  f"(budget 1.5 GB + largest tensor {largest / 1e6:.1f} MB = {budget / 1e9:.2f} GB: "
                  f"{'PASS' if within else 'FAIL'})")
            for line in output.splitlines():
                if line.startswith(("verification on", "measured", "estimated", "MoE rewrites", "wrote",
                                    "onnxscript fusions", "dry run")):
                    print(f"    {line}")
            if label == "verified" and args.sessions > 0:
                for line in decode_report(out / model.name, args.sessions):
                    print(line)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
