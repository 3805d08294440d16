"""Wall time and peak RSS of `ortgate fix` on a 48-layer, 128-expert dense-loop MoE model with real random weights.

The model is the test generator's dense all-experts loop (tests/models/qwen_moe.py, moe="dense_loop"): its graph is
built with external-data stubs, then the data file is filled tensor by tensor with seeded normal(0, 0.02) values, so
the model is a few GB on disk and never whole in this process's memory. `ortgate fix` then runs in a fresh process
(peak RSS from wait4), once with --no-verify and once with verification (which also lints and measures).

Target (printed as PASS/FAIL): peak RSS of `ortgate fix --no-verify` below 1.5 GB plus the largest single tensor it
reads or writes. With verification the report prints the peak too: ORT then holds the original model's weights.

    python benchmarks/fix_scale.py [--layers 48] [--experts 128] [--hidden 256] [--intermediate 128] [--workdir DIR --keep]

Files go to a temporary folder (or --workdir) and are removed afterwards unless --keep.
"""

from __future__ import annotations

import argparse
import os
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
                     num_heads=4, kv_num_heads=2, head_dim=args.hidden // 4, stub_location="model.onnx.data")
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=128)
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
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
        for label, extra in (("--no-verify", ("--no-verify",)), ("verified", ())):
            out = work / f"out{'-noverify' if extra else ''}"
            code, wall, rss, output = run_fix(model, out, *extra)
            if code != 0:
                print(output[-3000:])
                print(f"ortgate fix {label}: exit {code}")
                return 1
            within = rss < budget
            ok = ok and (within or label == "verified")
            print(f"ortgate fix {label}: {wall:.1f} s wall, peak RSS {rss / 1e9:.2f} GB "
                  f"(budget 1.5 GB + largest tensor {largest / 1e6:.1f} MB = {budget / 1e9:.2f} GB: "
                  f"{'PASS' if within else 'FAIL'})")
            for line in output.splitlines():
                if line.startswith(("verification on", "measured", "MoE rewrites", "wrote")):
                    print(f"    {line}")
            shutil.rmtree(out, ignore_errors=True)
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
