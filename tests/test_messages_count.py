"""Messages that say what they found: a finding about several layers is the model's (no layer in JSON), a TopK's k
is named once, and attention whose q/k heads differ from its v heads (MLA) is told whether GroupQueryAttention can
run it before it is advised."""

from __future__ import annotations

from tests.conftest import EXPORTED
from tests.helpers import rule_findings, run_cli_json

GQA = "gqa-not-fused"


def test_a_finding_about_every_layer_has_no_layer_in_json(make_model):
    model = make_model(layers=3, norm_epsilon=None)  # every fused norm without epsilon: one model-wide finding
    code, report = run_cli_json("lint", model, "--select", "norm-epsilon-default,moe-not-fused")
    assert code == 0
    (eps,) = [f for f in report["findings"] if f["rule"] == "norm-epsilon-default"]
    assert "layers 0-2" in eps["message"] and eps["layer"] is None


def test_a_finding_about_one_layer_keeps_it(make_model):
    model = make_model(layers=1, norm_epsilon=None)
    code, report = run_cli_json("lint", model, "--select", "norm-epsilon-default")
    (eps,) = report["findings"]
    assert eps["layer"] == 0


def test_per_layer_findings_keep_their_layers(make_model):
    model = make_model(layers=3, moe="dense_loop")
    _, report = run_cli_json("lint", model, "--select", "moe-not-fused")
    assert sorted(f["layer"] for f in report["findings"]) == [0, 1, 2]


def test_topk_k_is_named_once(make_model, write_policy):
    model = make_model(layers=2, moe="dense_loop", top_k=2)
    (f,) = rule_findings(model, "moe-routing-mismatch", write_policy("name: p\nmodel:\n  top_k: 4\n"))
    assert f.message.startswith("TopK k=2 in layers 0-1") and "TopK TopK" not in f.message
    assert f.layer is None


def test_mla_attention_is_told_gqa_cannot_run_it_directly():
    found = rule_findings(EXPORTED / "dynamo-deepseek_v3" / "model.onnx", GQA)
    assert [f.layer for f in found] == [0, 1]
    for f in found:
        props = dict(f.properties)
        assert (props["qk_head_size"], props["v_head_size"], props["gqa_expresses_directly"]) == (24, 16, False)
        assert "q/k head size (24) differs from its v head size (16)" in f.message
        assert "only with V zero-padded to 24 per head" in f.message
        assert "instead of com.microsoft.GroupQueryAttention" not in f.message
        assert f.fix is not None and f.fix.startswith("Export attention as com.microsoft.MultiHeadAttention")


def test_attention_with_equal_head_sizes_keeps_the_gqa_advice():
    for fixture in ("dynamo-mixtral", "dynamo-gpt_oss"):
        found = rule_findings(EXPORTED / fixture / "model.onnx", GQA)
        assert found
        for f in found:
            assert "instead of com.microsoft.GroupQueryAttention" in f.message and "MLA" not in f.message
            assert "qk_head_size" not in dict(f.properties)
            assert f.fix is not None and f.fix.startswith("Export attention as com.microsoft.GroupQueryAttention")
