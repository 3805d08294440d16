"""A decode step before and after `ortgate fix` of the committed exports with a KV cache, each run's own figures:
`ortgate fix MODEL -o OUT --context-length 64` (MoE, norms, GroupQueryAttention with the rotary folded in), then
fix's measurement (one step of 1 new token after 16 cached, original and fixed each with its own cache, the
runner's synthesised inputs, ORT CPU with its default session options, p50 of 20 runs per round, 5 alternated
rounds) and the cost model's estimate of the same step, and the proof (32 greedy tokens at batch 1 and 2).

    python benchmarks/fix_decode.py [MODEL ...]   # default: the optimum exports in tests/fixtures/exported
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ortgate.cli import main as ortgate  # noqa: E402

DEFAULT = [ROOT / "tests/fixtures/exported/optimum-qwen3_moe-past", ROOT / "tests/fixtures/exported/optimum-llama-past"]


def fix(model: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = ortgate(["fix", str(model), "-o", str(Path(tmp) / "out"), "--context-length", "64", "--format", "json"])
        report = json.loads(out.getvalue())
        if code != 0:
            raise SystemExit(f"ortgate fix {model} exited {code}: {report.get('failure')}")
        return report


def main() -> None:
    models = [Path(m) for m in sys.argv[1:]] or DEFAULT
    for model in models:
        report = fix(model)
        m, p, tokens = report["measurement"], report["prediction"], report["tokens"]
        spread = m["speedup_spread"]
        print(f"{model.name}: {m['step']}")
        print(f"  measured: original {m['original_p50_ms']:.3f} ms, fixed {m['fixed_p50_ms']:.3f} ms, speedup "
              f"{m['speedup']:.2f}x ({spread[0]:.2f}x-{spread[1]:.2f}x over {m['rounds']} rounds)")
        print(f"  estimated ({p['device']}, {p['figures']}): original {p['original_ms_per_step_expected']:.3f} ms, "
              f"fixed {p['fixed_ms_per_step_expected']:.3f} ms, speedup {p['speedup']:.2f}x")
        steps = min(b["steps"] for b in tokens["batches"])
        print(f"  tokens: {steps} greedy steps at batch {', '.join(str(b['batch']) for b in tokens['batches'])}: "
              f"{'identical' if tokens['passed'] else 'DIVERGED'}; lint after: {sorted(set(report['lint']['after']))}")


if __name__ == "__main__":
    main()
