"""Work hidden in ONNX local functions (FunctionProto): ORT inlines a call of one into the graph, so ortgate lints
and runs the model as if the body were inlined; a function named like an op ORT implements is not what ORT runs."""

from __future__ import annotations

import onnx
import pytest
from onnx import helper

from ortgate.cli import main
from ortgate.graph import build_graph
from ortgate.graph.load import load_model
from tests.conftest import POLICIES
from tests.helpers import rule_findings, run_cli
from tests.models.qwen_moe import ModelSpec, build_model


def _wrap_in_function(model: onnx.ModelProto, select, name: str = "HiddenMoE", domain: str = "local"):
    """Move the nodes `select` picks into one local function and call it where they were."""
    graph = model.graph
    inside = [n for n in graph.node if select(n)]
    ids = {id(n) for n in inside}
    produced = {o for n in inside for o in n.output}
    inputs = list(dict.fromkeys(i for n in inside for i in n.input if i and i not in produced))
    used_outside = {i for n in graph.node if id(n) not in ids for i in n.input} | {o.name for o in graph.output}
    outputs = [o for n in inside for o in n.output if o in used_outside]
    function = helper.make_function(domain, name, inputs, outputs, inside, list(model.opset_import))
    call = helper.make_node(name, inputs, outputs, domain=domain, name="/model/layers.0/moe/call")
    first = min(i for i, n in enumerate(graph.node) if id(n) in ids)
    rest = [n for n in graph.node if id(n) not in ids]
    del graph.node[:]
    graph.node.extend(rest[:first] + [call] + rest[first:])
    model.functions.append(function)
    model.opset_import.append(helper.make_opsetid(domain, 1))
    return model


def _hidden_moe(tmp_path):
    model = _wrap_in_function(build_model(ModelSpec(moe="dense_loop")),
                              lambda n: "/layers.0/" in n.name and "moe" in n.name.lower())
    path = tmp_path / "hidden-moe.onnx"
    onnx.save(model, path)
    return path


def test_an_unfused_moe_inside_a_local_function_is_found(tmp_path):
    found = rule_findings(_hidden_moe(tmp_path), "moe-not-fused")
    assert [f.layer for f in found] == [0, 1]


def test_a_function_shadowing_a_standard_op_stays_the_op_ort_runs(tmp_path):
    """ORT runs its Relu kernel, not a local function named Relu (checked: a Sigmoid body is ignored)."""
    opsets = [helper.make_opsetid("", 17)]
    relu = helper.make_function("", "Relu", ["a"], ["b"], [helper.make_node("Sigmoid", ["a"], ["b"])], opsets)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    path = tmp_path / "shadow.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=[relu], ir_version=10), path)
    assert [n.op_type for n in build_graph(load_model(path), str(path)).nodes] == ["Relu"]


