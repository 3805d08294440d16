"""Full-size skeleton graphs of 30-35B-class MoE LLMs for ortgate's scale benchmark.

Built with the test-model generator (tests/models/qwen_moe.py) at the real models' sizes, with
``weights="external_stub"``: every weight is declared as external data (location, offset, length) and no
byte of it exists. The declared weights add up to tens of GB; the .onnx file itself holds only the graph.

- Qwen3-30B-A3B unfused: what a torch.onnx export of the transformers model looks like: 48 layers, each
  running all 128 experts as separate gate/up/down MatMuls (a dense expert loop, ~59k nodes), decomposed
  attention, rotary and RMSNorm.
- Qwen3-30B-A3B fused: the same model as onnxruntime-genai's builder writes it (com.microsoft MoE and
  GroupQueryAttention, fused norms): ~550 nodes.
- Qwen3.6-35B-A3B fused: 40 hybrid layers (3 linear-attention : 1 full-attention), 256 experts with a shared
  expert.
- ``scaled_unfused(nodes)``: the Qwen3-30B-A3B unfused layer repeated until the graph has about that many
  nodes, for the per-node cost series.

``python benchmarks/scale_models.py OUT_DIR`` writes them all (they are large: keep them out of git).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.models.qwen_moe import ModelSpec, build_model, save_model

_QWEN3_30B_A3B = dict(
    layers=48, experts=128, top_k=8, hidden=2048, num_heads=32, kv_num_heads=4, head_dim=128,
    moe_intermediate=768, vocab=151936, qk_norm=True, dtype="float16", weights="external_stub",
    max_position=4096,
)
_UNFUSED = dict(
    moe="dense_loop", gate_up="separate", attention="decomposed", rotary="decomposed", norm="decomposed",
    naming="hf",
)
_FUSED = dict(moe="fused", attention="gqa", rotary="fused", norm="fused", naming="genai")


def qwen3_30b_a3b_unfused(layers: int = 48) -> ModelSpec:
    return ModelSpec(**{**_QWEN3_30B_A3B, **_UNFUSED, "layers": layers})


def qwen3_30b_a3b_fused() -> ModelSpec:
    return ModelSpec(**{**_QWEN3_30B_A3B, **_FUSED})


def qwen36_35b_a3b_fused() -> ModelSpec:
    layers = 40
    return ModelSpec(
        layers=layers,
        layer_types=tuple("full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)),
        experts=256, top_k=8, shared_expert=True, hidden=2048, num_heads=16, kv_num_heads=2, head_dim=256,
        moe_intermediate=512, vocab=248320, qk_norm=True, dtype="float16", weights="external_stub",
        linear_key_heads=16, linear_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        linear_conv_kernel=4, max_position=4096, **_FUSED,
    )


@functools.cache
def _unfused_layer_nodes() -> tuple[int, int]:
    """(nodes outside the layers, nodes per layer) of the unfused Qwen3-30B-A3B graph."""
    one, two = (len(build_model(qwen3_30b_a3b_unfused(layers=n)).graph.node) for n in (1, 2))
    return one - (two - one), two - one


def scaled_unfused(nodes: int) -> ModelSpec:
    """Qwen3-30B-A3B unfused, with as many layers as it takes to reach about `nodes` nodes."""
    fixed, per_layer = _unfused_layer_nodes()
    return qwen3_30b_a3b_unfused(layers=max(1, round((nodes - fixed) / per_layer)))


@dataclass(frozen=True)
class ScaleModel:
    """A benchmark model on disk."""

    name: str
    path: Path
    nodes: int
    file_bytes: int
    declared_weight_bytes: int  # what the external-data entries add up to
    data_file: str  # "absent" | "sparse"


def declared_external_bytes(model: onnx.ModelProto) -> int:
    """End of the last external-data range the initializers declare (their bytes are never read)."""
    end = 0
    for t in model.graph.initializer:
        if t.data_location != onnx.TensorProto.EXTERNAL:
            continue
        entries = {e.key: e.value for e in t.external_data}
        end = max(end, int(entries.get("offset", 0)) + int(entries.get("length", 0)))
    return end


def write_model(name: str, spec: ModelSpec, out_dir: Path, *, data_file: str = "absent") -> ScaleModel:
    """Build `spec`, write OUT_DIR/NAME.onnx; its external data file is left absent, or created sparse
    (its declared size, no blocks on disk) with data_file="sparse"."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.onnx"
    spec = dataclasses.replace(spec, stub_location=f"{name}.onnx.data")
    model = build_model(spec)
    save_model(model, path)
    declared = declared_external_bytes(model)
    data_path = out_dir / spec.stub_location
    if data_path.exists():
        data_path.unlink()
    if data_file == "sparse":
        with open(data_path, "wb") as f:
            f.truncate(declared)
    elif data_file != "absent":
        raise ValueError(f"data_file={data_file!r}: expected 'absent' or 'sparse'")
    return ScaleModel(name, path, len(model.graph.node), path.stat().st_size, declared, data_file)


def headline_specs() -> dict[str, tuple[ModelSpec, str]]:
    """The three full-size models: name -> (spec, what happens to its .data file)."""
    return {
        "qwen3-30b-a3b-unfused": (qwen3_30b_a3b_unfused(), "absent"),
        "qwen3-30b-a3b-fused": (qwen3_30b_a3b_fused(), "absent"),
        "qwen3.6-35b-a3b-fused": (qwen36_35b_a3b_fused(), "sparse"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--series", default="1000,10000,50000,200000",
                        help="node counts of the scaled unfused models (comma-separated; empty for none)")
    args = parser.parse_args(argv)
    models = [write_model(name, spec, args.out_dir, data_file=data) for name, (spec, data) in headline_specs().items()]
    for n in filter(None, args.series.split(",")):
        models.append(write_model(f"unfused-{int(n) // 1000}k", scaled_unfused(int(n)), args.out_dir))
    for m in models:
        print(f"{m.path}: {m.nodes} nodes, {m.file_bytes / 2**20:.1f} MiB file, "
              f"{m.declared_weight_bytes / 2**30:.1f} GiB declared external data ({m.data_file})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
