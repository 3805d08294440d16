"""The graph rules on real exporters' output (tests/fixtures/exported/, see its README.md).

- onnxruntime-genai's builder writes the fused graphs ORT wants: no graph rule may report anything on them, with or
  without a policy that matches the model (config rules such as cuda-graph-disabled may, and are not run here).
- torch.onnx's dynamo export of Qwen3-MoE computes everything with standard ops: every layer's MoE, attention,
  RMSNorm and rotary must be reported with its layer, in the export and in ORT's optimized dump of it (which has
  no node metadata, so its layers come from the graph's structure).
"""

from __future__ import annotations

import pytest

from tests.conftest import EXPORTED
from tests.helpers import lint_findings

GRAPH_RULES = [
    "moe-not-fused", "gqa-not-fused", "fusedmatmul-missing", "rmsnorm-not-fused", "skip-rmsnorm-not-fused",
    "rotary-not-fused", "qkv-not-packed", "gate-up-not-merged", "swiglu-not-fused", "moe-routing-mismatch",
    "gqa-config-mismatch", "norm-epsilon-default",
]
GENAI = sorted(p.name for p in EXPORTED.glob("genai-*") if p.is_dir())

QWEN35_MODEL = """\
model:
  family: qwen3_5_moe
  layers: 4
  attention_layers: 1
  moe_layers: 4
  experts: 4
  top_k: 2
  num_heads: 4
  kv_num_heads: 2
  head_size: 16
  hidden_size: 64
  norm_topk_prob: true
  activation: swiglu
  rms_norm_eps: 1.0e-6
"""
GPT_OSS_MODEL = """\
model:
  family: gpt_oss
  layers: 2
  attention_layers: 2
  moe_layers: 2
  experts: 4
  top_k: 2
  num_heads: 4
  kv_num_heads: 2
  head_size: 16
  hidden_size: 64
  norm_topk_prob: true
  activation: swiglu
  rms_norm_eps: 1.0e-5
"""
LFM2_MOE_MODEL = """\
model:
  family: lfm2_moe
  layers: 3
  attention_layers: 1
  moe_layers: 2
  experts: 4
  top_k: 2
  num_heads: 4
  kv_num_heads: 2
  head_size: 16
  hidden_size: 64
  norm_topk_prob: true
  activation: swiglu
  rms_norm_eps: 1.0e-5
"""


def matching_policy(fixture: str) -> str:
    model = QWEN35_MODEL if "qwen3_5" in fixture else LFM2_MOE_MODEL if "lfm2" in fixture else GPT_OSS_MODEL
    provider = "CUDAExecutionProvider" if fixture.endswith("cuda") else "CPUExecutionProvider"
    return (f"name: {fixture}\n{model}session:\n  graph_optimization_level: ORT_ENABLE_ALL\n"
            f"execution_provider:\n  name: {provider}\n")


def test_every_builder_fixture_is_here():
    assert len(GENAI) == 8


@pytest.mark.parametrize("fixture", GENAI)
def test_builder_graphs_have_no_graph_findings(fixture, write_policy):
    folder = EXPORTED / fixture
    assert lint_findings(folder, select=GRAPH_RULES) == []
    assert lint_findings(folder, write_policy(matching_policy(fixture)), select=GRAPH_RULES) == []


def _layers(findings, rule):
    return sorted((f.layer for f in findings if f.rule == rule), key=lambda layer: (layer is None, layer or 0))


@pytest.mark.parametrize("dump", [None, "model.optimized.onnx"])
def test_dynamo_export_reports_every_layer(dump):
    folder = EXPORTED / "dynamo-qwen3_moe"
    found = lint_findings(folder / "model.onnx", optimized=folder / dump if dump else None, select=GRAPH_RULES)
    assert _layers(found, "moe-not-fused") == [0, 1]
    # 4 experts x (merged gate_up Gemm on Gather(W, e) + down Gemm)
    assert {dict(f.properties)["expert_projections"] for f in found if f.rule == "moe-not-fused"} == {8}
    assert _layers(found, "gqa-not-fused") == [0, 1]
    assert _layers(found, "rmsnorm-not-fused") == [0, 1, None]  # None: the final norm
    assert _layers(found, "rotary-not-fused") == [0, 1]
    assert _layers(found, "qkv-not-packed") == [0, 1]
    assert _layers(found, "skip-rmsnorm-not-fused") == [0, 1, None]


def test_onnxscript_fusions_fix_norms_but_leave_moe_rotary_and_projections():
    found = lint_findings(EXPORTED / "dynamo-qwen3_moe-ortfusions" / "model.onnx", select=GRAPH_RULES)
    rules = {f.rule for f in found}
    assert {"moe-not-fused", "rotary-not-fused", "qkv-not-packed"} <= rules
    assert not rules & {"rmsnorm-not-fused", "skip-rmsnorm-not-fused", "norm-epsilon-default"}
    assert _layers(found, "rotary-not-fused") == [0, 1]


@pytest.mark.parametrize("fixture", ["genai-qwen3_5_moe-fp32-cpu", "genai-qwen3_5_moe-int4-cpu", "genai-gpt_oss-fp32-cpu"])
def test_builder_graphs_optimized_by_ort_have_no_graph_findings(fixture, tmp_path):
    """ORT's own ORT_ENABLE_ALL dump of a builder graph (CPU) adds nothing to report either."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    options.log_severity_level = 3
    ort.InferenceSession(str(EXPORTED / fixture / "model.onnx"), options, providers=["CPUExecutionProvider"])
    assert lint_findings(EXPORTED / fixture, optimized=options.optimized_model_filepath, select=GRAPH_RULES) == []


def test_lfm2_moe_routing_selected_in_the_graph_feeds_the_fused_moe():
    """The builder selects LFM2-MoE's experts in the graph (sigmoid + expert bias, TopK, masked scores) and feeds
    com.microsoft.MoE: each MoE layer is one fused block, the dense first layer none, and nothing is unfused."""
    import onnx

    from ortgate.graph import build_graph
    from ortgate.graph.patterns.moe import moe_blocks

    path = EXPORTED / "genai-lfm2_moe-fp32-cpu" / "model.onnx"
    graph = build_graph(onnx.load(str(path), load_external_data=False), str(path))
    blocks = moe_blocks(graph)
    assert [(b.layer, b.fused is not None, b.experts, b.k) for b in blocks] == [(1, True, 4, 2), (2, True, 4, 2)]
    assert sum(1 for n in graph.nodes if n.op_type == "TopK") == 2  # the routing ops the builder left in the graph
