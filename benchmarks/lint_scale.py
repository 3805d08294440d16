"""How long `ortgate lint` takes on 30-35B-class MoE models, and how much memory, next to a bare onnx.load.

For each model (benchmarks/scale_models.py: Qwen3-30B-A3B unfused and fused, Qwen3.6-35B-A3B fused, and the
unfused graph scaled to about 1k, 10k, 50k and 200k nodes; 1M with --million), one fresh process times
`onnx.load(path, load_external_data=False)` and the full `ortgate lint` (the CLI path with the family's shipped
policy, all rules, JSON output) REPEAT times each and reports medians. Peak RSS comes from further fresh
processes, so that peaks do not mix: the lint alone, onnx.load alone, an empty interpreter, and the lint of a
one-node model (the interpreter with everything ortgate imports). The lint processes record every file they
open (audit hook): the external data file must never be one.

Targets (printed as PASS/FAIL):
- lint <= 2x the bare onnx.load time on the ~50k-node model (Qwen3-30B-A3B unfused, 59k nodes);
- lint <= 5x the bare node walk (onnx.load and one Python pass over every node's fields) on that model;
- peak RSS of the lint <= 2x the .onnx file size + the interpreter;
- peak RSS of the 200k-node lint <= 2x that of a process that only runs onnx.load of the same file;
- lint time per 1k nodes flat (max/min within 1.3x) from 10k to 200k nodes.

    python benchmarks/lint_scale.py [--repeat 5] [--million] [--workdir DIR [--keep]]

Models are written to a temporary folder (or --workdir) and removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

LINT_TARGET_RATIO = 2.0  # lint / onnx.load on the ~50k-node model
WALK_TARGET_RATIO = 5.0  # lint / the bare node walk on the ~50k-node model
RSS_FILE_FACTOR = 2.0  # peak RSS <= factor x file size + interpreter
RSS_LOAD_FACTOR = 2.0  # peak RSS of the 200k-node lint <= factor x that of a process running onnx.load of it
FLATNESS = 1.3  # max / min lint ms per 1k nodes over the 10k..200k series
SERIES = (1_000, 10_000, 50_000, 200_000)
MILLION = 1_000_000
HEADLINE_50K = "qwen3-30b-a3b-unfused"


# ---- child processes: each measures one thing in a fresh interpreter ------------------------------------


def _peak_rss_bytes() -> int:
    # VmHWM starts afresh at exec; getrusage's ru_maxrss would carry the (large) parent's peak over on Linux.
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _lint_argv(path: str, report: str, policy: str) -> list[str]:
    return ["lint", path, "--format", "json", "--output", report, *(["--policy", policy] if policy != "-" else [])]


def _child_time(path: str, repeat: int, report: str, policy: str) -> dict:
    import onnx

    from ortgate.cli import main

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    def walk() -> None:  # the least any Python index must do: touch every node's fields once
        model = onnx.load(path, load_external_data=False)
        for node in model.graph.node:
            node.name, node.op_type, node.domain, tuple(node.input), tuple(node.output)

    codes = set()
    load, lint, floor = [], [], []
    argv = _lint_argv(path, report, policy)
    codes.add(main(argv))  # warm-up: imports, rule registry, page cache
    for _ in range(repeat):
        load.append(timed(lambda: onnx.load(path, load_external_data=False)))
        lint.append(timed(lambda: codes.add(main(argv))))
        floor.append(timed(walk))
    return {"load": load, "lint": lint, "walk": floor, "exit_codes": sorted(codes)}


def _child_rss(mode: str, path: str, report: str, policy: str) -> dict:
    opened: list[str] = []
    if mode == "lint":
        sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" and args else None)
        from ortgate.cli import main

        code = main(_lint_argv(path, report, policy))
        data_opened = sorted({p for p in opened if p.endswith(".data")})
        findings = json.loads(Path(report).read_text()).get("findings", []) if code in (0, 1) else []
        crashed = sorted({f["code"] for f in findings if "internal error" in f.get("message", "")})
        return {"rss": _peak_rss_bytes(), "exit_code": code, "data_opened": data_opened, "findings": len(findings),
                "crashed_rules": crashed}
    if mode == "load":
        import onnx

        onnx.load(path, load_external_data=False)
    elif mode != "empty":
        raise SystemExit(f"unknown mode {mode}")
    return {"rss": _peak_rss_bytes()}


def _run_child(*args: str, timeout: float = 3600) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("ORTGATE_STRICT", None)
    proc = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---- the benchmark ----------------------------------------------------------------------------------------


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import google.protobuf
    import onnx
    from google.protobuf.internal import api_implementation

    return (f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}, onnx {onnx.__version__}, "
            f"protobuf {google.protobuf.__version__} ({api_implementation.Type()} backend), {platform.system()}")


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _policy_for(name: str) -> Path:
    """The shipped deployment policy of the model's family (so that the deployment rules run too)."""
    return REPO / "policies" / ("qwen3.6-35b-a3b-h100.yaml" if name.startswith("qwen3.6") else "qwen3-30b-a3b-cuda.yaml")


