"""The seed document's own CUDA configuration (tests/data/seed-config.yaml) fails the gate with precise findings.

The seed pins dims with ranges (`add_free_dimension_override_by_name("batch_size", 1, 128)`), pins `seq_len`,
which the exported model calls `sequence_length`, and passes two keys that are not CUDA provider options. Linted
against the real onnxruntime-genai export of a Qwen3.5-MoE (the Qwen3.6-35B-A3B architecture) in float16 for
CUDA, without its genai_config.json.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import onnxruntime as ort
import pytest

from ortgate.knowledge import Support, kernel_table
from tests.conftest import EXPORTED
from tests.helpers import lint_findings, run_cli

SEED_POLICY = Path(__file__).parent / "data" / "seed-config.yaml"
FAMILIES = ["OGP", "OGS", "OGK", "OGC"]  # provider, session, placement, drift
NEWER_THAN_TABLE = ["com.microsoft.CausalConvWithState", "com.microsoft.LinearAttentionGate",
                    "com.microsoft.LinearAttention", "com.microsoft.GatedRMSNorm", "com.microsoft.GatedAdd",
                    "com.microsoft.MRotaryEmbedding"]


def _subject(finding) -> str | None:
    """The option or dim a config finding is about."""
    properties = dict(finding.properties)
    return properties.get("option") or properties.get("dim")


def line_of(text: str) -> int:
    return next(i for i, line in enumerate(SEED_POLICY.read_text().splitlines(), 1) if line.strip().startswith(text))


@pytest.fixture
def qwen36_fp16(tmp_path) -> Path:
    """The exported model alone: no genai_config.json beside it, so only the seed's policy configures it."""
    source = EXPORTED / "genai-qwen3_5_moe-fp16-cuda"
    for name in ("model.onnx", "model.onnx.data"):
        shutil.copy(source / name, tmp_path / name)
    return tmp_path / "model.onnx"


def test_seed_config_findings(qwen36_fp16):
    found = lint_findings(qwen36_fp16, SEED_POLICY, select=FAMILIES)
    config = [(f.rule, f.severity.label, f.location.line, _subject(f)) for f in found if f.node is None]
    assert sorted(config) == sorted([
        ("unknown-provider-option", "error", line_of("cuda_graph_enable_partial"), "cuda_graph_enable_partial"),
        ("unknown-provider-option", "error", line_of("max_batch_size"), "max_batch_size"),
        ("free-dim-override-range", "error", line_of("batch_size: [1, 128]"), "batch_size"),
        ("free-dim-override-range", "error", line_of("seq_len: [1, 32768]"), "seq_len"),
        ("free-dim-override-unknown", "error", line_of("seq_len: [1, 32768]"), "seq_len"),
        ("capture-dim-not-pinned", "error", line_of("session:"), "sequence_length"),
        # capture over the hybrid's linear-attention state (onnxruntime#32243, onnxruntime-genai#2446)
        ("cuda-graph-recurrent-state", "warning", line_of("enable_cuda_graph"), None),
    ])  # CPU fallback: CUDA graph capture already refuses compute nodes on CPU
    # cuda-kernel-tier states each fused node's CUDA kernel (an info), not a problem of the config
    by_key = {(f.rule, f.op_type): f for f in found if f.node is not None and f.rule != "cuda-kernel-tier"}
    # the ops newer than OperatorKernels.md are decided from the 1.31.1 CUDA binary's kernel classes: none undecided
    assert by_key == {}
    assert all(kernel_table().supports("CUDAExecutionProvider", *op.rsplit(".", 1), 1, None) == Support.YES
               for op in NEWER_THAN_TABLE)

    messages = {(f.rule, _subject(f)): f.message for f in found}
    assert "did you mean 'enable_cuda_graph'?" in messages[("unknown-provider-option", "cuda_graph_enable_partial")]
    assert "did you mean 'sequence_length'?" in messages[("free-dim-override-unknown", "seq_len")]
    assert "add_free_dimension_override_by_name('batch_size', 1, 128) raises TypeError" in messages[
        ("free-dim-override-range", "batch_size")]


def test_seed_config_fails_the_gate_from_the_command_line(qwen36_fp16):
    code, out, err = run_cli("lint", qwen36_fp16, "--policy", SEED_POLICY, "--select", ",".join(FAMILIES))
    assert code == 1 and err == ""
    assert "cuda_graph_enable_partial" in out and "seq_len" in out


def test_seed_calls_do_not_configure_ort():
    so = ort.SessionOptions()
    with pytest.raises(TypeError):
        so.add_free_dimension_override_by_name("batch_size", 1, 128)


def test_corrected_config_passes(make_model, write_policy):
    policy = write_policy(
        "name: fixed\nsession:\n  graph_optimization_level: ORT_ENABLE_ALL\n"
        "  free_dimension_overrides: {batch_size: 1, sequence_length: 1}\n"
        '  config_entries: {session.disable_cpu_ep_fallback: "1"}\n'
        "execution_provider:\n  name: CUDAExecutionProvider\n"
        '  options: {device_id: 0, enable_cuda_graph: "1", use_tf32: "1"}\n')
    found = lint_findings(make_model(dtype="float16"), policy, select=FAMILIES)
    # cuda-kernel-tier's infos state each fused node's CUDA kernel: nothing to correct
    assert [f for f in found if f.rule != "cuda-kernel-tier"] == []
