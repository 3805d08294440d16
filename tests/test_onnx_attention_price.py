"""onnx-attention-cuda-decode is priced by the cost model: each ONNX-domain Attention on CUDA costs the step the
difference between its generic kernel and GroupQueryAttention's decode kernels (knowledge/deployment_facts.json),
in the as-exported estimate, the finding's price column and the with-fixes estimate."""

from __future__ import annotations

import pytest

from ortgate.knowledge.deployment_facts import deployment_fact
from tests.helpers import run_cli_json

CUDA_POLICY = "name: onnx-attention\nexecution_provider: {name: CUDAExecutionProvider}\nthroughput: {device: h100-sxm}\n"


def _lint(make_model, write_policy, policy: str, **spec) -> dict:
    model = make_model(layers=3, dtype="float16", **spec)
    _, report = run_cli_json("lint", model, "--policy", write_policy(policy))
    return report


def _difference_ms(layers: int) -> float:
    slow, fast = deployment_fact("onnx_attention_cuda_decode").values[:2]
    return layers * (slow - fast) / 1e3


def test_the_finding_is_priced_with_the_kernel_difference(make_model, write_policy):
    report = _lint(make_model, write_policy, CUDA_POLICY, attention="onnx_attention", weights="external_stub")
    found = [f for f in report["findings"] if f["rule"] == "onnx-attention-cuda-decode"]
    assert len(found) == 1
    price = found[0]["price"]
    assert price is not None and price["device"] == "h100-sxm"
    assert price["ms_per_token"] == pytest.approx(_difference_ms(3), rel=1e-3)


def test_the_as_exported_step_pays_it_and_the_fixed_step_does_not(make_model, write_policy):
    model = make_model(layers=3, dtype="float16", attention="onnx_attention", weights="external_stub")
    _, est = run_cli_json("estimate", model, "--policy", write_policy(CUDA_POLICY))
    attention = est["as_exported"]["components"]["attention"]["ms_expected"]
    assert attention >= _difference_ms(3)  # the generic kernels' time is in the step as exported
    savings = {s["repair"]: s["ms_per_token"] for s in est["fix_savings"]}
    assert savings["onnx_attention"] == pytest.approx(_difference_ms(3), rel=1e-3)
    saved = est["as_exported"]["ms_per_step_expected"] - est["with_fixes"]["ms_per_step_expected"]
    assert saved >= _difference_ms(3) * 0.99


def test_not_priced_off_cuda(make_model, write_policy):
    model = make_model(layers=3, dtype="float16", attention="onnx_attention", weights="external_stub")
    policy = CUDA_POLICY.replace("CUDAExecutionProvider", "TensorrtExecutionProvider")
    _, est = run_cli_json("estimate", model, "--policy", write_policy(policy))
    assert "onnx_attention" not in {s["repair"] for s in est["fix_savings"]}
