"""`ortgate fix` moves INT4 tensors (DequantizeLinear weights of ORT's MatMulNBits quantizer in QDQ format, data
type 22, two elements a byte) as the bytes they are, so a QDQ int4 model gets its MoE rewritten and its norms and
attention fused, and every INT4 weight reaches the output unchanged, inline or in external data."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from ortgate.errors import InputError
from ortgate.fix.weights import WeightSource
from tests.conftest import EXPORTED
from tests.test_fix import fix_json

QDQ4 = EXPORTED / "qdq4-qwen3_moe" / "model.onnx"


def _int4(path) -> dict[str, tuple[list[int], bytes]]:
    model = onnx.load(str(path))  # with external data
    return {t.name: (list(t.dims), t.raw_data) for t in model.graph.initializer if t.data_type == TensorProto.INT4}


@pytest.mark.parametrize("external", [False, True], ids=["inline", "external"])
def test_a_qdq_int4_model_is_fixed_and_its_int4_weights_move_unchanged(tmp_path, external):
    source = QDQ4
    if external:  # every tensor in a data file: the INT4 ones are read from the file
        model = onnx.load(str(QDQ4))
        source = tmp_path / "in" / "model.onnx"
        source.parent.mkdir()
        onnx.save_model(model, str(source), save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=1024)
    before = _int4(source)
    assert len(before) == 9 and all(len(raw) == (np.prod(dims) + 1) // 2 for dims, raw in before.values())
    out = tmp_path / "out"
    code, report = fix_json(source, "-o", out)
    assert code == 0, report.get("failure")
    assert report["written"] and report["verification"]["passed"]
    assert len(report["rewrites"]) == 2 and report["fusions"]["counts"]["rms_normalization"] > 0
    after = _int4(out / "model.onnx")
    assert after == before


def test_a_packed_tensor_is_never_sliced(tmp_path):
    model = onnx.load(str(QDQ4))
    name = next(t.name for t in model.graph.initializer if t.data_type == TensorProto.INT4)
    source = WeightSource(model, QDQ4)
    assert source.read(name).size == source.locate(name).nbytes
    with pytest.raises(InputError, match="narrower than a byte"):
        source.read(name, index=0)


def test_a_truncated_int4_tensor_is_an_input_error_naming_it(tmp_path, capsys):
    folder = tmp_path / "in"
    shutil.copytree(QDQ4.parent, folder)
    model = onnx.load(str(folder / "model.onnx"))
    onnx.save_model(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data",
                    size_threshold=1024)
    data = folder / "model.onnx.data"
    data.write_bytes(data.read_bytes()[:-1])  # the last tensor in the file ends a byte early
    code, _ = fix_json(folder / "model.onnx", "-o", tmp_path / "out")
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "out").exists()
    assert "truncated" in err and "model.onnx.data" in err and "Traceback" not in err


def test_int4_experts_are_refused_with_the_reason(tmp_path):
    """Experts whose weights are INT4 DequantizeLinear outputs: each MoE block stays, saying why, and the model is
    read to the end; the norms the fix fuses land on their own, verified."""
    source = EXPORTED / "qdq4-optimum-qwen3_moe-past" / "model.onnx"
    code, report = fix_json(source, "-o", tmp_path / "out")
    assert code == 0 and not report["failure"], report
    assert not report["rewrites"] and len(report["refusals"]) == 2
    assert all("DequantizeLinear" in r["reason"] for r in report["refusals"])
    assert report["written"] and report["verification"]["passed"]
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out" / "model.onnx"), load_external_data=False).graph.node]
    assert "MoE" not in ops and "SkipSimplifiedLayerNormalization" in ops
