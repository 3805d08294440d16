"""Placement findings that are true on the installed ORT: an ONNX function op (CastLike) is inlined, not a CPU
fallback; a sequence input holds seq(tensor(T)), not a contradiction; one export choice (a bfloat16 SplitToSequence
from torch.split) is one finding that says no provider runs it; and the kernel table reflects ORT 1.31.1, so the ops
its builder writes are decided. ORT's own sessions confirm each claim on CPU."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
from onnx import parser

from ortgate.knowledge import Support, kernel_table
from tests.conftest import EXPORTED
from tests.helpers import by_rule, lint_findings

CUDA = "name: p\nexecution_provider: {name: CUDAExecutionProvider}\n"
LAYERS = 8


def _model(tmp_path, dtype: str, name: str) -> str:
    """A torch.onnx-style graph: CastLike, then a SplitToSequence read back by one SequenceAt per piece."""
    ats = "\n".join(f"  p{i} = SequenceAt(seq, i{i})" for i in range(LAYERS))
    consts = ", ".join(f"int64 i{i} = {{{i}}}" for i in range(LAYERS))
    total = " ".join(f"s{i} = Add(s{i - 1}, p{i})" if i else "s0 = Identity(p0)" for i in range(LAYERS))
    text = f"""
    <ir_version: 10, opset_import: ["" : 21], producer_name: "pytorch">
    g ({dtype}[{LAYERS}, 4] x, float[1] like_f) => ({dtype}[1, 4] y)
    <{consts}>
    {{
      like = Cast<to = {16 if dtype == "bfloat16" else 1}>(like_f)
      xc = CastLike(x, like)
      seq = SplitToSequence<axis = 0>(xc)
    {ats}
      {"; ".join(total.split(" s"))}
      y = Identity(s{LAYERS - 1})
    }}"""
    text = text.replace("; ", "\n  s").replace("  ss", "  s")
    model = parser.parse_model(text)
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture
def cuda_policy(tmp_path):
    path = tmp_path / "cuda.yaml"
    path.write_text(CUDA)
    return path


def test_castlike_is_an_inlined_function_not_a_fallback(tmp_path, cuda_policy):
    table = kernel_table()
    assert table.kernel_support("CUDAExecutionProvider", "", "CastLike", 21, ["float", "float"]) == Support.NO
    assert table.supports("CUDAExecutionProvider", "", "CastLike", 21, ["float", "float"]) == Support.YES
    fp32 = _model(tmp_path, "float", "fp32")
    # ORT's CPU provider has no CastLike kernel either, yet the session runs: it inlines the function into Cast.
    assert table.kernel_support("CPUExecutionProvider", "", "CastLike", 21, ["float", "float"]) == Support.NO
    ort.InferenceSession(fp32, providers=["CPUExecutionProvider"])
    found = lint_findings(fp32, cuda_policy, select=["OGK", "OGX"])
    assert not [f for f in found if "CastLike" in f.message], [f.message for f in found]


def test_a_sequence_input_holds_a_sequence_of_its_element_type(tmp_path, cuda_policy):
    table = kernel_table()
    r = table.supports("CUDAExecutionProvider", "", "SequenceAt", 21, ["bfloat16", "int64"])
    assert r == Support.YES and "seq(tensor(bfloat16))" in r.reason
    found = lint_findings(_model(tmp_path, "bfloat16", "bf16"), cuda_policy, select=["OGK", "OGX"])
    assert not [f for f in found if "SequenceAt" in f.message], [f.message for f in found]


def test_one_bf16_split_to_sequence_is_one_finding_that_no_provider_runs(tmp_path, cuda_policy):
    bf16 = _model(tmp_path, "bfloat16", "bf16")
    with pytest.raises(Exception, match="SplitToSequence"):  # ORT CPU has no bfloat16 SplitToSequence kernel
        ort.InferenceSession(bf16, providers=["CPUExecutionProvider"])
    found = lint_findings(bf16, cuda_policy, select=["OGK", "OGX"])
    errors = [f for f in found if f.severity.label == "error"]
    assert len(errors) == 1, [f.message for f in errors]
    [f] = errors
    # the schema allows no bfloat16 input: op-input-type's, said once; op-not-on-ep leaves the node to it
    assert f.rule == "op-input-type" and f.op_type == "SplitToSequence" and "bfloat16" in f.message
    assert "torch.split" in f.fix and "static split sizes" in f.fix


def test_op_input_type_is_one_finding_per_export_choice(tmp_path):
    # eight bfloat16 SplitToSequence nodes (one per layer of a dynamic torch.split): one finding naming all eight
    body = "\n".join(f"  s{i} = SplitToSequence<axis = 0>(x)\n  y{i} = SequenceAt(s{i}, zero)" for i in range(LAYERS))
    outs = ", ".join(f"bfloat16[1, 4] y{i}" for i in range(LAYERS))
    text = f"""
    <ir_version: 10, opset_import: ["" : 21], producer_name: "pytorch">
    g (bfloat16[8, 4] x) => ({outs})
    <int64 zero = {{0}}>
    {{
    {body}
    }}"""
    path = tmp_path / "splits.onnx"
    onnx.save(parser.parse_model(text), str(path))
    [found] = by_rule(lint_findings(str(path), None, select=["OGX"]), "op-input-type")
    assert dict(found.properties)["nodes"] == LAYERS and len(found.related_nodes) == LAYERS - 1
    assert f"({LAYERS} nodes" in found.message and "torch.split" in found.fix


@pytest.mark.parametrize("op", ["LinearAttention", "CausalConvWithState", "GatedRMSNorm", "GatedAdd",
                                "LinearAttentionGate", "GatedDeltaNet"])
def test_the_table_reflects_the_installed_release_for_the_builders_ops(op):
    table = kernel_table()
    assert "1.31.1" in table.ort_version
    r = table.supports("CUDAExecutionProvider", "com.microsoft", op, 1, None)
    assert r == Support.YES and not r.is_unknown


def test_real_builder_export_under_cuda_has_no_undecided_placement(tmp_path, cuda_policy):
    found = by_rule(lint_findings(str(EXPORTED / "genai-qwen3_5_moe-fp16-cuda"), cuda_policy, select=["OGK"]),
                    "op-not-on-ep")
    assert not [f for f in found if "could not decide" in f.message]


def test_a_node_its_cpu_fallback_cannot_run_either_is_said_to_refuse_the_session(tmp_path, cuda_policy):
    # CUDA registers no Acos, and no bfloat16 Ceil; ORT's CPU has them for float (and more) only. A float16 Acos still
    # runs on CPU (ORT casts it to float around the float kernel); a bfloat16 Ceil runs nowhere: ORT refuses it.
    found = {}
    for op, dtype in (("Acos", "float16"), ("Ceil", "bfloat16")):
        path = tmp_path / f"{op}.onnx"
        onnx.save(parser.parse_model(f"""
        <ir_version: 10, opset_import: ["" : 21]>
        g ({dtype}[2, 4] x) => ({dtype}[2, 4] y)
        {{
          y = {op}(x)
        }}"""), str(path))
        [found[op]] = by_rule(lint_findings(str(path), cuda_policy, select=["OGK"]), "op-not-on-ep")
        if dtype == "float16":
            ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        else:
            with pytest.raises(Exception, match=op):
                ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert "run on CPUExecutionProvider instead" in found["Acos"].message
    assert "has none either" not in found["Acos"].message
    assert "has none either" in found["Ceil"].message and "ORT refuses to create the session" in found["Ceil"].message
