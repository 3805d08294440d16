"""The decode estimate beside published batch-1 measurements: every one in the shared reference that a generated
skeleton (tests/models/qwen_moe.py, weights as external-data stubs: no byte exists) and a catalog device can
reproduce. Prints the table as Markdown; `--write` replaces the table in docs/cost-model.md between its markers.

Each row: the model's shape, dtype and quantization as the generator can write them, the device of the catalog
closest to the published hardware, the engine's figure and the estimate with CUDA graph off and on (the engines
measured use graph capture: vLLM and gpt-fast (torch.compile "reduce-overhead") by default; onnxruntime-genai's
report does not say), with the ratio estimate / measured for the configuration the engine ran. Context 2048
positions, batch 1, the CUDA provider.

    python benchmarks/published_figures.py [--write] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.models.qwen_moe import ModelSpec, build_model, save_model  # noqa: E402

CONTEXT = 2048
DOC = REPO / "docs" / "cost-model.md"
BEGIN = "<!-- published-figures: begin (python benchmarks/published_figures.py --write) -->"
END = "<!-- published-figures: end -->"
_FUSED = dict(attention="gqa", rotary="fused", norm="fused", naming="genai", weights="external_stub")


@dataclass(frozen=True)
class Published:
    name: str  # the model as published
    spec: ModelSpec
    shape: str  # what the skeleton is, in words (and where it differs from the measured model)
    device: str  # catalog device
    hardware: str  # as published
    engine: str
    tokens_per_s: float
    graph: bool | None  # whether the engine ran with graph capture (None: not stated)


def _gpt_oss(layers: int, experts: int, top_k: int) -> ModelSpec:
    return ModelSpec(layers=layers, experts=experts, top_k=top_k, hidden=2880, moe_intermediate=2880, num_heads=64,
                     kv_num_heads=8, head_dim=64, vocab=201088, dtype="float16", moe="qmoe", qmoe_bits=4,
                     qmoe_block_size=32, matmul_nbits=True, sliding_window=128, max_position=4096,
                     layer_types=tuple("sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)),
                     **_FUSED)


ROWS = (
    Published("GPT-OSS-20B int4 QMoE", _gpt_oss(24, 32, 4),
              "24 layers, 32 experts top-4, hidden 2880, int4 QMoE block 32 and int4 MatMulNBits projections, "
              "alternate layers sliding (128)", "h200", "H200", "onnxruntime-genai (microsoft/onnxruntime#29160)",
              382.0, None),
    Published("GPT-OSS-120B", _gpt_oss(36, 128, 4),
              "36 layers, 128 experts top-4, as above (int4 block 32 for the published MXFP4)", "a100-80gb",
              "A100-80GB", "vLLM (user reports, #22331)", 89.0, True),
    Published("Qwen3-30B-A3B", ModelSpec(layers=48, experts=128, top_k=8, hidden=2048, num_heads=32, kv_num_heads=4,
                                         head_dim=128, moe_intermediate=768, vocab=151936, qk_norm=True,
                                         dtype="float16", max_position=4096, moe="fused", **_FUSED),
              "48 layers, 128 experts top-8, hidden 2048, float16, fused MoE and GroupQueryAttention", "a100-80gb",
              "A100", "vLLM (tenstorrent/tt-inference-server#340)", 103.9, True),
    Published("Mixtral-8x7B int8", ModelSpec(layers=32, experts=8, top_k=2, hidden=4096, num_heads=32, kv_num_heads=8,
                                             head_dim=128, moe_intermediate=14336, vocab=32000, dtype="float16",
                                             max_position=4096, moe="qmoe", qmoe_bits=8, **_FUSED),
              "32 layers, 8 experts top-2, int8 QMoE; attention and lm_head float16 (gpt-fast quantizes them to int8 "
              "too: the skeleton reads about 1.4 GB more a step)", "a100-80gb", "A100-80GB", "gpt-fast README", 97.9,
              True),
    Published("Llama-2-7B bf16", ModelSpec(layers=32, hidden=4096, num_heads=32, kv_num_heads=32, head_dim=128,
                                           dense_intermediate=11008, vocab=32000, dtype="bfloat16", max_position=4096,
                                           moe="dense", **_FUSED),
              "32 dense layers, hidden 4096, MLP 11008, bfloat16", "a100-80gb", "A100-80GB", "gpt-fast README", 104.9,
              True),
)
NOT_REPRODUCED = (
    ("GPT-OSS-20B MXFP4, RTX PRO 6000 Blackwell, llama.cpp 391 tok/s", "the device is not in the catalog"),
    ("Qwen3-30B-A3B bf16, H20, SGLang 137 tok/s", "the device is not in the catalog"),
    ("Qwen3.6-35B-A3B int4 with CUDA graph, onnxruntime-genai 61 tok/s", "the hardware is not stated"),
    ("Qwen3.5-35B-A3B FP8, 1x H100, Luminal 172.5 tok/s", "the generator writes no FP8 weights"),
)


def estimate_row(row: Published, workdir: Path) -> dict:
    from ortgate.cost import CostSetup, StepShape, estimate
    from ortgate.graph import build_graph
    from ortgate.graph.load import load_model
    from ortgate.knowledge.devices import find_device

    path = workdir / f"{row.name.replace(' ', '_')}.onnx"
    spec = dataclasses.replace(row.spec, stub_location=f"{path.name}.data")
    save_model(build_model(spec), path)
    graph = build_graph(load_model(path), str(path))
    device = find_device(row.device)
    assert device is not None
    out = {}
    for graph_on in (False, True):
        setup = CostSetup(device, StepShape(1, 1, CONTEXT), "CUDAExecutionProvider", cuda_graph=graph_on)
        step = estimate(graph, setup).as_exported
        out[graph_on] = step
    return out


def table(workdir: Path) -> str:
    header = ("| model (skeleton) | device | engine (graph capture) | measured tok/s | estimate, no CUDA graph | "
              "estimate, CUDA graph | estimate / measured, off / on |")
    lines = [header, "|---|---|---|---:|---:|---:|---|"]
    for row in ROWS:
        steps = estimate_row(row, workdir)
        off, on = (steps[g].tokens_per_s_expected or 0.0 for g in (False, True))
        ratio = f"{off / row.tokens_per_s:.2f} / {on / row.tokens_per_s:.2f}"
        capture = {None: "not stated", True: "on", False: "off"}[row.graph]
        lines.append(f"| {row.name}: {row.shape} | {row.device} ({row.hardware}) | {row.engine} ({capture}) | "
                     f"{row.tokens_per_s:g} | {off:,.0f} | {on:,.0f} | {ratio} |")
    lines.append("")
    lines.append("Not reproduced: " + "; ".join(f"{what} ({why})" for what, why in NOT_REPRODUCED) + ".")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC.relative_to(REPO)}")
    parser.add_argument("--workdir", type=Path, help="where the skeletons are written (default: a temporary folder)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        text = table(workdir)
    print(text)
    if args.write:
        doc = DOC.read_text(encoding="utf-8")
        if BEGIN not in doc or END not in doc:
            print(f"{DOC}: no {BEGIN!r} ... {END!r} markers", file=sys.stderr)
            return 2
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
