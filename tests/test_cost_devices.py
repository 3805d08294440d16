"""The device catalog is data with sources: every figure names where it comes from and how sure it is."""

from __future__ import annotations

import json

import pytest

from ortgate.knowledge.devices import (
    CONFIDENCES,
    DEVICES_JSON,
    Figure,
    device_for_reported_name,
    device_names,
    find_device,
    op_costs,
    suggest_device,
)

REQUIRED = {"h100-sxm", "h100-pcie", "h100-nvl", "h200", "a100-40gb", "a100-80gb", "l40s", "l4", "a10g", "rtx-4090",
            "b200", "mi300x", "ascend-910b", "cpu"}


def _figures(node, path=""):
    if isinstance(node, dict) and "source" in node and "confidence" in node:
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from _figures(v, f"{path}.{k}" if path else k)


def test_the_catalog_holds_every_device_the_gate_names():
    assert REQUIRED <= set(device_names())


def test_every_figure_has_a_source_and_a_known_confidence():
    data = json.loads(DEVICES_JSON.read_text())
    figures = list(_figures(data))
    assert len(figures) > 60
    for path, figure in figures:
        assert figure["source"].strip(), path
        assert figure["confidence"] in CONFIDENCES, path


def test_uncertain_sources_are_marked_uncertain():
    for name in ("a10g", "ascend-910b"):
        device = find_device(name)
        assert device.bandwidth_gb_s.confidence == "uncertain" or device.tflops["bfloat16"].confidence == "uncertain"


def test_the_cpu_device_is_measured_on_the_spot_not_looked_up():
    cpu = find_device("cpu")
    assert cpu.bandwidth is None and cpu.bandwidth_gb_s.confidence == "probe"
    assert cpu.kind == "cpu"


@pytest.mark.parametrize(("typed", "meant"), [("h100", "h100-"), ("H200-SXM", "h200"), ("a100", "a100-"),
                                              ("l40", "l40s"), ("mi300", "mi300x")])
def test_a_misspelt_device_gets_a_suggestion(typed, meant):
    assert find_device(typed) is None or find_device(typed).name.startswith(meant)
    hints = suggest_device(typed)
    assert hints and all(h.startswith(meant) for h in hints)


def test_names_the_runner_reports_map_to_catalog_devices():
    assert device_for_reported_name("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert device_for_reported_name("NVIDIA H100 PCIe").name == "h100-pcie"
    assert device_for_reported_name("NVIDIA H200").name == "h200"
    assert device_for_reported_name("NVIDIA A100-SXM4-80GB").name == "a100-80gb"
    assert device_for_reported_name("NVIDIA L4").name == "l4"
    assert device_for_reported_name("cpu: Intel(R) Xeon(R) Processor").name == "cpu"
    assert device_for_reported_name("Some Future GPU") is None


def test_fused_ops_launch_several_kernels_and_views_launch_none():
    costs = op_costs()
    assert costs.gpu_launches("com.microsoft.MoE") > 1
    assert costs.gpu_launches("Reshape") == 0 and costs.gpu_launches("Shape") == 0
    assert costs.gpu_launches("MatMul") == 1
    assert "NonZero" in costs.host_sync


def test_a_step_is_read_at_cache_speed_only_when_it_fits_the_cache_the_probe_measured():
    mib = 1 << 20
    cpu = find_device("cpu").with_figures(
        bandwidth_gb_s=Figure(10.0, "test", "probe"), cache_bandwidth_gb_s=Figure(40.0, "test", "probe"),
        cache_bytes=Figure(float(32 * mib), "test", "probe"))
    assert cpu.step_bandwidth(20 * mib) == 40e9  # 80% of the cache left for activations: 25.6 MiB
    assert cpu.step_bandwidth(30 * mib) == 10e9
    assert cpu.step_bandwidth(97 * mib) == 10e9


def test_list_devices_columns_line_up_and_small_models_show_their_gflop():
    from tests.conftest import EXAMPLES
    from tests.helpers import run_cli

    _, out, _ = run_cli("estimate", "--list-devices")
    header, *rows = out.splitlines()
    label = header.index("label")
    ends = [header.index(title) + len(title) for title in ("bandwidth", "bf16/fp16", "fp32")]
    for row in rows:
        assert row[label - 2:label] == "  " and row[label] != " ", row  # the label column starts in one place
        assert all(row[end - 1] != " " and row[end] == " " for end in ends), row  # numbers end under their title
    _, out, _ = run_cli("estimate", EXAMPLES / "qwen3-moe-tiny-unfused", "--device", "h100-sxm")
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in (["attention"], ["moe"],
                                                                                               ["total"])}
    assert all(float(row[3]) > 0 for row in rows.values()), rows  # bytes value, unit, then GFLOP
