"""moe-routing-mismatch, gqa-config-mismatch, gqa-heads-not-grouped, gqa-window-mismatch, tensor-parallel-split: this
graph, this policy, these findings."""

from __future__ import annotations

import json

import onnx
import pytest

from ortgate.findings import Severity
from ortgate.knowledge.families import model_family
from tests.conftest import EXPORTED
from tests.helpers import by_rule, lint_findings

ROUTING = "moe-routing-mismatch"
GQA = "gqa-config-mismatch"
GQA_HEADS = "gqa-heads-not-grouped"
GQA_WINDOW = "gqa-window-mismatch"
TP = "tensor-parallel-split"


def findings(model, rule, policy=None, config=None):
    return by_rule(lint_findings(model, policy, config=config, select=[rule]), rule)


def set_attribute(path, op_type: str, name: str, value) -> None:
    model = onnx.load(str(path))
    for node in model.graph.node:
        if node.op_type == op_type:
            for attr in node.attribute:
                if attr.name == name:
                    attr.i = value
    onnx.save(model, str(path))


# model families ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, family", [("qwen3_5_moe_text", "qwen3_5_moe"), ("gptoss", "gpt_oss"),
                                          ("Qwen3MoeForCausalLM", "qwen3_moe"), ("qwen3.6-moe", "qwen3_5_moe"),
                                          ("PhiMoEForCausalLM", "phimoe"), ("MixtralForCausalLM", "mixtral")])
def test_family_names_from_policies_hf_and_genai(name, family):
    assert model_family(name).name == family


def test_unknown_family_is_none():
    assert model_family("llama9_moe") is None and model_family("") is None


# moe-routing-mismatch -------------------------------------------------------------------------------------


def test_k_differs_from_policy_top_k(make_model, write_policy):
    found = findings(make_model(top_k=2, layers=3), ROUTING, write_policy("name: p\nmodel:\n  top_k: 8\n"))
    assert len(found) == 1  # one finding for the attribute, listing the layers
    props = dict(found[0].properties)
    assert (props["attribute"], props["found"], props["expected"], props["nodes"]) == ("k", 2, 8, 3)
    assert "layers 0-2" in found[0].message and "the policy expects 8" in found[0].message
    assert found[0].severity == Severity.ERROR


def test_unnormalised_routing_for_a_normalising_family(make_model, write_policy):
    found = findings(make_model(normalize_routing_weights=0), ROUTING, write_policy("name: p\nmodel:\n  family: qwen3_moe\n"))
    assert [dict(f.properties)["attribute"] for f in found] == ["normalize_routing_weights"]
    assert "qwen3_moe family renormalises" in found[0].message