def _tiny_model(path: Path) -> Path:
    """A one-node model: linting it measures the interpreter with everything ortgate imports."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"], name="identity")], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    onnx.save_model(helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)]), path)
    return path


def run(args: argparse.Namespace) -> int:
    from benchmarks.scale_models import headline_specs, scaled_unfused, write_model

    load_before = os.getloadavg()[0]
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="ortgate-scale-"))
    report = str(workdir / "report.json")
    try:
        specs = [(name, spec, data) for name, (spec, data) in headline_specs().items()]
        sizes = [*SERIES, *([MILLION] if args.million else [])]
        specs += [(f"unfused-{n // 1000}k", scaled_unfused(n), "absent") for n in sizes]
        models = []
        for name, spec, data in specs:
            _log(f"building {name}")
            models.append(write_model(name, spec, workdir, data_file=data))

        baseline_empty = _run_child("rss", "empty", "-", "-", "-")["rss"]
        tiny = _tiny_model(workdir / "tiny.onnx")
        baseline = _run_child("rss", "lint", str(tiny), report, "-")["rss"]
        rows = []
        for m in models:
            repeat = 1 if m.nodes >= MILLION // 2 else args.repeat  # the 1M-node graph: once
            policy = str(_policy_for(m.name))
            _log(f"measuring {m.name} ({m.nodes:,} nodes, {repeat}x)")
            t = _run_child("time", str(m.path), str(repeat), report, policy)
            start = time.perf_counter()
            rss_lint = _run_child("rss", "lint", str(m.path), report, policy)
            cold = time.perf_counter() - start  # a fresh process: interpreter start, imports, one lint
            rss_load = _run_child("rss", "load", str(m.path), report, policy)["rss"]
            load, lint, walk = (statistics.median(t[k]) for k in ("load", "lint", "walk"))
            rows.append({
                "model": m, "policy": Path(policy).name, "load": load, "lint": lint, "walk": walk,
                "exit_codes": t["exit_codes"], "rss_lint": rss_lint["rss"], "rss_load": rss_load, "cold": cold,
                "data_opened": rss_lint["data_opened"], "findings": rss_lint["findings"],
                "crashed_rules": rss_lint["crashed_rules"],
                "budget": RSS_FILE_FACTOR * m.file_bytes + baseline,
            })
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    flags = f"--repeat {args.repeat}{' --million' if args.million else ''}"
    out = [
        f"Command: `python benchmarks/lint_scale.py {flags}`  ",
        f"Machine: {_machine()}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after  ",
        (f"Medians of {args.repeat} runs in one process (`ortgate.cli.main(['lint', MODEL, '--policy', POLICY, "
        "'--format', 'json', '--output', FILE])`, all rules); each peak RSS from a fresh process. Interpreter: "
        f"{_mib(baseline)} MiB (`ortgate lint` of a one-node model; an empty Python is {_mib(baseline_empty)} MiB)."),
        "",
        ("| model | nodes | .onnx | declared weights | .data file | findings | onnx.load ms | node walk ms "
        "| ortgate lint ms | lint / load | lint ms per 1k nodes | fresh process s | peak RSS lint MiB | budget MiB "
        "| onnx.load RSS MiB |"),
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        m = r["model"]
        out.append(
            f"| {m.name} | {m.nodes:,} | {_size(m.file_bytes)} | {_size(m.declared_weight_bytes)} | {m.data_file} "
            f"| {r['findings']} | {r['load'] * 1e3:.1f} | {r['walk'] * 1e3:.1f} | {r['lint'] * 1e3:.1f} "
            f"| {r['lint'] / r['load']:.0f}x | {r['lint'] * 1e6 / m.nodes:.2f} | {r['cold']:.2f} | {_mib(r['rss_lint'])} "
            f"| {_mib(r['budget'])} | {_mib(r['rss_load'])} |"
        )
    out += [
        "",
        ("Policies: qwen3.6-* with policies/qwen3.6-35b-a3b-h100.yaml, the others with "
        "policies/qwen3-30b-a3b-cuda.yaml. node walk: onnx.load plus reading every node's name, op_type, domain, "
        "inputs and outputs once in Python, the least any Python index of the graph costs. fresh process: "
        "wall time of one `ortgate lint` in a new interpreter (start-up and imports included). budget: "
        f"{RSS_FILE_FACTOR:g}x the .onnx size + the interpreter. onnx.load RSS: a fresh process that only runs "
        "onnx.load(path, load_external_data=False)."),
        "",
    ]

    verdicts = []
    by_name = {r["model"].name: r for r in rows}
    head = by_name[HEADLINE_50K]
    ratio = head["lint"] / head["load"]
    verdicts.append((ratio <= LINT_TARGET_RATIO,
                     (f"lint <= {LINT_TARGET_RATIO:g}x onnx.load on {HEADLINE_50K} ({head['model'].nodes:,} nodes): "
                     f"{head['lint'] * 1e3:.0f} ms vs {head['load'] * 1e3:.1f} ms = {ratio:.0f}x "
                     f"(lint / node walk = {head['lint'] / head['walk']:.1f}x)")))
    walk_ratio = head["lint"] / head["walk"]
    verdicts.append((walk_ratio <= WALK_TARGET_RATIO,
                     (f"lint <= {WALK_TARGET_RATIO:g}x the node walk on {HEADLINE_50K}: {head['lint'] * 1e3:.0f} ms vs "
                      f"{head['walk'] * 1e3:.1f} ms = {walk_ratio:.1f}x")))
    over = [r for r in rows if r["rss_lint"] > r["budget"]]
    worst = max(rows, key=lambda r: r["rss_lint"] / r["budget"])
    verdicts.append((not over,
                     f"peak RSS <= {RSS_FILE_FACTOR:g}x .onnx size + interpreter on every model: worst "
                     f"{worst['model'].name} {_mib(worst['rss_lint'])} MiB vs {_mib(worst['budget'])} MiB; "
                     f"on {HEADLINE_50K} {_mib(head['rss_lint'])} MiB, bare onnx.load alone "
                     f"{_mib(head['rss_load'])} MiB" + (f" (over: {len(over)} of {len(rows)} models)" if over else "")))
    big = by_name["unfused-200k"]
    rss_ratio = big["rss_lint"] / big["rss_load"]
    verdicts.append((rss_ratio <= RSS_LOAD_FACTOR,
                     (f"peak RSS of the unfused-200k lint <= {RSS_LOAD_FACTOR:g}x a process's onnx.load of it: "
                      f"{_mib(big['rss_lint'])} MiB vs {_mib(big['rss_load'])} MiB = {rss_ratio:.2f}x")))
    series = [by_name[f"unfused-{n // 1000}k"] for n in SERIES if n >= 10_000]
    per_node = [r["lint"] / r["model"].nodes for r in series]
    spread = max(per_node) / min(per_node)
    verdicts.append((spread <= FLATNESS,
                     f"lint time per node flat within {FLATNESS:g}x from 10k to 200k nodes: "
                     + ", ".join(f"{r['model'].nodes / 1000:.0f}k {r['lint'] * 1e6 / r['model'].nodes:.2f} ms/1k"
                                 for r in series) + f" (max/min {spread:.2f}x)"))
    opened = sorted({p for r in rows for p in r["data_opened"]})
    verdicts.append((not opened, "no external data file opened (audit hook in each lint process)"
                     + (f": opened {opened}" if opened else "")))
    crashed = sorted({f"{r['model'].name}: {code}" for r in rows for code in r["crashed_rules"]})
    verdicts.append((not crashed, "no rule failed with an internal error" + (f": {crashed}" if crashed else "")))
    bad_exit = [r["model"].name for r in rows if set(r["exit_codes"]) - {0, 1}]
    verdicts.append((not bad_exit, "every lint ended with a verdict (exit 0 or 1)"
                     + (f": not {bad_exit}" if bad_exit else "")))
    for ok, text in verdicts:
        out.append(f"- {'PASS' if ok else 'FAIL'}: {text}")
    print("\n".join(out))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per model (medians are reported)")
    parser.add_argument("--million", action="store_true", help="also lint a ~1M-node graph (once; slow)")
    parser.add_argument("--workdir", help="write the models here instead of a temporary folder")
    parser.add_argument("--keep", action="store_true", help="keep the models (with --workdir)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, *rest = args.child
        if kind == "time":
            result = _child_time(rest[0], int(rest[1]), rest[2], rest[3])
        else:
            result = _child_rss(rest[0], rest[1], rest[2], rest[3])
        print(json.dumps(result))
        return 0
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
