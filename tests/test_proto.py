"""ortgate.proto: onnx's schema without the onnx package. The committed schema is what its script makes of the
installed onnx, a model parses to the same message as onnx.load gives, and small constants decode to what onnx's
numpy_helper gives, value for value."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortgate.graph import build_graph
from ortgate.graph.index import TensorSummary
from ortgate.graph.load import read_model
from ortgate.graph.tensors import small_tensor_values
from ortgate.proto import attribute_type_names, dtype_names, plain_model_class, verifying_model_class
from tests.conftest import EXAMPLES, REPO

SCRIPT = REPO / "scripts" / "gen_onnx_proto.py"
EXPORTED = REPO / "tests" / "fixtures" / "exported"
MODELS = sorted(EXPORTED.glob("*/*.onnx")) + sorted(EXAMPLES.glob("*/*.onnx"))


def test_the_committed_schema_is_what_its_script_writes_for_the_installed_onnx(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    stale = tmp_path / "onnx_ml.py"
    stale.write_text((REPO / "ortgate" / "proto" / "onnx_ml.py").read_text().replace("1.", "0.", 1))
    done = subprocess.run([sys.executable, str(SCRIPT), "--check", "--output", str(stale)], capture_output=True,
                          text=True)
    assert done.returncode == 1 and "stale" in done.stderr


def test_the_schema_is_onnxs_own_and_its_enums_are_onnxs():
    from ortgate.proto.onnx_ml import SERIALIZED_FILE

    assert SERIALIZED_FILE == onnx.onnx_ml_pb2.DESCRIPTOR.serialized_pb
    assert dtype_names() == {v: k for k, v in TensorProto.DataType.items()}
    assert attribute_type_names() == {v: k for k, v in onnx.AttributeProto.AttributeType.items()}


@pytest.mark.parametrize("path", MODELS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_model_reads_as_the_message_onnx_load_gives(path):
    model = read_model(path)
    assert not isinstance(model, onnx.ModelProto)  # ortgate.proto's class, never onnx's
    assert model.SerializeToString() == onnx.load(path, load_external_data=False).SerializeToString()


def test_the_verifying_class_refuses_a_name_that_is_not_utf8_and_the_plain_class_keeps_it():
    model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [], []))
    data = model.SerializeToString().replace(b"relu", b"r\xfflu")
    assert plain_model_class().FromString(data).graph.node[0].name == b"r\xfflu"  # proto2 hands over the bytes
    verifying = verifying_model_class()
    assert verifying is not None
    with pytest.raises(Exception):  # noqa: B017 - protobuf's DecodeError
        verifying.FromString(data)


# ---- small constants, decoded without numpy -----------------------------------------------------------------------

_SAMPLES = {
    TensorProto.FLOAT: [1.5, -0.0, 3.1415927, 1e-6, float("inf"), float("nan")],
    TensorProto.DOUBLE: [1.5, -2.25, 1e-300, math.pi],
    TensorProto.FLOAT16: [1.5, -2.0, 0.0999755859375, 65504.0],
    TensorProto.BFLOAT16: [1.5, -2.0, 3.140625, 1e-5],
    TensorProto.INT8: [-128, 127, 0, -1],
    TensorProto.UINT8: [0, 255, 7],
    TensorProto.INT16: [-32768, 32767, -5],
    TensorProto.UINT16: [0, 65535, 9],
    TensorProto.INT32: [-(2**31), 2**31 - 1, 3],
    TensorProto.INT64: [-(2**63), 2**63 - 1, -1],
    TensorProto.UINT32: [0, 2**32 - 1, 5],
    TensorProto.UINT64: [0, 2**64 - 1, 5],
    TensorProto.BOOL: [True, False, True],
    TensorProto.STRING: [b"a", b"", "\u00e9t\u00e9".encode()],
    TensorProto.FLOAT8E4M3FN: [1.5, -2.0],
    TensorProto.INT4: [-8, 7, 1],
    TensorProto.COMPLEX64: [1 + 2j],
}


def _expected(t: TensorProto):
    try:
        return tuple(numpy_helper.to_array(t).reshape(-1).tolist())
    except Exception:
        return None


def _same(a, b) -> bool:
    return repr(a) == repr(b)  # nan == nan, -0.0 != 0.0, True != 1


def _tensors():
    for dtype, values in _SAMPLES.items():
        name = TensorProto.DataType.Name(dtype)
        yield f"{name}-typed", helper.make_tensor("t", dtype, [len(values)], values)
        if dtype != TensorProto.STRING:
            yield f"{name}-raw", helper.make_tensor("t", dtype, [len(values)], values, raw=False)
            array = numpy_helper.to_array(helper.make_tensor("t", dtype, [len(values)], values))
            yield f"{name}-from-array", numpy_helper.from_array(array, "t")
        yield f"{name}-scalar", helper.make_tensor("t", dtype, [], values[:1])
        yield f"{name}-empty", helper.make_tensor("t", dtype, [0], [])
        wrong = helper.make_tensor("t", dtype, [len(values) + 1], values[:1] * (len(values) + 1))
        del wrong.dims[:]
        wrong.dims.extend([len(values) + 2])  # more elements declared than held
        yield f"{name}-short", wrong
    odd = [
        ("undefined", TensorProto(data_type=0, dims=[1], float_data=[1.0])),
        ("unknown-type", TensorProto(data_type=999, dims=[1], int32_data=[1])),
        ("raw-ragged", TensorProto(data_type=TensorProto.FLOAT, dims=[1], raw_data=b"\x00\x00\x80")),
        ("negative-dim", TensorProto(data_type=TensorProto.INT64, dims=[-1], int64_data=[4, 5])),
        ("int8-out-of-range", TensorProto(data_type=TensorProto.INT8, dims=[2], int32_data=[300, -200])),
        ("uint32-out-of-range", TensorProto(data_type=TensorProto.UINT32, dims=[1], uint64_data=[2**40])),
        ("bool-two", TensorProto(data_type=TensorProto.BOOL, dims=[1], int32_data=[2])),
        ("bool-raw-two", TensorProto(data_type=TensorProto.BOOL, dims=[1], raw_data=b"\x02")),
        ("float16-negative-bits", TensorProto(data_type=TensorProto.FLOAT16, dims=[1], int32_data=[-1])),
        ("string-trailing-nul", TensorProto(data_type=TensorProto.STRING, dims=[1], string_data=[b"ab\x00"])),
        ("string-not-utf8", TensorProto(data_type=TensorProto.STRING, dims=[1], string_data=[b"\xff"])),
        ("float-raw-and-typed", TensorProto(data_type=TensorProto.FLOAT, dims=[1], float_data=[2.0],
                                            raw_data=np.float32([3.0]).tobytes())),
    ]
    yield from odd


@pytest.mark.parametrize(("what", "tensor"), list(_tensors()), ids=[w for w, _ in _tensors()])
def test_small_tensor_values_are_numpy_helpers(what, tensor):
    mine = plain_model_class()().graph.initializer.add()  # ortgate.proto's TensorProto class
    mine.ParseFromString(tensor.SerializeToString())
    assert _same(small_tensor_values(mine), _expected(tensor)), what
    assert _same(small_tensor_values(tensor), _expected(tensor)), what


@pytest.mark.parametrize("path", MODELS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_constant_of_a_real_export_decodes_as_numpy_helper_decodes_it(path):
    graph = build_graph(read_model(path), str(path))
    model = onnx.load(path, load_external_data=False)
    constants = {n.output[0]: a.t for n in model.graph.node if n.op_type == "Constant"
                 for a in n.attribute if a.name == "value"}
    decoded = 0
    for name, tensor in constants.items():
        value = graph.constant_value(name)
        expected = _expected(tensor) if math.prod(tensor.dims) <= 64 else None
        assert _same(value, expected), name
        decoded += value is not None
    for t in model.graph.initializer:
        if t.data_location != TensorProto.EXTERNAL and math.prod(t.dims) <= 64:
            assert _same(graph.initializers[t.name].small_values(), _expected(t)), t.name
    assert decoded or not constants or all(isinstance(graph.producer(n).attr("value"), TensorSummary) for n in constants)
