"""Following a value through shape-only and cast ops, as far as the graph goes (graph.patterns.common).

The legacy TorchScript exporter weights each expert's output through a long chain from the top-k:
Mul <- Reshape <- Reshape <- Gather <- Flatten <- Unsqueeze <- Cast <- Div <- TopK. A walk with a fixed depth
loses the routing weight there, and with it the routed experts; these graphs are built with that chain (and
with it made longer), run on ORT, and linted.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortgate.graph import build_graph
from ortgate.graph.patterns.common import producer_through, skip_back, view_chain
from tests.helpers import rule_findings

HIDDEN, EXPERTS, TOP_K, INTER = 16, 4, 2, 8


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(7)

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def weight(self, name: str, shape: tuple[int, ...]) -> str:
        return self.const(name, (self.rng.standard_normal(shape) * 0.1).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], name: str, outputs: int = 1, **attrs) -> list[str]:
        outs = [f"{name}_out{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs


def _traced_moe_layer(b: _Builder, x: str, layer: int, extra_reshapes: int, output_views: int) -> str:
    """One MoE layer as the legacy exporter traces transformers' eager loop: per expert, the tokens routed to it
    (NonZero of Equal(indices, e)), their routing weight picked from the flattened top-k weights by row * k + slot,
    gate and up as two MatMuls, the weighted output scattered back with ScatterND(add). `extra_reshapes` lengthens
    the routing weight's chain, `output_views` puts Cast / Reshape pairs between the down projection and the Mul."""
    p = f"/model/layers.{layer}/mlp"
    logits = b.op("MatMul", [x, b.weight(f"{p}.gate.weight", (HIDDEN, EXPERTS))], f"{p}/gate/MatMul")[0]
    probs = b.op("Softmax", [logits], f"{p}/Softmax", axis=-1)[0]
    values, indices = b.op("TopK", [probs, b.const(f"{p}.k", np.array([TOP_K], np.int64))], f"{p}/TopK", 2, axis=-1)
    total = b.op("ReduceSum", [values, b.const(f"{p}.axes", np.array([-1], np.int64))], f"{p}/ReduceSum",
                 keepdims=1)[0]
    weights = b.op("Div", [values, total], f"{p}/Div")[0]
    acc = b.op("ConstantOfShape", [b.op("Shape", [x], f"{p}/Shape")[0]], f"{p}/ConstantOfShape",
               value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0]))[0]
    for e in range(EXPERTS):
        q = f"{p}/experts.{e}"
        hits = b.op("NonZero", [b.op("Equal", [indices, b.const(f"{q}.e", np.array(e, np.int64))], f"{q}/Equal")[0]],
                    f"{q}/NonZero")[0]
        token_ids = b.op("Gather", [hits, b.const(f"{q}.row", np.array(0, np.int64))], f"{q}/Gather_row", axis=0)[0]
        slots = b.op("Gather", [hits, b.const(f"{q}.col", np.array(1, np.int64))], f"{q}/Gather_col", axis=0)[0]
        flat = b.op("Add", [b.op("Mul", [token_ids, b.const(f"{q}.kk", np.array(TOP_K, np.int64))], f"{q}/Mul_idx")[0],
                            slots], f"{q}/Add_idx")[0]
        # the routing weight: Cast -> Unsqueeze -> Flatten -> Gather -> Reshape -> Reshape (-> more Reshapes)
        w = b.op("Cast", [weights], f"{q}/Cast", to=TensorProto.FLOAT)[0]
        w = b.op("Unsqueeze", [w, b.const(f"{q}.ax", np.array([-1], np.int64))], f"{q}/Unsqueeze")[0]
        w = b.op("Flatten", [w], f"{q}/Flatten", axis=0)[0]
        w = b.op("Gather", [w, flat], f"{q}/Gather_w", axis=1)[0]
        w = b.op("Reshape", [w, b.const(f"{q}.flat", np.array([-1], np.int64))], f"{q}/Reshape_0")[0]
        for i in range(extra_reshapes):
            w = b.op("Reshape", [w, b.const(f"{q}.again{i}", np.array([-1], np.int64))], f"{q}/Reshape_x{i}")[0]
        w = b.op("Reshape", [w, b.const(f"{q}.col1", np.array([-1, 1], np.int64))], f"{q}/Reshape_1")[0]
        chosen = b.op("Gather", [x, token_ids], f"{q}/Gather_x", axis=0)[0]
        gate = b.op("MatMul", [chosen, b.weight(f"{q}.gate_proj.weight", (HIDDEN, INTER))], f"{q}/gate_proj/MatMul")[0]
        up = b.op("MatMul", [chosen, b.weight(f"{q}.up_proj.weight", (HIDDEN, INTER))], f"{q}/up_proj/MatMul")[0]
        silu = b.op("Mul", [gate, b.op("Sigmoid", [gate], f"{q}/act_fn/Sigmoid")[0]], f"{q}/act_fn/Mul")[0]
        down = b.op("MatMul", [b.op("Mul", [silu, up], f"{q}/Mul")[0], b.weight(f"{q}.down_proj.weight", (INTER, HIDDEN))],
                    f"{q}/down_proj/MatMul")[0]
        for i in range(output_views):  # e.g. a mixed-precision export's casts around a reshape
            down = b.op("Cast", [down], f"{q}/Cast_out{i}", to=TensorProto.FLOAT)[0]
            down = b.op("Reshape", [down, b.const(f"{q}.rows{i}", np.array([-1, HIDDEN], np.int64))], f"{q}/Reshape_out{i}")[0]
        weighted = b.op("Mul", [down, w], f"{q}/Mul_w")[0]
        at = b.op("Unsqueeze", [token_ids, b.const(f"{q}.ax1", np.array([1], np.int64))], f"{q}/Unsqueeze_at")[0]
        acc = b.op("ScatterND", [acc, at, weighted], f"{q}/ScatterND", reduction="add")[0]
    return b.op("Add", [x, acc], f"/model/layers.{layer}/Add")[0]


