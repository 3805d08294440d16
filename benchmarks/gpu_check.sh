#!/usr/bin/env bash
# End-to-end check of `ortgate run`'s CUDA path on a machine with an NVIDIA GPU: the provider probe, the
# policy session on CUDAExecutionProvider with its options verified, IOBinding to device buffers, CUDA graph
# capture and replay (gpu_graph_id), the default-session baseline and the ORT_DISABLE_ALL output comparison,
# ORT's profile, nvidia-smi's device name and memory, the harness overhead, the decode cost model's estimate
# against the measurement (benchmarks/estimate_accuracy.py --provider cuda), and the runner's tests.
#
#   bash benchmarks/gpu_check.sh                       # python3 with onnxruntime-gpu, onnx, numpy, pyyaml, jsonschema, rich
#   PYTHON=/path/to/python OUT=/tmp/gpu-check bash benchmarks/gpu_check.sh
#   ORT_GPU_DIR=/tmp/ortgpu bash benchmarks/gpu_check.sh   # onnxruntime-gpu installed with `pip install --target`
#
# Models: tests/fixtures/exported/genai-gpt_oss-fp16-cuda (fp16 GQA + MoE: every compute node has a CUDA kernel,
# so CUDA graph capture is possible) and genai-qwen3_5_moe-fp16-cuda (its linear-attention ops are newer than
# ortgate's kernel table: run without CUDA graph, where any CPU placement is reported). Exit status 0 when every
# check holds.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
OUT="${OUT:-$(mktemp -d -t ortgate-gpu-check-XXXXXX)}"
FIXTURES="$REPO/tests/fixtures/exported"
mkdir -p "$OUT"
cd "$REPO"
export PYTHONPATH="${ORT_GPU_DIR:+$ORT_GPU_DIR:}$REPO${PYTHONPATH:+:$PYTHONPATH}"
export ORTGATE_STRICT=1  # a rule's exception fails the check instead of becoming an info finding

step() { printf '\n== %s\n' "$*"; }
fail() { printf 'gpu_check: FAILED: %s\n' "$*" >&2; exit 1; }

