"""The one MoE reading: every router-like structure (a TopK / ArgMax over a projection's logits) is read as a block
or explained by a miss with its node and reason, and no count is asserted from a miss.

The real exports are tests/fixtures/exported/dynamo-jetmoe (JetMoE: its MoE MLP read, its mixture of attention
heads, a router over routed q / o projections, not read), tfexp-qwen3_moe-cpu (transformers' own exporter: tokens
sorted by expert, per expert a Gather of its rows and two MatMuls), dynamo-llama4 (input-side weighting: the routing scales the experts' input, all
experts one batched MatMul) and dynamo-longcat_flash (4 routed experts and 2 zero-computation experts, a router over
6 columns).
"""

from __future__ import annotations

import onnx
import pytest
from onnx import helper, parser

from ortgate.findings import Kind, Severity
from ortgate.graph import build_graph
from ortgate.graph.patterns.moe import MoeBlock, MoeMiss, moe_blocks, moe_misses, read_moe
from tests.conftest import EXPORTED
from tests.helpers import lint_findings, rule_findings

LLAMA4 = EXPORTED / "dynamo-llama4" / "model.onnx"
GROUPED = EXPORTED / "tfexp-qwen3_moe-cpu" / "model.onnx"
JETMOE = EXPORTED / "dynamo-jetmoe" / "model.onnx"
LONGCAT = EXPORTED / "dynamo-longcat_flash" / "model.onnx"


def _graph(path):
    return build_graph(onnx.load(str(path), load_external_data=False), str(path))


def _policy(tmp_path, moe_layers: int):
    path = tmp_path / "policy.yaml"
    path.write_text(f"name: p\nmodel: {{moe_layers: {moe_layers}}}\n")
    return path


def test_unread_routers_are_misses_with_their_node_and_reason():
    """JetMoE's mixture of attention heads routes q / o projections, not an FFN: a miss in each layer, anchored on its
    router, beside the MoE MLP that is read."""
    graph = _graph(JETMOE)
    read = read_moe(graph)
    assert [(type(r).__name__, r.layer) for r in read] == [("MoeMiss", 0), ("MoeBlock", 0), ("MoeMiss", 1),
                                                           ("MoeBlock", 1)]
    for miss in moe_misses(graph):
        assert miss.node.op_type in ("MatMul", "Gemm") and miss.selection is not None
        assert miss.selection.op_type == "TopK"
        assert "reach the attention scores" in miss.reason and "mixture of attention heads" in miss.reason


def test_count_is_undecided_when_routers_were_not_read(tmp_path):
    found = rule_findings(JETMOE, "moe-layer-count-mismatch", policy=_policy(tmp_path, 4))
    assert len(found) == 1
    f = found[0]
    assert f.kind == Kind.UNDECIDED and f.severity == Severity.INFO
    assert f.message.startswith("could not decide:")
    assert "has 2" not in f.message and "2 read" in f.message
    for miss in moe_misses(_graph(JETMOE)):
        assert miss.node.display_name in f.message


def test_moe_not_fused_says_what_it_could_not_read():
    found = rule_findings(JETMOE, "moe-not-fused")
    assert sorted((f.layer, f.kind.value) for f in found) == [(0, "undecided"), (0, "violation"), (1, "undecided"),
                                                             (1, "violation")]
    assert all("mixture of attention heads" in f.message for f in found if f.kind is Kind.UNDECIDED)


def test_tokens_sorted_by_expert_are_read():
    """transformers' exporter's grouped_mm: TopK, a sort of the picked expert ids (a TopK too, not a selection),
    per expert a Gather of its rows and a MatMul by its slice of the stack, the outputs joined by Concat, weighted,
    put back in token order (GatherND) and summed over k."""
    from ortgate.graph.patterns.moe import ExpertForm, RoutingForm

    blocks = moe_blocks(_graph(GROUPED))
    assert [(b.layer, b.expert_form, b.routing_form, b.k, b.routed_experts_found, len(b.routed_linears))
            for b in blocks] == [(layer, ExpertForm.GATHER, RoutingForm.SOFTMAX_TOPK, 2, 4, 8) for layer in (0, 1)]
    assert all(b.combine is not None and len(b.selection) == 1 for b in blocks)


def test_llama4_input_side_weighting_is_read_and_refused_for_the_rewrite():
    """Llama-4: TopK k=1 over the logits, scattered into -inf, Sigmoid; the scores scale the tokens each expert reads
    (x repeated per expert), all experts one batched MatMul over [E, H, 2I], a shared expert added. Read as a block;
    com.microsoft.MoE weights outputs, so the rewrite refuses it as inexpressible."""
    from ortgate.graph.patterns.moe import ExpertForm, RoutingForm
    from ortgate.graph.patterns.moe_anatomy import block_verdict

    graph = _graph(LLAMA4)
    assert not moe_misses(graph)
    blocks = moe_blocks(graph)
    assert [(b.layer, b.expert_form, b.routing_form, b.k, b.weighting, b.routed_experts_found, len(b.shared))
            for b in blocks] == [(layer, ExpertForm.DENSE, RoutingForm.TOPK_SIGMOID, 1, "input", 4, 1) for layer in (0, 1)]
    for block in blocks:
        verdict = block_verdict(graph, block)
        assert verdict is not None and not verdict.rewritable and not verdict.expressible
        assert "input" in verdict.reason
    found = rule_findings(LLAMA4, "moe-not-fused")
    assert [(f.kind, f.layer) for f in found] == [(Kind.VIOLATION, 0), (Kind.VIOLATION, 1)]
    assert all("scaling each expert's input" in f.message for f in found)