def test_policy_norm_topk_prob_wins_over_the_family(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  family: qwen3_moe\n  norm_topk_prob: false\n")
    found = findings(make_model(normalize_routing_weights=1), ROUTING, policy)
    assert [dict(f.properties)["expected"] for f in found] == [0]


def test_gpt_oss_swiglu_constants(make_model, write_policy):
    found = findings(make_model(), ROUTING, write_policy("name: p\nmodel:\n  family: gpt_oss\n"))
    assert {dict(f.properties)["attribute"] for f in found} == {"activation_alpha", "activation_beta", "swiglu_limit"}


def test_genai_gpt_oss_matches_its_family_and_not_qwen(write_policy):
    model = EXPORTED / "genai-gpt_oss-fp32-cpu"
    assert findings(model, ROUTING) == []  # family from genai_config.json's type "gptoss"
    found = findings(model, ROUTING, write_policy("name: p\nmodel:\n  family: qwen3_5_moe\n"))
    assert {dict(f.properties)["attribute"] for f in found} == {"activation_alpha", "activation_beta", "swiglu_limit"}


def test_ungated_activation_for_a_gated_family(make_model, write_policy):
    found = findings(make_model(moe_activation="silu"), ROUTING, write_policy("name: p\nmodel:\n  family: qwen3_moe\n"))
    assert [(dict(f.properties)["attribute"], dict(f.properties)["found"]) for f in found] == [("activation_type", "silu")]


def test_sparse_mixer_family(make_model, write_policy):
    found = findings(make_model(), ROUTING, write_policy("name: p\nmodel:\n  family: phimoe\n"))
    assert "use_sparse_mixer" in {dict(f.properties)["attribute"] for f in found}


def test_unfused_topk_k(make_model, write_policy):
    found = findings(make_model(moe="dense_loop", top_k=2), ROUTING, write_policy("name: p\nmodel:\n  top_k: 4\n"))
    assert [dict(f.properties)["attribute"] for f in found] == ["TopK k"] and found[0].op_type == "TopK"


def test_unknown_family_is_undecided(make_model, write_policy):
    found = findings(make_model(), ROUTING, write_policy("name: p\nmodel:\n  family: llama9_moe\n"))
    assert [f.severity for f in found] == [Severity.INFO] and "could not decide" in found[0].message


def test_matching_policy_passes(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  family: qwen3_moe\n  top_k: 2\n  activation: swiglu\n  norm_topk_prob: true\n")
    assert findings(make_model(), ROUTING, policy) == []


# gqa-config-mismatch, gqa-heads-not-grouped, gqa-window-mismatch ------------------------------------------


def test_heads_not_a_multiple_of_kv_heads(make_model):
    path = make_model()
    set_attribute(path, "GroupQueryAttention", "kv_num_heads", 3)
    found = findings(path, GQA_HEADS)
    assert len(found) == 2 and "not a multiple" in found[0].message
    assert findings(path, GQA) == []  # no policy: nothing to disagree with


def test_head_size_differs_from_policy(make_model, write_policy):
    found = findings(make_model(head_dim=16), GQA, write_policy("name: p\nmodel:\n  head_size: 32\n"))
    assert len(found) == 1
    assert dict(found[0].properties) == {"attribute": "head_size", "found": 16, "expected": 32, "nodes": 2}
    assert "layers 0-1" in found[0].message and "model.head_size" in found[0].message


def test_heads_differ_from_policy_one_finding_per_attribute(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  num_heads: 16\n  kv_num_heads: 2\n")
    found = findings(make_model(num_heads=4, kv_num_heads=2, layers=3), GQA, policy)
    assert [(dict(f.properties)["attribute"], dict(f.properties)["found"], dict(f.properties)["nodes"])
            for f in found] == [("num_heads", 4, 3)]
    assert "the policy expects 16" in found[0].message


def test_fp32_gqa_under_cuda_is_op_not_on_ep_alone(make_model, write_policy):
    cuda = write_policy("name: p\nexecution_provider:\n  name: CUDAExecutionProvider\n")
    found = lint_findings(make_model(dtype="float32"), cuda)
    gqa = [f for f in found if "GroupQueryAttention" in f.message and f.severity is Severity.ERROR]
    assert [f.rule for f in gqa] == ["op-not-on-ep"]


def test_gpt_oss_sliding_layers_follow_genai_config(tmp_path):
    folder = EXPORTED / "genai-gpt_oss-fp32-cpu"
    assert findings(folder, GQA_WINDOW) == []
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["sliding_window"]["layers"] = [1]  # the other layer than the graph's
    swapped = tmp_path / "genai_config.json"
    swapped.write_text(json.dumps(config, indent=4))
    found = sorted(findings(folder / "model.onnx", GQA_WINDOW, config=swapped), key=lambda f: f.layer)
    assert [(f.layer, dict(f.properties)["expected"]) for f in found] == [(0, -1), (1, 32)]


# tensor-parallel-split ------------------------------------------------------------------------------------


def test_uneven_split_points_at_the_policy_line(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  num_heads: 4\n  kv_num_heads: 2\n  experts: 4\n  tensor_parallel: 3\n")
    found = findings(make_model(), TP, policy)
    assert {dict(f.properties)["what"] for f in found} >= {"num_heads", "experts", "kv_num_heads"}
    assert all(f.location.line == 6 and f.location.file == str(policy) for f in found)
    assert all(f.severity == Severity.ERROR for f in found)


def test_more_ranks_than_kv_heads_replicates(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  num_heads: 4\n  kv_num_heads: 2\n  experts: 4\n  tensor_parallel: 4\n")
    found = findings(make_model(moe_intermediate=32), "tp-kv-heads-replicated", policy)
    assert [(f.severity, dict(f.properties)["replicas"]) for f in found] == [(Severity.INFO, 2)]
    assert findings(make_model(moe_intermediate=32), TP, policy) == []


def test_even_split_passes(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  tensor_parallel: 2\n")
    assert findings(make_model(), TP, policy) == []


def test_intermediate_size_from_the_moe_weights(make_model, write_policy):
    policy = write_policy("name: p\nmodel:\n  tensor_parallel: 8\n  num_heads: 8\n  kv_num_heads: 8\n  experts: 8\n")
    found = findings(make_model(num_heads=8, kv_num_heads=8, experts=8, moe_intermediate=36), TP, policy)
    assert [(dict(f.properties)["what"], dict(f.properties)["value"]) for f in found] == [("moe_intermediate_size", 36)]


def test_no_tensor_parallel_no_check(make_model):
    assert findings(make_model(), TP) == []