def test_recursive_local_functions_are_refused_by_lint(tmp_path, capsys):
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    f = helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("F", ["a"], ["b"], domain="local")], opsets)
    graph = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    path = tmp_path / "rec.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=[f]), path)
    assert main(["lint", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ortgate: error: {path}: local functions call each other in a cycle (local::F -> local::F)")


def test_run_does_not_take_a_local_function_for_a_custom_op(tmp_path):
    code, out, err = run_cli("run", _hidden_moe(tmp_path), "--policy", POLICIES / "tiny-moe-cpu.yaml", "--allow-cpu",
                             "--iterations", "2", "--warmup", "1")
    assert "custom ops" not in err, err
    assert code in (0, 1), (code, err)


def _doubling_functions(tmp_path, levels: int):
    """F0 is one Relu; each F(i) calls F(i-1) twice: the graph's one call of the last inlines to 2^levels nodes."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    functions = [helper.make_function("local", "F0", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])], opsets)]
    for i in range(1, levels + 1):
        body = [helper.make_node(f"F{i - 1}", ["a"], ["t"], domain="local"),
                helper.make_node(f"F{i - 1}", ["t"], ["b"], domain="local")]
        functions.append(helper.make_function("local", f"F{i}", ["a"], ["b"], body, opsets))
    graph = helper.make_graph([helper.make_node(f"F{levels}", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    path = tmp_path / "doubling.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=functions), path)
    return path


def test_functions_that_expand_exponentially_are_refused_before_inlining(tmp_path, capsys):
    """A 3 KB model whose functions each call the previous one twice: 2^30 nodes once inlined. Refused at once,
    naming the first function past the bound (2^20 nodes: F20)."""
    import time

    path = _doubling_functions(tmp_path, 30)
    assert path.stat().st_size < 4096
    start = time.monotonic()
    assert main(["lint", str(path)]) == 2
    assert time.monotonic() - start < 10
    err = capsys.readouterr().err
    assert err.startswith(f"ortgate: error: {path}: local function 'local::F20' expands to more than 1,000,000 nodes"), err
    assert err.count("\n") == 1


def test_functions_that_expand_moderately_are_inlined(tmp_path):
    path = _doubling_functions(tmp_path, 4)
    assert [n.op_type for n in build_graph(load_model(path), str(path)).nodes] == ["Relu"] * 16


def test_external_data_outside_the_folder_inside_a_local_function_is_refused(tmp_path, capsys):
    """A Constant in a function's body pointing at ../../outside.data: ORT would read it after inlining."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    value = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[4],
                             data_location=onnx.TensorProto.EXTERNAL)
    for key, text in (("location", "../../../outside.data"), ("offset", "0"), ("length", "16")):
        value.external_data.add(key=key, value=text)
    body = [helper.make_node("Constant", [], ["w"], value=value), helper.make_node("Add", ["a", "w"], ["b"])]
    f = helper.make_function("local", "F", ["a"], ["b"], body, opsets)
    graph = helper.make_graph([helper.make_node("F", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=[f]), path)
    for command in (["lint", str(path)], ["estimate", str(path), "--device", "h100-sxm"],
                    ["fix", str(path), "-o", str(tmp_path / "out"), "--dry-run"]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert err.startswith(f"ortgate: error: {path}: external data location '../../../outside.data' is outside"), err


def _one_relu_model(tmp_path, name: str, *, shadow: bool):
    """x -> y through a local function calling Relu, or through a Relu with a local function named Relu beside it
    (a step the cost model prices at no bytes and no FLOPs)."""
    opsets = [helper.make_opsetid("", 17)]
    if shadow:
        functions = [helper.make_function("", "Relu", ["a"], ["b"], [helper.make_node("Sigmoid", ["a"], ["b"])],
                                          opsets)]
        call = helper.make_node("Relu", ["x"], ["y"])
    else:
        opsets.append(helper.make_opsetid("local", 1))
        functions = [helper.make_function("local", "F", ["a"], ["b"], [helper.make_node("Relu", ["a"], ["b"])],
                                          opsets)]
        call = helper.make_node("F", ["x"], ["y"], domain="local")
    graph = helper.make_graph([call], "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])])
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=functions, ir_version=10), path)
    return path


@pytest.mark.parametrize("shadow", [False, True], ids=["local-function", "function-named-like-an-op"])
def test_run_reports_a_step_the_estimate_prices_at_nothing(tmp_path, shadow):
    """A one-Relu graph moves no bytes the cost model counts: its estimate has no ceiling, which the run report says
    instead of failing to format it."""
    path = _one_relu_model(tmp_path, "relu", shadow=shadow)
    code, out, err = run_cli("run", path, "--policy", POLICIES / "tiny-moe-cpu.yaml", "--allow-cpu", "--iterations",
                             "2", "--warmup", "1")
    assert "internal error" not in err and code in (0, 1), (code, err)
    [estimate] = [line for line in out.splitlines() if line.startswith("estimate ") and "ceiling" in line]
    assert "no ceiling (the cost model counts no bytes or FLOPs" in estimate
