"""The device catalog's compute capability (NVIDIA's table) decides the CUDA contracts that need one: the compact
fpA_intB build's 7.5+ for float16 and 8.0+ for bfloat16 activations, FP4 QMoE's SM90+ (provider-refuses-node).

The catalog lists no NVIDIA device below 8.0, so the fpA_intB thresholds are proved on a catalog device whose
compute capability is replaced (a T4-class 7.5), through the same pipeline a lint runs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import lint, load_inputs
from ortgate.knowledge.devices import Figure, device_names, find_device
from tests.rule_inputs import RuleInputs

MATMUL = """
<ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
proj ({dtype}[1, 64] a) => ({dtype}[1, 64] y)
<uint8[64, 2, 16] b, {dtype}[128] scales>
{{
  y = com.microsoft.MatMulNBits<K = 64, N = 64, bits = 4, block_size = 32, weight_prepacked = 1>(a, b, scales)
}}
"""
POLICY = "execution_provider: {name: CUDAExecutionProvider}\nthroughput: {device: a10g}\n"


def test_every_nvidia_device_has_a_sourced_compute_capability_and_no_other_has_one():
    for name in device_names():
        device = find_device(name)
        assert device is not None
        cc = device.compute_capability
        if device.label.startswith("NVIDIA"):
            assert cc.value is not None and 7.0 <= cc.value < 11.0, name
            assert "developer.nvidia.com/cuda-gpus" in cc.source and cc.confidence == "datasheet", name
        else:
            assert cc.value is None, name


@pytest.mark.parametrize(("dtype", "capability", "refused"), [
    ("bfloat16", 7.5, True),   # BF16 needs 8.0 or later
    ("float16", 7.5, False),   # FP16 needs 7.5 or later
    ("float16", 7.0, True),
    ("bfloat16", 8.0, False),
])
def test_prepacked_fpa_intb_is_judged_on_the_devices_compute_capability(tmp_path, dtype, capability, refused):
    request, _ = RuleInputs(model_text=MATMUL.format(dtype=dtype), policy=POLICY).write(tmp_path)
    inputs = load_inputs(request)
    assert inputs.throughput is not None and inputs.throughput.device is not None
    device = inputs.throughput.device.with_figures(compute_capability=Figure(capability, "a T4-class device", "datasheet"))
    inputs = replace(inputs, throughput=replace(inputs.throughput, device=device))
    config = gate_config_from(inputs.policy, cli_select=["OGX011"], cli_ignore=None, fail_on=None,
                              baseline=None, baseline_path=None)
    found = [f for f in lint(inputs, config).findings if f.code == "OGX011"]
    if not refused:
        assert found == []
        return
    assert len(found) == 1
    props = dict(found[0].properties)
    assert props["refusal"] == "fpa_intb_compute_capability"
    assert props["compute_capability"] == capability
    assert props["required_compute_capability"] == (8.0 if dtype == "bfloat16" else 7.5)
    assert "compute capability" in found[0].message and dtype in found[0].message


OFFLOAD_MOE = """
<ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
moe_layer (float16[T, 8] x, float16[T, 4] logits) => (float16[T, 8] y)
<float16[4, 16, 8] fc1, float16[4, 8, 8] fc2>
{
  y = com.microsoft.MoE<k = 2, activation_type = "swiglu", swiglu_fusion = 1>(x, logits, fc1, , fc2)
}
"""
OFFLOAD_POLICY = """execution_provider: {name: CUDAExecutionProvider, onnxruntime_version: "1.32.0"}
session:
  config_entries: {session.moe.offload.mode: required}
throughput: {device: a10g}
"""


@pytest.mark.parametrize(("capability", "refused"), [(7.5, True), (8.0, False), (None, False)])
def test_required_moe_offload_is_judged_on_the_devices_compute_capability(tmp_path, capability, refused):
    request, _ = RuleInputs(model_text=OFFLOAD_MOE, policy=OFFLOAD_POLICY).write(tmp_path)
    inputs = load_inputs(request)
    assert inputs.throughput is not None and inputs.throughput.device is not None
    device = inputs.throughput.device.with_figures(compute_capability=Figure(capability, "a test device", "datasheet"))
    inputs = replace(inputs, throughput=replace(inputs.throughput, device=device))
    config = gate_config_from(inputs.policy, cli_select=["OGP013"], cli_ignore=None, fail_on=None,
                              baseline=None, baseline_path=None)
    found = [f for f in lint(inputs, config).findings if f.code == "OGP013"]
    assert len(found) == (1 if refused else 0)
    if refused:
        assert "compute capability 8.0 or later" in found[0].message and "7.5" in found[0].message


MXFP4 = """
<ir_version: 10, opset_import: ["" : 21, "com.microsoft" : 1]>
moe (float16[T, 64] x, float16[T, 4] logits) => (float16[T, 64] y)
<uint8[4, {n}, 32] w1, uint8[4, {n}, 2] s1, uint8[4, 64, {k2}] w2, uint8[4, 64, {s2}] s2>
{{
  y = com.microsoft.QMoE<k = 2, expert_weight_bits = 4, block_size = 32, quant_type = "fp4", activation_type = "swiglu", swiglu_fusion = 1>(
      x, logits, w1, s1, , w2, s2)
}}
"""


@pytest.mark.parametrize(("n", "provider", "doubled"), [
    (264, "CUDAExecutionProvider", True),    # 264 % 16 != 0: outside the interleaved GEMV rules
    (256, "CUDAExecutionProvider", False),   # inside them
    (264, "CUDAExecutionProvider, onnxruntime_version: '1.30.0'", False),  # before the release read
])
def test_mxfp4_experts_outside_the_gemv_rules_count_twice_in_the_memory_estimate(tmp_path, n, provider, doubled):
    model = MXFP4.format(n=n, k2=n // 4, s2=n // 64 if n % 64 == 0 else n // 64 + 1)
    policy = f"execution_provider: {{name: {provider}}}\nthroughput: {{device: h100-sxm}}\n"
    request, _ = RuleInputs(model_text=model, policy=policy).write(tmp_path)
    inputs = load_inputs(request)
    memory = inputs.memory
    assert memory is not None
    parts = {p.name: p for p in memory.parts}
    if not doubled:
        assert "mxfp4_repack" not in parts
        return
    expert_bytes = 4 * n * 32 + 4 * 64 * (n // 4)  # fc1 and fc2 expert weights, uint8
    assert parts["mxfp4_repack"].bytes == expert_bytes
    assert "doubles the persistent MoE weight footprint" in parts["mxfp4_repack"].how
