"""`--optimized DUMP` must be an optimization of MODEL: the same graph inputs and outputs (names, element types)
and the weights ORT did not rewrite (same names, dims and dtypes). Anything else is an input error naming the dump."""

from __future__ import annotations

import onnxruntime as ort
import pytest

from tests.conftest import EXAMPLES, EXPORTED
from tests.helpers import run_cli

SPEC = dict(layers=2, moe="dense_loop", attention="decomposed")


def ort_dump(model, path, level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.optimized_model_filepath = str(path)
    options.log_severity_level = 3
    ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    return path


@pytest.mark.parametrize("model", [EXAMPLES / "qwen3-moe-tiny-unfused" / "model.onnx",
                                   EXAMPLES / "qwen3-moe-tiny-fused" / "model.onnx",
                                   EXPORTED / "dynamo-qwen3_moe" / "model.onnx",
                                   EXPORTED / "genai-qwen3_5_moe-fp32-cpu" / "model.onnx"], ids=lambda p: p.parent.name)
@pytest.mark.parametrize("level", [ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_ALL],
                         ids=lambda lv: lv.name)
def test_ort_s_own_dumps_are_accepted(tmp_path, model, level):
    dump = ort_dump(model, tmp_path / "opt.onnx", level)
    code, _, err = run_cli("lint", model, "--optimized", dump)
    assert code in (0, 1) and err == ""


def _refused(model, dump) -> str:
    code, out, err = run_cli("lint", model, "--optimized", dump)
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"ortgate: error: {dump}: not an optimization of {model}: "), err
    return err


def test_a_dump_of_another_model_is_refused(tmp_path):
    other = ort_dump(EXPORTED / "dynamo-qwen3_moe" / "model.onnx", tmp_path / "opt.onnx")
    err = _refused(EXAMPLES / "qwen3-moe-tiny-unfused" / "model.onnx", other)
    assert "graph inputs differ from the model's: it lacks the model's 'past_key_values.0.key'" in err


def test_a_dump_of_another_export_with_the_same_interface_is_refused(make_model, tmp_path):
    """Same graph inputs and outputs (onnxruntime-genai's interface), weights named by another exporter."""
    model = make_model("hf", naming="hf", **SPEC)
    other = ort_dump(make_model("opaque", naming="opaque", **SPEC), tmp_path / "opt.onnx")
    assert "no initializer in common with the model" in _refused(model, other)


def test_a_dump_of_another_size_of_the_model_is_refused(make_model, tmp_path):
    model = make_model("small", hidden=64, **SPEC)
    other = ort_dump(make_model("big", hidden=128, **SPEC), tmp_path / "opt.onnx")
    assert "in the dump but [" in _refused(model, other) and "another size of the model" in _refused(model, other)


def test_a_dump_whose_inputs_have_other_types_is_refused(make_model):
    model = make_model("fp32", dtype="float32", **SPEC)
    other = make_model("fp16", dtype="float16", **SPEC)
    err = _refused(model, other)
    assert "input 'past_key_values.0.key' is float16 in the dump but float in the model" in err


@pytest.mark.parametrize(("model", "sibling", "said"), [
    ("dynamo-mixtral", "dynamo-qwen2_moe", "it holds weights the model does not have ("),
])
def test_a_dump_of_a_sibling_export_sharing_weight_names_and_the_interface_is_refused(tmp_path, model, sibling, said):
    """Two tiny torch.onnx exports (Mixtral, Qwen2-MoE): the same graph inputs and outputs, weight names shared with
    equal dims. The sibling dump's constants that differ from the model's in size are renamed, so every name the two
    share agrees: what is left to tell them apart is the weights Qwen2-MoE has and Mixtral has not (the shared
    expert, the q/k biases), which ORT could not have made out of Mixtral's. (The other way round, a dump of the
    smaller sibling for the larger model, is not told apart: ORT drops weights, and folds parts of them into
    constants named like any value of a dynamo export.)"""
    import onnx

    model = EXPORTED / model / "model.onnx"
    dump = onnx.load(str(ort_dump(EXPORTED / sibling / "model.onnx", tmp_path / "sibling.onnx")))
    mine = {t.name: (list(t.dims), t.data_type) for t in onnx.load(str(model), load_external_data=False).graph.initializer}
    renamed = {}
    for tensor in dump.graph.initializer:
        if tensor.name in mine and mine[tensor.name] != (list(tensor.dims), tensor.data_type):
            renamed[tensor.name] = tensor.name = f"sibling_{tensor.name}"
    for node in dump.graph.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
    shared = [t.name for t in dump.graph.initializer if t.name in mine]
    assert len(shared) >= 14 and all(mine[t.name] == (list(t.dims), t.data_type)
                                     for t in dump.graph.initializer if t.name in mine)
    onnx.save(dump, str(tmp_path / "sibling.onnx"))
    err = _refused(model, tmp_path / "sibling.onnx")
    assert said in err, err


@pytest.mark.parametrize("model", sorted(EXPORTED.glob("*/model.onnx")), ids=lambda p: p.parent.name)
def test_every_committed_exports_own_dump_is_accepted(tmp_path, model):
    """The weight check refuses none of ORT's own dumps (ORT_ENABLE_ALL, the level that rewrites most)."""
    from ortgate.graph import build_graph
    from ortgate.graph.dump import optimization_mismatch
    from ortgate.graph.load import read_model

    dump = ort_dump(model, tmp_path / "opt.onnx")
    assert optimization_mismatch(build_graph(read_model(model), str(model)),
                                 build_graph(read_model(dump), str(dump))) is None