def test_longcat_zero_computation_experts_are_counted():
    blocks = moe_blocks(_graph(LONGCAT))
    assert len(blocks) == 1
    block = blocks[0]
    assert (block.experts, block.routed_experts_found, block.zero, block.k) == (6, 4, [4, 5], 2)
    assert block.experts_found == 6
    assert not rule_findings(LONGCAT, "moe-expert-count-mismatch")
    found = rule_findings(LONGCAT, "moe-not-fused")
    assert [f.layer for f in found] == [0]
    assert "2 zero-computation experts" in found[0].message


def test_zero_computation_experts_are_never_rewritten_into_moe():
    """com.microsoft.MoE routes every column to an FFN: a block with identity experts is refused for them, whatever
    its routing."""
    from ortgate.graph.patterns.moe_anatomy import block_verdict

    graph = _graph(LONGCAT)
    verdict = block_verdict(graph, moe_blocks(graph)[0])
    assert verdict is not None and not verdict.rewritable and not verdict.expressible
    assert "zero-computation experts" in verdict.reason


def _router_without_experts() -> onnx.ModelProto:
    """A router whose top-k weights become a graph output: ranked, but weighting no expert."""
    model = parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 21]>
    g (float[T, 8] x) => (float[T, 2] w, int64[T, 2] i, float[T, 8] y)
    <int64[1] k = {2}>
    {
      logits = MatMul(x, router_w)
      probs = Softmax<axis = -1>(logits)
      w, i = TopK(probs, k)
      y = MatMul(x, proj)
    }
    """)
    model.graph.initializer.extend([helper.make_tensor("router_w", onnx.TensorProto.FLOAT, [8, 4], [0.1] * 32),
                                    helper.make_tensor("proj", onnx.TensorProto.FLOAT, [8, 8], [0.1] * 64)])
    return model


def test_a_router_no_form_explains_is_a_miss_never_zero_layers(tmp_path):
    path = tmp_path / "model.onnx"
    onnx.save(_router_without_experts(), str(path))
    read = read_moe(_graph(path))
    assert len(read) == 1 and isinstance(read[0], MoeMiss) and not isinstance(read[0], MoeBlock)
    assert read[0].node.op_type == "MatMul" and "weights no expert output" in read[0].reason
    found = [f for f in lint_findings(path, _policy(tmp_path, 1)) if f.rule == "moe-layer-count-mismatch"]
    assert [f.kind for f in found] == [Kind.UNDECIDED]
    assert all(f.severity != Severity.ERROR for f in found if f.rule.startswith("moe"))


@pytest.mark.parametrize("name", ["dynamo-mixtral", "dynamo-olmoe", "genai-lfm2_moe-fp32-cpu", "optimum-llama-past"])
def test_read_forms_have_no_miss(name):
    assert not moe_misses(_graph(EXPORTED / name / "model.onnx"))


def test_the_cost_model_says_which_moe_layers_it_did_not_price_as_moe():
    from ortgate.cost import StepShape, step_model

    model = step_model(_graph(JETMOE), StepShape(1, 1, 16), gpu=True)
    assert len(model.moe_forms) == 2
    unread = [u.what for u in model.uncounted if u.component == "moe"]
    assert len(unread) == 2 and all("MoE layer not read" in w and "mixture of attention heads" in w for w in unread)


def _with_a_bare_router(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` plus a router over its first graph input's hidden states whose top-k weighs nothing."""
    hidden = next(n.output[0] for n in model.graph.node if n.op_type == "Gather")  # the embedding row
    width = 64
    model.graph.initializer.append(helper.make_tensor("bare_router_w", onnx.TensorProto.FLOAT, [width, 4],
                                                      [0.1] * width * 4))
    model.graph.initializer.append(helper.make_tensor("bare_k", onnx.TensorProto.INT64, [1], [2]))
    model.graph.node.extend([
        helper.make_node("MatMul", [hidden, "bare_router_w"], ["bare_logits"], name="bare_router"),
        helper.make_node("Softmax", ["bare_logits"], ["bare_probs"], axis=-1),
        helper.make_node("TopK", ["bare_probs", "bare_k"], ["bare_w", "bare_i"], name="bare_topk"),
    ])
    model.graph.output.extend([helper.make_tensor_value_info("bare_w", onnx.TensorProto.FLOAT, None)])
    return model


