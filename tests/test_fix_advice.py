"""The fusion rules' fix advice says what repairs this model: `ortgate fix` where its planner rewrites the block, a
builder only for a family it builds and with the deployment's execution provider, and for a router no
com.microsoft.MoE form expresses, exactly that. Each committed real export's advice is checked against what
`ortgate fix` plans for it."""

from __future__ import annotations

import pytest

from ortgate.findings import Kind
from ortgate.fix.moe import plan_moe
from ortgate.graph import build_graph
from ortgate.graph.load import load_model
from tests.conftest import EXPORTED
from tests.helpers import rule_findings

EXPORTS = sorted(p.parent for p in EXPORTED.glob("*/model.onnx"))
BUILDER = "python -m onnxruntime_genai.models.builder"
NOT_EXPRESSIBLE = "No com.microsoft.MoE form expresses this router"


def _policy(tmp_path, ep: str, family: str | None = None):
    path = tmp_path / f"{ep}-{family}.yaml"
    lines = ["name: p", f"extends: builtin:{ep}"]
    if family:
        lines += ["model:", f"  family: {family}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def _planned(folder):
    graph = build_graph(load_model(folder / "model.onnx"), str(folder / "model.onnx"))
    rewrites, refusals = plan_moe(graph)
    return {r.layer: None for r in rewrites} | {r.layer: r.reason for r in refusals}


@pytest.mark.parametrize("folder", EXPORTS, ids=lambda p: p.name)
def test_moe_advice_matches_what_fix_plans(folder, tmp_path):
    found = [f for f in rule_findings(folder / "model.onnx", "moe-not-fused", policy=_policy(tmp_path, "cpu"))
             if f.kind is Kind.VIOLATION]  # a router not read (undecided) has nothing for fix to plan
    planned = _planned(folder)
    assert {f.layer for f in found} <= set(planned)
    for f in found:
        reason = planned[f.layer]
        assert "-e cuda" not in f.fix  # a CPU policy is never told to build for CUDA
        if reason is None:
            assert f.fix.startswith("Run `ortgate fix MODEL -o OUT`: it rewrites this block"), f.fix
        else:
            assert "ortgate fix MODEL -o OUT" not in f.fix and reason in f.fix
            if NOT_EXPRESSIBLE in f.fix:
                assert BUILDER not in f.fix and "waive" in f.fix


def test_refused_routers_are_said_to_be_inexpressible(tmp_path):
    for name in ("dynamo-deepseek_v3", "dynamo-phimoe"):
        found = rule_findings(EXPORTED / name / "model.onnx", "moe-not-fused", policy=_policy(tmp_path, "cuda-decode"))
        assert found and all(f.fix.startswith(NOT_EXPRESSIBLE) for f in found), name


@pytest.mark.parametrize("family,built", [("mixtral", False), ("olmoe", False), ("qwen2_moe", False),
                                          ("qwen3_moe", False), ("gpt_oss", True)])
def test_builder_only_for_families_it_builds_and_with_the_policy_ep(tmp_path, family, built):
    model = EXPORTED / "dynamo-mixtral" / "model.onnx"
    for ep, flags in (("cpu", "-p fp32 -e cpu"), ("cuda-decode", "-p fp16 -e cuda")):
        found = rule_findings(model, "moe-not-fused", policy=_policy(tmp_path, ep, family))
        assert found
        for f in found:
            assert "ortgate fix MODEL -o OUT" in f.fix
            assert (f"{BUILDER} -i HF_DIR -o OUT {flags}`" in f.fix) is built, f.fix
            assert BUILDER in f.fix or not built


def test_fusion_rules_name_fix_where_its_fusions_apply(tmp_path):
    folder = EXPORTED / "dynamo-qwen3_moe"
    policy = _policy(tmp_path, "cpu", "qwen3_moe")
    for rule in ("rmsnorm-not-fused", "skip-rmsnorm-not-fused", "rotary-not-fused", "gqa-not-fused"):
        found = rule_findings(folder / "model.onnx", rule, policy=policy)
        assert found, rule
        for f in found:
            assert "ortgate fix MODEL -o OUT" in f.fix, (rule, f.fix)
            assert BUILDER not in f.fix  # the builder does not build Qwen3-MoE
