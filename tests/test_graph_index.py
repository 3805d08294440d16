"""The graph index: what it holds per node, how it answers dtypes, how it leaves the cyclic collector."""

from __future__ import annotations

import gc

from onnx import TensorProto, helper

from ortgate.graph import build_graph
from ortgate.graph.index import Graph, gc_paused
from ortgate.graph.load import read_model
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "qwen3-moe-tiny-unfused" / "model.onnx"


def _held_messages(obj) -> list:
    from google.protobuf.message import Message

    return [r for r in gc.get_referents(obj) if isinstance(r, Message)]


def test_nodes_and_initializers_hold_no_protobuf_message_of_their_own():
    # A message object kept per node or weight costs memory twice (the object, and what protobuf adds to a held
    # message for every absent field read through it): the index fetches them from their lists when asked.
    graph = build_graph(read_model(EXAMPLE), str(EXAMPLE))
    assert graph.nodes and graph.initializers
    assert not [n for n in graph.nodes if _held_messages(n)]
    assert not [i for i in graph.initializers.values() if _held_messages(i)]
    model = graph.model
    for node in graph.nodes:
        assert node.graph is not None or model.graph.node[node.position] == node.proto
        assert node.proto.op_type == node.op_type and tuple(node.proto.output) == node.outputs
    for name, init in graph.initializers.items():
        assert init._proto.name == name


def _typed_graph() -> Graph:
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Cast", ["s"], ["f"], to=TensorProto.FLOAT16),
        helper.make_node("Add", ["f", "w"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [helper.make_tensor("w", TensorProto.FLOAT16, [1], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    return Graph(model, "typed.onnx")


def test_dtype_answers_the_same_before_and_after_the_table_is_settled():
    graph, fresh = _typed_graph(), _typed_graph()
    names = ["y", "s", "f", "x", "w", "unknown", ""]
    first = [graph.dtype(n) for n in names]  # the first call settles every node output
    assert first == ["float16", "int64", "float16", "float", "float16", None, None]
    assert [graph.dtype(n) for n in names] == first  # now the table's own lookup, misses included
    assert [fresh.dtype(n) for n in reversed(names)] == list(reversed(first))


def test_what_a_paused_collector_saw_allocated_is_long_lived_after():
    # Re-enabled as it was, the collector's next young-generation pass would walk every object of an index.
    gc.collect()
    was = gc.isenabled()
    gc.enable()
    try:
        with gc_paused():
            assert not gc.isenabled()
            kept = [[i] for i in range(50_000)]
        assert gc.isenabled()
        oldest = {id(o) for o in gc.get_objects(generation=2)}
        assert id(kept) in oldest and id(kept[-1]) in oldest
    finally:
        if not was:
            gc.disable()


def test_unordered_nodes_are_those_reading_a_value_not_yet_visible():
    then_ok = helper.make_graph([helper.make_node("Identity", ["a"], ["t0"], name="reads_outer")], "then", [],
                                [helper.make_tensor_value_info("t0", TensorProto.FLOAT, None)])
    else_late = helper.make_graph([helper.make_node("Identity", ["late"], ["e0"], name="reads_later")], "else", [],
                                  [helper.make_tensor_value_info("e0", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("If", ["c"], ["branch"], name="if", then_branch=then_ok, else_branch=else_late),
        helper.make_node("Add", ["a", "late"], ["sum"], name="uses_late"),
        helper.make_node("Relu", ["sum"], ["late"], name="makes_late"),
        helper.make_node("Add", ["w", "ghost"], ["y"], name="reads_nothing_defined"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                     helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [1], [0.0])])
    index = Graph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), "order.onnx")
    assert [n.name for n in index.unordered_nodes] == ["reads_later", "uses_late", "reads_nothing_defined"]