def traced_moe(path, layers: int = 2, extra_reshapes: int = 0, output_views: int = 0):
    b = _Builder()
    x = "hidden_states"
    for layer in range(layers):
        x = _traced_moe_layer(b, x, layer, extra_reshapes, output_views)
    graph = helper.make_graph(
        b.nodes, "traced_moe", [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, ["tokens", HIDDEN])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["tokens", HIDDEN])], b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="pytorch")
    model.ir_version = 9
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("extra_reshapes, output_views", [(0, 0), (12, 0), (0, 3), (12, 3)])
def test_legacy_traced_routing_chain_runs_and_every_layer_is_found(tmp_path, extra_reshapes, output_views):
    path = traced_moe(tmp_path / "model.onnx", extra_reshapes=extra_reshapes, output_views=output_views)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"hidden_states": np.random.default_rng(0).standard_normal((5, HIDDEN)).astype(np.float32)})
    assert y.shape == (5, HIDDEN) and np.isfinite(y).all()

    found = rule_findings(path, "gate-up-not-merged")
    assert [f.layer for f in found] == [0, 1]
    for f in found:
        props = dict(f.properties)
        assert (props["experts_separate"], props["experts"]) == (EXPERTS, EXPERTS)
    moe = rule_findings(path, "moe-not-fused")
    assert [f.layer for f in moe] == [0, 1]
    assert all(dict(f.properties)["routed_experts"] == EXPERTS for f in moe)


def test_a_view_chain_is_followed_to_its_end_whatever_its_length(tmp_path):
    path = traced_moe(tmp_path / "model.onnx", layers=1, extra_reshapes=40)
    graph = build_graph(onnx.load(str(path)), str(path))
    weighted = next(n for n in graph.nodes if n.name == "/model/layers.0/mlp/experts.2/Mul_w")
    routing = weighted.inputs[1]
    chain = view_chain(graph, routing)
    assert len(chain) == 2 + 40 + 5  # two Reshapes, the extra ones, Gather, Flatten, Unsqueeze, Cast, then Div's output
    assert skip_back(graph, routing) == chain[-1]
    div = producer_through(graph, routing)
    assert div is not None and div.op_type == "Div"


def test_a_lookup_in_a_constant_table_and_a_real_transpose_end_the_chain(tmp_path):
    b = _Builder()
    table = b.weight("table", (10, HIDDEN))
    looked_up = b.op("Gather", [table, "ids"], "lookup", axis=0)[0]  # an embedding: a new value, not a view
    cast = b.op("Cast", [looked_up], "cast", to=TensorProto.FLOAT)[0]
    moved = b.op("Transpose", ["x"], "swap", perm=[1, 0])[0]  # [4, 3] -> [3, 4]: the data is permuted
    unit = b.op("Transpose", ["u"], "unit", perm=[1, 0, 2])[0]  # [1, 3, 4] -> [3, 1, 4]: only a size-1 dim moves
    graph_proto = helper.make_graph(
        b.nodes, "g",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [1, 3, 4])],
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, None) for v in (cast, moved, unit)], b.inits)
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph_proto, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    graph = build_graph(onnx.load(str(path)), str(path))
    assert view_chain(graph, cast) == [cast, looked_up]
    assert view_chain(graph, moved) == [moved]
    assert view_chain(graph, unit) == [unit, "u"]
