"""Is `ortgate lint` as fast as a pre-commit hook needs? Each target is a ratio measured in this one run, PASS/FAIL:

- whole-process lint of examples/qwen3-moe-tiny-unfused (policies/tiny-moe-cpu.yaml) <= 0.3x `python -c "import
  onnx"` (a lint faster than importing onnx);
- whole-process lint of a generated 48-layer x 128-expert dense-loop graph (weights absent, CPU policy, JSON)
  <= 1.2x a whole process that only runs `onnx.load(path, load_external_data=False)` of it;
- in-process lint of the 59k-node Qwen3-30B-A3B skeleton (benchmarks/scale_models.py, its shipped policy)
  <= 5x the bare node loop (onnx.load, then every node's name, op type, domain, inputs and outputs read once);
- in-process lint time per node flat within 1.3x from 10k to 200k nodes;
- peak RSS of the 200k-node lint <= 2x that of a process that only runs onnx.load of the same file.

Whole processes are timed in CPU seconds (user + system of the child, which load on a shared machine inflates less
than wall time), as medians of alternated pairs, each after a warm-up; in-process times are medians of REPEAT runs
after a warm-up lint. Beside each median ratio, the range of its pairs' ratios (an alternated pair of whole
processes, or one in-process lint and the bare loop after it) says whether the verdict holds for every pair; for
the flat target, the bounds any choice of one run per model (a run choice) gives. A verdict a rerun may reverse
shows as one. The children write bytecode caches to a temporary folder (PYTHONPYCACHEPREFIX), as an installed
package has them: with PYTHONDONTWRITEBYTECODE set, every process would compile ortgate's sources anew.

    python benchmarks/lint_startup.py [--rounds 5] [--repeat 3] [--workdir DIR [--keep]]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXAMPLE = REPO / "examples" / "qwen3-moe-tiny-unfused"
CPU_POLICY = REPO / "policies" / "tiny-moe-cpu.yaml"
SKELETON_POLICY = REPO / "policies" / "qwen3-30b-a3b-cuda.yaml"
TARGETS = {"small": 0.3, "dense": 1.2, "skeleton": 5.0, "flat": 1.3, "rss": 2.0}
SERIES = (10_000, 50_000, 200_000)


# ---- children ------------------------------------------------------------------------------------------------------


def _peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(kind: str, path: str, policy: str, report: str, repeat: int) -> dict:
    if kind == "load":
        import onnx

        onnx.load(path, load_external_data=False)
        return {"rss": _peak_rss_bytes()}
    from ortgate.cli import main

    argv = ["lint", path, "--format", "json", "--output", report, *(["--policy", policy] if policy != "-" else [])]
    if kind == "rss":
        code = main(argv)
        return {"rss": _peak_rss_bytes(), "code": code}
    if kind == "phases":
        return {"phases": _phases(argv)}
    # "time": in process, after a warm-up lint of the same model
    import onnx

    def walk() -> None:
        model = onnx.load(path, load_external_data=False)
        for node in model.graph.node:
            node.name, node.op_type, node.domain, tuple(node.input), tuple(node.output)

    codes = {main(argv)}
    lint, floor = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        codes.add(main(argv))
        lint.append(time.perf_counter() - start)
        start = time.perf_counter()
        walk()
        floor.append(time.perf_counter() - start)
    return {"lint": statistics.median(lint), "walk": statistics.median(floor), "codes": sorted(codes),
            "runs": lint, "walks": floor}


def _phases(argv: list[str]) -> list[tuple[str, float]]:
    """Where one in-process lint (after a warm-up) spends its time: each progress note the lint gives as it goes (its
    spinner's messages), and where the gate and the reports begin, with the seconds until the next one. A rule's
    span holds whatever it is the first to ask for (a shared MoE reading is paid by the first rule that needs it)."""
    from contextlib import contextmanager

    import ortgate.cli.lint as cli_lint
    import ortgate.engine.pipeline as pipeline
    import ortgate.report as report
    from ortgate.cli import main

    main(argv)
    stamps: list[tuple[float, str]] = []

    @contextmanager
    def stamping(_enabled: bool, delay: float | None = None):
        yield lambda message: stamps.append((time.perf_counter(), message))

    def stamped(message: str, fn):
        def call(*args, **kwargs):
            stamps.append((time.perf_counter(), message))
            return fn(*args, **kwargs)
        return call

    cli_lint.progress = stamping  # the spinner's notes, timed instead of shown
    pipeline.judge = stamped("gate", pipeline.judge)  # and where the rules end and the reports begin
    report.render = stamped("reports", report.render)
    start = time.perf_counter()
    stamps.append((start, "the command line, the policy and the genai config"))
    main(argv)
    stamps.append((time.perf_counter(), ""))
    return [(message, after - at) for (at, message), (after, _) in zip(stamps, stamps[1:])]


def _phase_summary(phases: list[tuple[str, float]], walk: float, top: int = 6) -> str:
    """The lint's phases as ms and multiples of the bare node loop: parse, index, the set-up before the rules, the
    rules together (the costliest named), pricing, the gate and the reports."""
    def kind(message: str) -> str:
        if message.startswith("loading"):
            return "parse"
        if message.startswith("indexing"):
            return "index and layers"
        if message.startswith("matching"):
            return "expectations (the first MoE and attention reading)"
        if message.startswith("rule "):
            return "rules"
        return {"pricing the findings": "pricing", "gate": "gate", "reports": "reports"}.get(message, "command line")

    totals: dict[str, float] = {}
    for message, seconds in phases:
        phase = kind(message)
        totals[phase] = totals.get(phase, 0.0) + seconds
    rules = sorted(((s, m.split(": ", 1)[1]) for m, s in phases if m.startswith("rule ")), reverse=True)
    parts = [f"{name} {seconds * 1e3:,.0f} ms ({seconds / walk:.1f}x)" for name, seconds in totals.items()]
    costly = ", ".join(f"{name} {seconds * 1e3:,.0f}" for seconds, name in rules[:top])
    return "; ".join(parts) + f"; the costliest rules (ms, each with what it is first to ask for): {costly}"


# ---- the benchmark -------------------------------------------------------------------------------------------------


def _env(pycache: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "PYTHONPYCACHEPREFIX": pycache}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("ORTGATE_STRICT", None)
    return env


def _cpu(argv: list[str], env: dict) -> float:
    """CPU seconds (user + system) of one whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _pairs(a: list[str], b: list[str], rounds: int, env: dict) -> tuple[float, float, list[float]]:
    """Medians of CPU seconds of `a` and `b`, run alternately after one warm-up each, and each pair's ratio a/b."""
    _cpu(a, env), _cpu(b, env)
    xs, ys = [], []
    for _ in range(rounds):
        xs.append(_cpu(a, env))
        ys.append(_cpu(b, env))
    return statistics.median(xs), statistics.median(ys), [x / y for x, y in zip(xs, ys)]


def _spread(low: float, high: float, bound: float, what: str = "pair") -> str:
    """The range a ratio takes over its pairs (or runs), and whether every one, no one or only some meet the bound:
    a verdict on a median that some of them contradict is one the next run may reverse."""
    agree = f"every {what}" if high <= bound else f"no {what}" if low > bound else f"only some {what}s"
    return f"; {what}s {low:.2f}x to {high:.2f}x, {agree} within {bound}x"


def _pair_spread(ratios: list[float], bound: float) -> str:
    return _spread(min(ratios), max(ratios), bound)


def _run_child(env: dict, *args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"child {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> int:
    from benchmarks.scale_models import qwen3_30b_a3b_unfused, scaled_unfused, write_model
    from tests.models.qwen_moe import ModelSpec

    load_before = os.getloadavg()[0]
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ortgate-startup-"))
    pycache = tempfile.mkdtemp(prefix="ortgate-pycache-")
    env = _env(pycache)
    report = str(workdir / "report.json")
    py = sys.executable
    lines, verdicts = [], []
    try:
        print("building models", file=sys.stderr)
        dense = write_model("dense-48x128", ModelSpec(layers=48, experts=128, moe="dense_loop",
                                                      weights="external_stub"), workdir)
        skeleton = write_model("qwen3-30b-a3b-unfused", qwen3_30b_a3b_unfused(), workdir)
        series = [write_model(f"unfused-{n // 1000}k", scaled_unfused(n), workdir) for n in SERIES]

        print("whole processes", file=sys.stderr)
        lint_small = [py, "-m", "ortgate", "lint", str(EXAMPLE), "--policy", str(CPU_POLICY)]
        small, onnx_import, pairs = _pairs(lint_small, [py, "-c", "import onnx"], args.rounds, env)
        ratio = small / onnx_import
        verdicts.append((ratio <= TARGETS["small"], (f"lint of {EXAMPLE.name} (whole process) <= {TARGETS['small']}x "
                         f"`python -c \"import onnx\"`: {small:.3f} s vs {onnx_import:.3f} s CPU = {ratio:.2f}x"
                         + _pair_spread(pairs, TARGETS["small"]))))
        lint_dense = [py, "-m", "ortgate", "lint", str(dense.path), "--policy", str(CPU_POLICY), "--format", "json",
                      "--output", report]
        load_dense = [py, "-c", f"import onnx; onnx.load({str(dense.path)!r}, load_external_data=False)"]
        whole, load, pairs = _pairs(lint_dense, load_dense, args.rounds, env)
        ratio = whole / load
        verdicts.append((ratio <= TARGETS["dense"], (f"lint of the 48 x 128 dense-loop graph ({dense.nodes:,} nodes, "
                         f"whole process) <= {TARGETS['dense']}x a whole-process onnx.load: {whole:.3f} s vs "
                         f"{load:.3f} s CPU = {ratio:.2f}x" + _pair_spread(pairs, TARGETS["dense"]))))

        print("in process", file=sys.stderr)
        head = _run_child(env, "time", str(skeleton.path), str(SKELETON_POLICY), report, str(args.repeat))
        ratio = head["lint"] / head["walk"]
        pairs = [x / y for x, y in zip(head["runs"], head["walks"])]
        phases = _run_child(env, "phases", str(skeleton.path), str(SKELETON_POLICY), report, "1")["phases"]
        verdicts.append((ratio <= TARGETS["skeleton"], (f"in-process lint of the {skeleton.nodes:,}-node skeleton <= "
                         f"{TARGETS['skeleton']}x the bare node loop: {head['lint'] * 1e3:,.0f} ms vs "
                         f"{head['walk'] * 1e3:,.0f} ms = {ratio:.1f}x" + _pair_spread(pairs, TARGETS["skeleton"])
                         + "\n  where one in-process lint of the skeleton goes (ms, x the bare loop): "
                         + _phase_summary(phases, head["walk"]))))
        timed = [(m, _run_child(env, "time", str(m.path), str(SKELETON_POLICY), report, str(args.repeat)))
                 for m in series]
        per_node = [t["lint"] / m.nodes for m, t in timed]
        spread = max(per_node) / min(per_node)
        # Over the runs, not only their medians: bounds on the max/min any choice of one run per model gives.
        fastest = [min(t["runs"]) / m.nodes for m, t in timed]
        slowest = [max(t["runs"]) / m.nodes for m, t in timed]
        runs = _spread(max(1.0, max(fastest) / min(slowest)), max(slowest) / min(fastest), TARGETS["flat"],
                       "run choice")
        verdicts.append((spread <= TARGETS["flat"], f"lint time per node flat within {TARGETS['flat']}x from 10k to "
                         "200k nodes: " + ", ".join(f"{m.nodes:,} nodes {t['lint'] * 1e3:,.0f} ms "
                                                    f"({t['lint'] * 1e6 / m.nodes:.1f} ms per 1k)" for m, t in timed)
                         + f" (max/min {spread:.2f}x{runs})"))
        big = series[-1]
        rss_lint = _run_child(env, "rss", str(big.path), str(SKELETON_POLICY), report, "1")["rss"]
        rss_load = _run_child(env, "load", str(big.path), "-", report, "1")["rss"]
        ratio = rss_lint / rss_load
        verdicts.append((ratio <= TARGETS["rss"], (f"peak RSS of the {big.nodes:,}-node lint <= {TARGETS['rss']}x "
                         f"onnx.load's: {rss_lint / 2**20:.0f} MiB vs {rss_load / 2**20:.0f} MiB = {ratio:.2f}x")))
        codes = sorted({c for _, t in timed for c in t["codes"]} | set(head["codes"]))
    finally:
        shutil.rmtree(pycache, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    lines.append(f"Command: `python benchmarks/lint_startup.py --rounds {args.rounds} --repeat {args.repeat}`  ")
    lines.append(f"Machine: {os.cpu_count()} CPU cores, Python {sys.version.split()[0]}; load average "
                 f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after; in-process lint exit codes {codes}")
    lines.append("")
    lines += [f"- {'PASS' if ok else 'FAIL'}: {text}" for ok, text in verdicts]
    print("\n".join(lines))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternated pairs of whole processes (medians)")
    parser.add_argument("--repeat", type=int, default=3, help="in-process runs per model (medians)")
    parser.add_argument("--workdir", help="write the models here instead of a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the models (with --workdir)")
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, path, policy, report, repeat = args.child
        print(json.dumps(_child(kind, path, policy, report, int(repeat))))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
