"""Every MoE form the project recognises, seen again on every committed real export.

Each row is read from the graph's producer and model code (BUILD_INFO.json, the fixtures README), not from ortgate:
the MoE layers of the graph as (layer, expert form, routing form, k). A fixture or example folder added without a
row fails, and so does any graph whose MoE layers are no longer all found as they are.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from ortgate.graph import build_graph
from ortgate.graph.patterns.moe import ExpertForm, RoutingForm, moe_blocks, moe_misses
from tests.conftest import EXPORTED

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

FUSED = (ExpertForm.FUSED, RoutingForm.FUSED, 2)


def _layers(count: int, form: tuple, first: int = 0) -> list[tuple]:
    return [(layer, *form) for layer in range(first, first + count)]


# model file (relative to tests/fixtures/exported or examples) -> its MoE layers: (layer, expert form, routing form, k)
EXPECTED: dict[str, list[tuple]] = {
    # onnxruntime-genai builder: com.microsoft.MoE / QMoE in every MoE layer
    "genai-gpt_oss-fp16-cuda/model.onnx": _layers(2, FUSED),
    "genai-gpt_oss-fp32-cpu/model.onnx": _layers(2, FUSED),
    "genai-gpt_oss-int4-cuda/model.onnx": _layers(2, FUSED),
    "genai-lfm2_moe-fp32-cpu/model.onnx": _layers(2, FUSED, first=1),  # layer 0 is a dense MLP
    "genai-qwen3_5_moe-fp16-cuda/model.onnx": _layers(4, FUSED),
    "genai-qwen3_5_moe-fp32-cpu/model.onnx": _layers(4, FUSED),
    "genai-qwen3_5_moe-int4-cpu/model.onnx": _layers(4, FUSED),
    "genai-qwen3_5_moe-int4-cuda/model.onnx": _layers(4, FUSED),
    "genai0.13-qwen3-fp32-cpu/model.onnx": [],  # dense Qwen3
    # torch.onnx dynamo, the "dense" experts (every expert on every token)
    "dynamo-qwen3_moe/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-qwen3_moe/model.optimized.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-qwen3_moe/model.optimized-basic.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-qwen3_moe-ortfusions/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-minimax/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),  # post-norm residual
    "dynamo-minimax/model.optimized.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-mixtral/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-mixtral-static/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),  # [1, 7] input
    "dynamo-glm4_moe/model.onnx": _layers(1, (ExpertForm.DENSE, RoutingForm.SIGMOID_GROUP_TOPK, 2), first=1),
    "dynamo-glm4-interleaved/model.onnx": [],  # dense GLM-4
    "dynamo-glm4_moe-rotary16/model.onnx": _layers(1, (ExpertForm.DENSE, RoutingForm.SIGMOID_GROUP_TOPK, 2), first=1),
    "dynamo-jamba/model.onnx": _layers(1, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2), first=1),  # MoE every 2nd
    "dynamo-mamba/model.onnx": [],  # no MoE
    "dynamo-qwen3_next/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    # quantize_dynamic of dynamo-qwen3_moe: routers and every expert linear are MatMulInteger
    "quantdyn-qwen3_moe/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    # ORT's MatMulNBits quantizer in QDQ format on dynamo-qwen3_moe: INT4 DequantizeLinear weights on every MatMul;
    # the experts are Gemm there and stay float
    "qdq4-qwen3_moe/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    # the same tool on optimum-qwen3_moe-past: its experts' MatMuls read INT4 DequantizeLinear weights too
    "qdq4-optimum-qwen3_moe-past/model.onnx": _layers(2, (ExpertForm.GATHER, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-qwen2_moe/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-phimoe/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SPARSEMIXER, 2)),
    "dynamo-gpt_oss/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.TOPK_SOFTMAX, 2)),
    "dynamo-dbrx/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),  # ReduceL1 renormalised
    "dynamo-deepseek_v3/model.onnx": _layers(1, (ExpertForm.DENSE, RoutingForm.SIGMOID_GROUP_TOPK, 2), first=1),
    # JetMoE: TopK -> softmax over the k, tokens sorted by expert, one linear per expert slice; its mixture of attention
    # heads (routed q / o projections) is not an FFN MoE layer
    "dynamo-jetmoe/model.onnx": _layers(2, (ExpertForm.GATHER, RoutingForm.TOPK_SOFTMAX, 2)),
    # Cohere2-MoE: top-k over the logits, softmax over the k, a shared expert averaged in
    "dynamo-cohere2_moe/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.TOPK_SOFTMAX, 2)),
    # LongCat-Flash: a router over 4 routed + 2 zero-computation experts (softmax, correction bias for the choice)
    "dynamo-longcat_flash/model.onnx": _layers(1, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    # Llama-4 text: top-1 logit scattered into -inf, then sigmoid; the scores scale the experts' input (every
    # expert on every token, one batched MatMul over the [E, H, 2I] stack)
    "dynamo-llama4/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.TOPK_SIGMOID, 1)),
    # quantize_static QDQ of dynamo-mixtral: every router, expert and attention op reads DequantizeLinear outputs
    "quantqdq-mixtral/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    # ModelOpt 0.47 int8 of dynamo-mixtral: QDQ on the routers' and experts' Gemm inputs, float16 elsewhere
    "modelopt-int8-mixtral/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
    # transformers' batched_mm experts (GatherND / Gather of stacked weights + batched MatMul)
    "dynamo-olmoe/model.onnx": _layers(2, (ExpertForm.BATCHED, RoutingForm.SOFTMAX_TOPK, 2)),
    "dynamo-gpt_oss_batched/model.onnx": _layers(2, (ExpertForm.BATCHED, RoutingForm.TOPK_SOFTMAX, 2)),
    "olive-mixtral/model.onnx": _layers(2, (ExpertForm.BATCHED, RoutingForm.SOFTMAX_TOPK, 2)),
    # ORT's quantize_dynamic of dynamo-olmoe: routers are MatMulInteger -> Cast -> Mul(scale), experts stay batched
    "quantdyn-olmoe/model.onnx": _layers(2, (ExpertForm.BATCHED, RoutingForm.SOFTMAX_TOPK, 2)),
    # transformers' own exporter (OnnxExporter): ort_fusions="cuda" fuses batched_mm experts into com.microsoft.MoE
    # (fc1 gate and fc3 up apart, activation_type=silu); ort_fusions="cpu" keeps its translation of grouped_mm
    # (tokens sorted by expert: TopK, CumSum offsets, Range; per expert a Gather of its rows and two MatMuls)
    "tfexp-qwen3_moe-cuda/model.onnx": _layers(2, FUSED),
    "tfexp-qwen3_moe-cpu/model.onnx": _layers(2, (ExpertForm.GATHER, RoutingForm.SOFTMAX_TOPK, 2)),
    # optimum's legacy TorchScript export: transformers' eager loop, tokens dispatched per expert
    "optimum-qwen3_moe-past/model.onnx": _layers(2, (ExpertForm.GATHER, RoutingForm.SOFTMAX_TOPK, 2)),
    "optimum-llama-past/model.onnx": [],
    "optimum-llama-past-o2/model.onnx": [],
    "transformers-qwen3-past/model.onnx": [],  # transformers' OnnxExporter of a dense Qwen3
    # examples/
    "qwen3-moe-tiny-fused/model.onnx": _layers(2, FUSED),
    "qwen3-moe-tiny-fused-cpu/model.onnx": _layers(2, FUSED),
    "qwen3-moe-tiny-unfused/model.onnx": _layers(2, (ExpertForm.DENSE, RoutingForm.SOFTMAX_TOPK, 2)),
}


def _committed() -> dict[str, Path]:
    found = {str(p.relative_to(EXPORTED)): p for p in EXPORTED.glob("*/*.onnx")}
    found.update({str(p.relative_to(EXAMPLES)): p for p in EXAMPLES.glob("*/*.onnx")})
    return found


def test_every_committed_export_has_a_row():
    assert sorted(_committed()) == sorted(EXPECTED)


# Known misses, each a real export whose MoE layers are not all found yet: strict, so a fix shows up as a failure
# until the mark goes.
NOT_YET_SEEN = {
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=NOT_YET_SEEN[n]))
                                  if n in NOT_YET_SEEN else n for n in sorted(EXPECTED)])
def test_moe_layers_of_every_committed_export(name):
    path = _committed()[name]
    graph = build_graph(onnx.load(str(path), load_external_data=False), str(path))
    got = [(b.layer, b.expert_form, b.routing_form, b.k) for b in moe_blocks(graph)]
    assert got == EXPECTED[name]


# Routers of something else than an FFN MoE layer, said as misses (never counted): JetMoE's mixture of attention
# heads in each layer (TopK over a router's logits picking routed q / o projections).
OTHER_ROUTERS = {"dynamo-jetmoe/model.onnx": 2}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_moe_layer_is_read_or_explained(name):
    """A layer not read yet (NOT_YET_SEEN) is still accounted for: a miss naming its router and why, so that no
    count is asserted from it; a graph whose layers are all read has no miss."""
    path = _committed()[name]
    graph = build_graph(onnx.load(str(path), load_external_data=False), str(path))
    blocks, misses = moe_blocks(graph), moe_misses(graph)
    other = OTHER_ROUTERS.get(name, 0)
    assert len(blocks) + len(misses) == len(EXPECTED[name]) + other
    if name not in NOT_YET_SEEN:
        assert len(misses) == other, [m.describe() for m in misses]
    assert all(m.reason and m.node is not None for m in misses)
