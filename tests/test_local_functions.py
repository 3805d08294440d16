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
