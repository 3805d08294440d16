"""What the decode cost model adds to `ortgate lint` on the 59k-node Qwen3-30B-A3B dense-loop skeleton.

The skeleton of the scale benchmark (benchmarks/scale_models.py, weights declared as external data, never read)
is linted in one process with the shipped policy policies/qwen3-30b-a3b-cuda.yaml twice over: as shipped (its
`throughput:` block names device h100-sxm, so the lint estimates the step, judges the targets and prices every
finding) and with the `throughput:` block removed (nothing estimated). Runs alternate, REPEAT of each; the
medians and their ratio are printed.

Target (printed as PASS/FAIL): the estimate adds at most 20% to the lint (ratio <= 1.20).

    python benchmarks/estimate_overhead.py [--repeat 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TARGET = 1.20
POLICY = REPO / "policies" / "qwen3-30b-a3b-cuda.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args(argv)

    from benchmarks.scale_models import qwen3_30b_a3b_unfused, write_model
    from ortgate.cli import main as ortgate

    with tempfile.TemporaryDirectory(prefix="ortgate-estimate-overhead-") as tmp:
        work = args.workdir or Path(tmp)
        model = write_model("qwen3-30b-a3b-unfused", qwen3_30b_a3b_unfused(), work)
        data = yaml.safe_load(POLICY.read_text())
        data.pop("throughput")
        # `extends` is resolved relative to the policy file: builtin:cuda-decode needs no path
        bare = work / "qwen3-30b-a3b-cuda-no-throughput.yaml"
        bare.write_text(yaml.safe_dump(data, sort_keys=False))
        report = work / "report.json"
        times: dict[str, list[float]] = {"with estimate": [], "without": []}
        for i in range(args.repeat + 1):  # the first round warms imports and caches and is not counted
            for label, policy in (("with estimate", POLICY), ("without", bare)):
                gc.collect()
                start = time.perf_counter()
                ortgate(["lint", str(model.path), "--policy", str(policy), "--format", "json", "--output", str(report)])
                elapsed = time.perf_counter() - start
                if i:
                    times[label].append(elapsed)
        with_estimate = statistics.median(times["with estimate"])
        without = statistics.median(times["without"])
        ratio = with_estimate / without
        print(f"model: {model.nodes:,} nodes ({model.name}), policy {POLICY.relative_to(REPO)}")
        print(f"lint with the estimate (device h100-sxm): median {with_estimate * 1e3:,.0f} ms of "
              f"{args.repeat} ({', '.join(f'{t * 1e3:.0f}' for t in times['with estimate'])})")
        print(f"lint without a throughput block:        median {without * 1e3:,.0f} ms of "
              f"{args.repeat} ({', '.join(f'{t * 1e3:.0f}' for t in times['without'])})")
        print(f"ratio {ratio:.3f} (target <= {TARGET:.2f}): {'PASS' if ratio <= TARGET else 'FAIL'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
