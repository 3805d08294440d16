"""Write the example models shipped in examples/ (weights inline, well under 1 MB each).

    python -m tests.models.make_examples [--out examples]

- examples/qwen3-moe-tiny-unfused/model.onnx: what a torch.onnx export of a transformers Qwen3-MoE
  looks like: dense-loop MoE (every expert's gate/up/down MatMuls on every token, Softmax -> TopK ->
  ScatterElements routing), decomposed attention with repeat_kv, decomposed RMSNorm and rotary,
  separate q/k/v projections, transformers-style names (model.layers.{i}.self_attn...), float32.
- examples/qwen3-moe-tiny-fused/model.onnx (+ genai_config.json): what onnxruntime-genai's builder
  writes for CUDA: com.microsoft MoE (SwiGLU, interleaved), GroupQueryAttention with packed QKV,
  RotaryEmbedding fed by a position_ids input, SkipSimplifiedLayerNormalization, genai names
  (/model/layers.{i}/attn/...), float16, and a genai_config.json that turns on CUDA graphs.
- examples/qwen3-moe-tiny-fused-cpu/model.onnx (+ genai_config.json): the same fused graph in float32 with a
  genai_config.json for the CPU provider: what the builder writes with -p fp32 -e cpu.

Both are 2-layer, 4-expert models with the same logical weights: the fused model computes the same
logits as the unfused one (up to float16 rounding).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from tests.models.qwen_moe import ModelSpec, build_model, save_model

UNFUSED = ModelSpec(
    layers=2,
    moe="dense_loop",
    gate_up="separate",
    attention="decomposed",
    rotary="decomposed",
    norm="decomposed",
    qkv="separate",
    qk_norm=True,
    naming="hf",
)

FUSED = ModelSpec(
    layers=2,
    moe="fused",
    swiglu_fusion=1,
    moe_activation="swiglu",
    attention="gqa",
    rotary="fused",
    norm="fused",
    qkv="packed",
    qk_norm=True,
    naming="genai",
    dtype="float16",
    position_ids="input",
)

# The fused model as the builder writes it for CPU: float32 (GroupQueryAttention's CUDA kernels are fp16/bf16
# only, its CPU kernel takes float32) and no provider options, so genai runs it on the CPU provider.
FUSED_CPU = replace(FUSED, dtype="float32")

EXAMPLES = {
    "qwen3-moe-tiny-unfused": UNFUSED,
    "qwen3-moe-tiny-fused": FUSED,
    "qwen3-moe-tiny-fused-cpu": FUSED_CPU,
}
PROVIDER_OPTIONS = {
    "qwen3-moe-tiny-fused": [{"cuda": {"enable_cuda_graph": "1"}}],
    "qwen3-moe-tiny-fused-cpu": [],
}


def genai_config(spec: ModelSpec, *, filename: str = "model.onnx",
                 provider_options: list | None = None) -> dict:
    """genai_config.json in the layout onnxruntime-genai's builder writes (Model.make_genai_config)."""
    return {
        "model": {
            "bos_token_id": 1,
            "context_length": spec.max_position,
            "decoder": {
                "session_options": {
                    "log_id": "onnxruntime-genai",
                    "provider_options": [{"cuda": {"enable_cuda_graph": "1"}}] if provider_options is None
                    else provider_options,
                },
                "filename": filename,
                "head_size": spec.head_dim,
                "hidden_size": spec.hidden,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    **({"position_ids": "position_ids"} if spec.position_ids == "input" else {}),
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": spec.num_heads,
                "num_hidden_layers": spec.layers,
                "num_key_value_heads": spec.kv_num_heads,
            },
            "eos_token_id": 2,
            "pad_token_id": 0,
            "type": "qwen3moe",
            "vocab_size": spec.vocab,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": False,
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": spec.max_position,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": 1.0,
            "temperature": 1.0,
            "top_k": 50,
            "top_p": 1.0,
        },
    }


def write_examples(out_dir: Path) -> list[Path]:
    """Write every example model (and the fused one's genai_config.json); return the written paths."""
    written = []
    for name, spec in EXAMPLES.items():
        model_path = save_model(build_model(spec), out_dir / name / "model.onnx")
        written.append(model_path)
        if name in PROVIDER_OPTIONS:
            config_path = model_path.with_name("genai_config.json")
            config = genai_config(spec, provider_options=PROVIDER_OPTIONS[name])
            config_path.write_text(json.dumps(config, indent=4) + "\n")
            written.append(config_path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "examples")
    for path in write_examples(parser.parse_args().out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