def test_no_moe_count_is_inferred_from_a_graph_with_unread_routers(tmp_path):
    from ortgate.config.expectations import resolve_expectations
    from tests.models.qwen_moe import ModelSpec, build_model

    model = _with_a_bare_router(build_model(ModelSpec(moe="dense_loop")))
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    graph = _graph(path)
    assert len(moe_blocks(graph)) == 2 and [m.node.name for m in moe_misses(graph)] == ["bare_router"]
    assert resolve_expectations(None, None, graph).moe_layers is None
    assert resolve_expectations(None, None, _graph(LONGCAT)).moe_layers.value == 1
    found = rule_findings(path, "moe-layer-count-mismatch", policy=_policy(tmp_path, 3))
    assert [f.kind for f in found] == [Kind.UNDECIDED] and "2 read" in found[0].message
    assert "bare_router" in found[0].message


def test_zero_computation_experts_read_no_weights_in_the_estimate():
    from ortgate.cost import StepShape, step_model

    forms = step_model(_graph(LONGCAT), StepShape(1, 1, 16), gpu=True).moe_forms
    assert [(f.experts, f.experts_read) for f in forms] == [(4, 4.0)]  # 4 FFN experts of the router's 6 columns


@pytest.mark.parametrize("name", ["quantqdq-mixtral", "modelopt-int8-mixtral"])
def test_qdq_blocks_are_read_and_the_rewrite_says_why_it_leaves_them(name):
    """quantize_static QDQ and ModelOpt int8 (QDQ, float16 elsewhere) of Mixtral: both MoE layers read through
    Q -> DQ; the rewrite's refusal names the QDQ routing, not a routing form it misread."""
    from ortgate.graph.patterns.moe_anatomy import block_verdict

    graph = _graph(EXPORTED / name / "model.onnx")
    blocks = moe_blocks(graph)
    assert [b.layer for b in blocks] == [0, 1] and not moe_misses(graph)
    for block in blocks:
        verdict = block_verdict(graph, block)
        assert verdict is not None and not verdict.rewritable and verdict.expressible
        assert "QDQ graph" in verdict.reason


@pytest.mark.parametrize("name, why", [
    # transformers' exporter and JetMoE sort the tokens by expert with a second TopK over the picked expert indices
    # (and CumSum offsets): a dispatch, not expert groups or expert capacity
    ("tfexp-qwen3_moe-cpu", "the experts read the tokens sorted by expert (a second TopK"),
    ("dynamo-jetmoe", "the experts read the tokens sorted by expert (a second TopK"),
    # quantize_dynamic's experts: MatMulInteger of activations quantized at run time
    ("quantdyn-qwen3_moe", "4 of the block's 8 expert linears are integer matmuls (MatMulInteger"),
])
def test_the_rewrite_refuses_each_read_block_for_its_true_form(name, why):
    """Lint reads these blocks; the rewrite's refusal names the form it does not rewrite, never a form the block
    does not have (expert groups, expert capacity) nor a bare "no expert output ... found"."""
    from ortgate.graph.patterns.moe_anatomy import block_verdict

    graph = _graph(EXPORTED / name / "model.onnx")
    blocks = moe_blocks(graph)
    assert len(blocks) == 2 and not any(b.routing_form.name.endswith("GROUP_TOPK") for b in blocks)
    for block in blocks:
        verdict = block_verdict(graph, block)
        assert verdict is not None and not verdict.rewritable and verdict.reason is not None
        assert verdict.reason.startswith(why), verdict.reason
        for wrong in ("group-limited", "more than one TopK", "capacity", "no expert output weighted"):
            assert wrong not in verdict.reason


def test_a_block_whose_integer_experts_are_refused_keeps_its_float_twin_rewritable():
    """quantize_dynamic of OLMoE leaves the batched experts float (only the router is integer): still rewritten."""
    from ortgate.graph.patterns.moe_anatomy import block_verdict

    graph = _graph(EXPORTED / "quantdyn-olmoe" / "model.onnx")
    assert all(block_verdict(graph, b).rewritable for b in moe_blocks(graph))  # type: ignore[union-attr]


@pytest.mark.parametrize("name, why", [("tfexp-qwen3_moe-cpu", "the experts read the tokens sorted by expert"),
                                       ("dynamo-jetmoe", "the experts read the tokens sorted by expert"),
                                       ("quantdyn-qwen3_moe", "4 of the block's 8 expert linears are integer")])
def test_fix_reports_the_true_form_it_leaves(name, why, tmp_path):
    """`ortgate fix` plans from the same verdict: its report names each block it leaves with that form."""
    from tests.test_fix import fix_json

    code, report = fix_json(EXPORTED / name / "model.onnx", "-o", tmp_path / "out", "--select", "moe-not-fused",
                            "--dry-run")
    assert code == 0 and not report["rewrites"]
    assert [r["layer"] for r in report["refusals"]] == [0, 1]
    assert all(r["reason"].startswith(why) for r in report["refusals"]), report["refusals"]