step "environment"
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader
"$PYTHON" - <<'EOF' || fail "python environment"
import importlib.util, sys
missing = [m for m in ("onnx", "numpy", "yaml", "jsonschema", "rich", "onnxruntime") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing python packages: {', '.join(missing)}")
import onnxruntime as ort
print(f"python {sys.version.split()[0]}, onnxruntime {ort.__version__} from {ort.__file__}")
print(f"available providers: {ort.get_available_providers()}")
from ortgate.runner.session import provider_availability
ok, reason = provider_availability("CUDAExecutionProvider")
if not ok:
    sys.exit(f"CUDAExecutionProvider cannot be created: {reason}")
print("CUDAExecutionProvider: created on a probe model")
EOF

cat > "$OUT/gpt-oss-cuda-graph.yaml" <<'EOF'
name: gpu-check-gpt-oss-cuda-graph
session:
  graph_optimization_level: ORT_ENABLE_ALL
  free_dimension_overrides: {batch_size: 1, sequence_length: 1}
execution_provider:
  name: CUDAExecutionProvider
  options: {enable_cuda_graph: "1", device_id: "0"}
throughput:
  match: "NVIDIA*"
  min_tokens_per_s: 1             # trivially met: proves the targets are applied on a matching GPU
runner:
  past_sequence_length: 64
  warmup: 5
  iterations: 50
EOF
cat > "$OUT/qwen35-cuda.yaml" <<'EOF'
name: gpu-check-qwen35-cuda
session:
  graph_optimization_level: ORT_ENABLE_ALL
  free_dimension_overrides: {batch_size: 1, sequence_length: 1}
execution_provider:
  name: CUDAExecutionProvider
  options: {enable_cuda_graph: "0"}
runner:
  past_sequence_length: 64
  warmup: 3
  iterations: 30
EOF

step "ortgate run: GPT-OSS fp16 on CUDA with CUDA graph (baseline, profile, dump)"
"$PYTHON" -m ortgate run "$FIXTURES/genai-gpt_oss-fp16-cuda" --policy "$OUT/gpt-oss-cuda-graph.yaml" \
  --compare-default --profile "$OUT/gpt_oss.trace.json" --dump "$OUT/gpt_oss.optimized.onnx" --timeout 300 \
  --format json --output "$OUT/gpt_oss.json" --exit-zero
"$PYTHON" -m ortgate run "$FIXTURES/genai-gpt_oss-fp16-cuda" --policy "$OUT/gpt-oss-cuda-graph.yaml" \
  --compare-default --timeout 300 --exit-zero | tee "$OUT/gpt_oss.txt"
"$PYTHON" - "$OUT/gpt_oss.json" <<'EOF' || fail "GPT-OSS CUDA graph run"
import json, sys
report = json.load(open(sys.argv[1]))
run = report["run"]
active = {f["rule"]: f for f in report["findings"] if not f["suppressed"]}
s, m = run["session"], run["measurement"]
checks = {
    "session runs on CUDA": s["provider"]["ran_on"][0] == "CUDAExecutionProvider",
    "every option applied": bool(s["options"]) and all(o["applied"] for o in s["options"]),
    "overrides pinned": all(d["status"] == "pinned" for d in s["dims"]),
    "measured on the GPU": m is not None and m["device_kind"] == "gpu" and m["device"].startswith("NVIDIA"),
    "CUDA graph replayed": m is not None and m["cuda_graph"] and m["warmup"] >= 3,
    "baseline measured": run["baseline"] is not None and run["speedup_vs_default"] is not None,
    "outputs match ORT_DISABLE_ALL": run["correctness"] is not None and all(
        o["mismatched"] == 0 for o in run["correctness"]["outputs"]),
    "profile parsed": run["profile"] is not None and run["profile"]["runs"] > 0,
    "dump written and linted": s["dump"]["path"] is not None and report["inputs"]["optimized"] is not None,
    "no runtime errors": not any(r in active for r in ("ep-unavailable", "ep-fallback", "option-not-applied",
                                                        "free-dim-unresolved", "optimization-changed-outputs")),
    "throughput target applied and met": "throughput-target-missed" not in active,
}
for name, ok in checks.items():
    print(f"  {'ok  ' if ok else 'FAIL'} {name}")
print(f"  p50 {m['stats']['p50_ms']:.4f} ms, {m['tokens_per_second']:.1f} tokens/s, speedup "
      f"{run['speedup_vs_default']:.3f}x, memory {m['peak_memory_bytes']} ({m['memory_source']})")
sys.exit(0 if all(checks.values()) else 1)
EOF

step "ortgate run: Qwen3.5-MoE fp16 on CUDA without CUDA graph (IOBinding on device, CPU placement reported)"
"$PYTHON" -m ortgate run "$FIXTURES/genai-qwen3_5_moe-fp16-cuda" --policy "$OUT/qwen35-cuda.yaml" --compare-default \
  --profile --timeout 300 --format json --output "$OUT/qwen35.json" --exit-zero
"$PYTHON" - "$OUT/qwen35.json" <<'EOF' || fail "Qwen3.5 CUDA run"
import json, sys
report = json.load(open(sys.argv[1]))
run = report["run"]
active = {f["rule"]: f for f in report["findings"] if not f["suppressed"]}
s, m = run["session"], run["measurement"]
checks = {
    "session runs on CUDA": s["provider"]["ran_on"][0] == "CUDAExecutionProvider",
    "measured on the GPU with IOBinding": m is not None and m["device_kind"] == "gpu" and not m["cuda_graph"],
    "outputs match ORT_DISABLE_ALL": all(o["mismatched"] == 0 for o in run["correctness"]["outputs"]),
}
for name, ok in checks.items():
    print(f"  {'ok  ' if ok else 'FAIL'} {name}")
print(f"  placement: { {p: sum(ops.values()) for p, ops in (s['placement'] or {}).items()} }")
print(f"  profile providers: {[(p['provider'], p['nodes']) for p in run['profile']['providers']]}, "
      f"Memcpy nodes {run['profile']['memcpy_nodes']}")
if "compute-off-requested-provider" in active:
    print(f"  reported: {active['compute-off-requested-provider']['message']}")
sys.exit(0 if all(checks.values()) else 1)
EOF

step "harness overhead on the GPU (target <= 1.03; CUDA graph off so that both loops run the same kernels)"
sed -e 's/enable_cuda_graph: "1"/enable_cuda_graph: "0"/' -e 's/^name: .*/name: gpu-check-gpt-oss-cuda/' \
  "$OUT/gpt-oss-cuda-graph.yaml" > "$OUT/gpt-oss-cuda.yaml"
"$PYTHON" benchmarks/runner_overhead.py "$FIXTURES/genai-gpt_oss-fp16-cuda" --policy "$OUT/gpt-oss-cuda.yaml" \
  | tee "$OUT/runner_overhead.txt"

step "decode cost model on CUDA: estimate for this GPU (catalog figures) vs measured, dense expert loop vs fused MoE"
# Reports, never fails the check: the figures are what README's table records. A GPU missing from the device
# catalog makes the benchmark stop with the name nvidia-smi reported.
"$PYTHON" benchmarks/estimate_accuracy.py --provider cuda --rounds 3 --workdir "$OUT/estimate_accuracy" \
  | tee "$OUT/estimate_accuracy.txt" || printf 'gpu_check: estimate_accuracy did not complete (see above)\n'
"$PYTHON" -m ortgate run "$OUT/estimate_accuracy/fused" --policy "$OUT/estimate_accuracy/cuda.yaml" --timeout 300 \
  --write-calibration "$OUT/calibration.yaml" --exit-zero > "$OUT/calibration_run.txt" \
  && grep '^estimate' "$OUT/calibration_run.txt" && cat "$OUT/calibration.yaml" \
  || printf 'gpu_check: no calibration written (see %s)\n' "$OUT/calibration_run.txt"

step "runner tests with a GPU present (CPU-only expectations skip themselves)"
"$PYTHON" -m pytest -q -p no:cacheprovider tests/test_runner_inputs.py tests/test_runner_measure.py \
  tests/test_runner_session.py tests/test_runner_rules.py tests/test_runner_cli.py

step "done: reports in $OUT"
