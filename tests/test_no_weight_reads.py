"""ortgate never reads weight bytes: the external data file is never opened, and a model lints exactly the same
(same JSON report) whether its data file is there, missing, or a sparse file of the declared size.

The opens are recorded with an audit hook (sys.addaudithook) during an in-process lint; a permission-based
check would prove nothing where tests run as root.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from ortgate.cli import main
from ortgate.graph import build_graph
from tests.conftest import EXPORTED
from tests.models.qwen_moe import ModelSpec, build_model, save_model


class _OpenRecorder:
    """Files this process opens while recording. An audit hook cannot be removed, so one is installed once
    and records only inside `recording()`."""

    def __init__(self) -> None:
        self._paths: list[str] | None = None
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self._paths is not None and event == "open" and args and isinstance(args[0], (str, bytes, os.PathLike)):
            self._paths.append(os.path.realpath(os.fsdecode(args[0])))

    @contextmanager
    def recording(self):
        self._paths = paths = []
        try:
            yield paths
        finally:
            self._paths = None


_recorder: _OpenRecorder | None = None


def opens():
    global _recorder
    if _recorder is None:
        _recorder = _OpenRecorder()
    return _recorder.recording()


def lint_json(model: Path, report: Path, *extra: str) -> tuple[int, str]:
    code = main(["lint", str(model), "--format", "json", "--output", str(report), *extra])
    assert code in (0, 1), f"lint failed with exit code {code}"
    return code, report.read_text()


def declared_external_bytes(model: onnx.ModelProto) -> int:
    end = 0
    for t in model.graph.initializer:
        if t.data_location == TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in t.external_data}
            end = max(end, int(entries.get("offset", 0)) + int(entries.get("length", 0)))
    return end


def test_weights_written_to_a_data_file_are_never_opened_and_lint_the_same_without_it(tmp_path):
    spec = ModelSpec(layers=2, moe="dense_loop", experts=4, shared_expert=True)
    model_path = save_model(build_model(spec), tmp_path / "model.onnx", external_data=True)
    data_path = model_path.with_name("model.onnx.data")
    assert data_path.stat().st_size > 0  # real weight bytes

    with opens() as opened:
        _, with_data = lint_json(model_path, tmp_path / "with-data.json")
    assert str(model_path.resolve()) in opened  # the recorder sees the lint's own reads
    assert str(data_path.resolve()) not in opened

    data_path.unlink()
    _, without_data = lint_json(model_path, tmp_path / "without-data.json")
    assert without_data == with_data


def test_35b_class_model_declaring_gigabytes_lints_the_same_with_data_absent_or_sparse(tmp_path):
    # Qwen3.6-35B-A3B's shape, 2 of its 40 layers: fused MoE with 256 experts, hybrid attention, shared expert.
    spec = ModelSpec(
        layers=2, layer_types=("linear_attention", "full_attention"), experts=256, top_k=8, shared_expert=True,
        hidden=2048, num_heads=16, kv_num_heads=2, head_dim=256, moe_intermediate=512, vocab=248320,
        dtype="float16", weights="external_stub", stub_location="model.onnx.data",
    )
    proto = build_model(spec)
    declared = declared_external_bytes(proto)
    assert declared > 2 * 2**30
    model_path = save_model(proto, tmp_path / "model.onnx")
    data_path = tmp_path / "model.onnx.data"
    assert not data_path.exists()

    _, absent = lint_json(model_path, tmp_path / "absent.json")
    with open(data_path, "wb") as f:
        f.truncate(declared)  # sparse: the declared size, no blocks on disk
    with opens() as opened:
        _, sparse = lint_json(model_path, tmp_path / "sparse.json")
    assert str(model_path.resolve()) in opened
    assert str(data_path.resolve()) not in opened
    assert sparse == absent


@pytest.mark.parametrize("fixture", ["genai-qwen3_5_moe-int4-cpu", "genai-gpt_oss-fp32-cpu"])
def test_exported_model_folder_never_opens_its_data_file(fixture, tmp_path):
    folder = tmp_path / fixture
    shutil.copytree(EXPORTED / fixture, folder)
    data_path = folder / "model.onnx.data"
    assert data_path.stat().st_size > 0

    with opens() as opened:
        _, with_data = lint_json(folder, tmp_path / "with-data.json")
    assert str((folder / "model.onnx").resolve()) in opened
    assert str((folder / "genai_config.json").resolve()) in opened
    assert str(data_path.resolve()) not in opened

    data_path.unlink()
    _, without_data = lint_json(folder, tmp_path / "without-data.json")
    assert without_data == with_data


def test_billion_element_declarations_are_metadata_only(tmp_path):
    billion = 1_000_000_000

    def declared(name: str, dtype: int, dims: list[int]) -> TensorProto:
        tensor = TensorProto(name=name, data_type=dtype)
        tensor.dims.extend(dims)
        return tensor

    huge_external = declared("blocks.0.w_huge", TensorProto.FLOAT16, [billion, 4096])
    huge_external.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "model.onnx.data"), ("offset", "0"), ("length", str(billion * 4096 * 2))):
        entry = huge_external.external_data.add()
        entry.key, entry.value = key, value
    # A Constant whose dims declare a billion elements but which carries 4 bytes: never decoded.
    lying = declared("lying", TensorProto.FLOAT, [billion])
    lying.raw_data = b"\x00\x00\x80\x3f"
    nodes = [
        helper.make_node("Constant", [], ["c"], name="blocks.0/Constant", value=lying),
        helper.make_node("MatMul", ["x", "blocks.0.w_huge"], ["y"], name="blocks.0/MatMul"),
        helper.make_node("Add", ["y", "c"], ["z"], name="blocks.0/Add"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [billion, billion])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [billion, 4096])],
        initializer=[huge_external],
        value_info=[helper.make_tensor_value_info("y", TensorProto.FLOAT16, [billion, 4096])],
    )
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path)

    index = build_graph(model, str(path))
    assert index.initializers["blocks.0.w_huge"].numel == billion * 4096
    assert index.constant_value("c") is None
    assert index.shape("y") == (billion, 4096)
    with opens() as opened:
        lint_json(path, tmp_path / "report.json")
    assert str((tmp_path / "model.onnx.data").resolve()) not in opened
    assert math.prod(index.shape("x")) == billion * billion


def test_weight_sized_attribute_list_is_not_decoded(tmp_path):
    import numpy as np

    values = np.arange(2_000_000, dtype=np.float32)  # 8 MB of floats in a Constant's value_floats
    constant = helper.make_node("Constant", [], ["w"], name="blocks.0/Constant")
    constant.attribute.append(helper.make_attribute("value_floats", values.tolist()))
    small = helper.make_node("Constant", [], ["s"], name="blocks.0/Scale", value_floats=[0.5, 2.0])
    nodes = [constant, small, helper.make_node("Mul", ["w", "s"], ["y"], name="blocks.0/Mul")]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2_000_000])])
    model = helper.make_model(graph, ir_version=10, opset_imports=[helper.make_opsetid("", 21)])
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path)

    index = build_graph(model, str(path))
    assert index.constant_value("s") == (0.5, 2.0)
    assert index.constant_value("w") is None
    assert index.dtype("w") == "float"
    lint_json(path, tmp_path / "report.json")
