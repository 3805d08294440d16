"""Models ONNX Runtime refuses to load for their IR version or opset imports are not linted as if fine: the session
would fail, so lint, estimate and fix say so (one line, exit 2), judged for the deployment's ORT release. Each case
is checked against a real session of the onnxruntime installed here: ortgate refuses exactly what it refuses."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortgate.cli import main
from ortgate.knowledge.model_format import model_format

INT64_MAX = 2**63 - 1


def _model(path, *, ir: int = 10, opsets: list | None = None, duplicate: bool = False):
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "w")]
    if duplicate:
        inits.append(numpy_helper.from_array(np.zeros(4, np.float32), "w"))
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], inits)
    model = helper.make_model(graph, opset_imports=opsets or [helper.make_opsetid("", 17)])
    model.ir_version = ir
    path.write_bytes(model.SerializeToString())  # onnx.save would check the model; these are hostile on purpose
    return path


CASES = {
    "ir_version 99": ({"ir": 99}, "ir_version 99: the session will fail"),
    "opset 0": ({"opsets": [helper.make_opsetid("", 0)]}, "opset_import ai.onnx 0: no ONNX Runtime release"),
    "opset -1": ({"opsets": [helper.make_opsetid("", -1)]}, "opset_import ai.onnx -1: no ONNX Runtime release"),
    "ai.onnx.ml 99": ({"opsets": [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 99)]},
                      "opset_import ai.onnx.ml 99: the session will fail"),
}
# An ai.onnx opset above the release (2^63-1 among them) is op-unknown-to-release's error finding (OGX010).
ABOVE_THE_RELEASE = {"opset 2^63-1": {"opsets": [helper.make_opsetid("", INT64_MAX)]}}
LOADED = {
    "custom domain 2^63-1": {"opsets": [helper.make_opsetid("", 17), helper.make_opsetid("local", INT64_MAX)]},
    "com.microsoft 0": {"opsets": [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 0)]},
    "duplicate initializer names": {"duplicate": True},
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["lint", "estimate", "fix"])
def test_a_model_ort_refuses_is_said_to_fail_to_load(tmp_path, capsys, case, command):
    spec, said = CASES[case]
    path = _model(tmp_path / "m.onnx", **spec)
    args = {"lint": ["lint", str(path)], "estimate": ["estimate", str(path), "--device", "h100-sxm"],
            "fix": ["fix", str(path), "-o", str(tmp_path / "out"), "--dry-run"]}[command]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ortgate: error: {path}: {said}"), err
    assert err.count("\n") == 1


def test_an_opset_above_every_release_is_op_unknown_to_releases_finding(tmp_path):
    from tests.helpers import run_cli_json

    path = _model(tmp_path / "m.onnx", **ABOVE_THE_RELEASE["opset 2^63-1"])
    code, report = run_cli_json("lint", path)
    assert code == 1
    assert any(f["rule"] == "op-unknown-to-release" and f"opset {INT64_MAX}" in f["message"]
               for f in report["findings"]), report["findings"]


@pytest.mark.parametrize("case", sorted(LOADED))
def test_what_ort_loads_is_linted(tmp_path, capsys, case):
    path = _model(tmp_path / "m.onnx", **LOADED[case])
    assert main(["lint", str(path)]) in (0, 1), capsys.readouterr().err


def test_the_deployments_release_decides(tmp_path, capsys):
    """IR 14: onnxruntime 1.31.1 refuses it (and so does every older release), 1.32.0 loads it; a release between
    the two measured is not refused on a guess."""
    path = _model(tmp_path / "m.onnx", ir=14)
    for release, code in (("1.31.1", 2), ("1.20.0", 2), ("1.31.5", 0), ("1.32.0", 0), ("1.40.0", 0)):
        policy = tmp_path / f"{release}.yaml"
        policy.write_text(f"name: p\nexecution_provider:\n  name: cpu\n  onnxruntime_version: \"{release}\"\n")
        assert main(["lint", str(path), "--policy", str(policy), "--select", "OGX"]) == code, release
        err = capsys.readouterr().err
        if code == 2:
            assert "ir_version 14: the session will fail (onnxruntime 1.31.1" in err and "up to 13)" in err, err


def test_without_a_pinned_release_only_what_no_measured_release_loads_is_refused(tmp_path, capsys):
    """An assumed release is not enough to call a model bad input: IR 14 (onnx 1.23's default) loads on 1.32.0."""
    path = _model(tmp_path / "m.onnx", ir=14)
    assert main(["lint", str(path)]) in (0, 1), capsys.readouterr().err
    assert main(["lint", str(path), "--ort-version", "1.31.1"]) == 2
    assert "ir_version 14: the session will fail (onnxruntime 1.31.1 loads IR versions up to 13)" in \
        capsys.readouterr().err


@pytest.mark.parametrize("case", sorted(CASES) + sorted(LOADED) + sorted(ABOVE_THE_RELEASE))
def test_ortgate_refuses_exactly_what_the_installed_ort_refuses(tmp_path, case):
    ort = pytest.importorskip("onnxruntime")
    if ort.__version__ not in model_format().releases:
        pytest.skip(f"onnxruntime {ort.__version__} is not a release model_format.json measured")
    from ortgate.graph import build_graph
    from ortgate.graph.index import ort_load_refusal
    from ortgate.graph.load import read_model

    spec = CASES[case][0] if case in CASES else {**LOADED, **ABOVE_THE_RELEASE}[case]
    path = _model(tmp_path / "m.onnx", **spec)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        session.run(None, {"x": np.ones(4, np.float32)})
        refused = False
    except Exception:
        refused = True
    graph = build_graph(read_model(path), str(path))
    said = ort_load_refusal(graph, ort.__version__)
    if case in ABOVE_THE_RELEASE:  # said by OGX010 from the op schemas' opset bound
        from ortgate.knowledge.op_schemas import max_model_opset

        bound = max_model_opset(ort.__version__)
        said = said or (bound is not None and graph.opsets.get("ai.onnx", 0) > bound[0]) or None
    assert refused == (said is not None), (case, said)


def test_onnx_checker_agrees_the_refused_models_are_invalid(tmp_path):
    """Not ORT's word, a second opinion: onnx's own checker refuses IR 99 too."""
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(onnx.load(_model(tmp_path / "m.onnx", ir=99)))


def test_of_duplicate_initializers_ortgate_reads_the_last_as_ort_does(tmp_path):
    """ORT loads duplicate initializer names, warns, and keeps the last one: the index keeps the same."""
    from ortgate.graph import build_graph
    from ortgate.graph.load import read_model_indexed

    path = tmp_path / "dup.onnx"
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "w"),
                               numpy_helper.from_array(np.zeros((2, 4), np.float32), "w")])
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    proto, weights = read_model_indexed(path)
    assert build_graph(proto, str(path), initializers=weights).initializers["w"].dims == (2, 4)
