"""The graph index: what it holds per node, how it answers dtypes, how it leaves the cyclic collector."""

from __future__ import annotations

import gc
import types

import pytest
from google.protobuf.message import Message
from onnx import TensorProto, helper

from ortgate.errors import InputError
from ortgate.graph import build_graph
from ortgate.graph.index import Graph, dtype_name, gc_paused
from ortgate.graph.layers import METADATA_KEYS, layer_from_name
from ortgate.graph.load import read_model
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "qwen3-moe-tiny-unfused" / "model.onnx"


def _reachable_messages(root) -> list:
    """Protobuf messages and containers reachable from `root` (classes and modules are not followed)."""
    seen, found, todo = set(), [], [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType)):
            continue
        seen.add(id(obj))
        if type(obj).__module__.startswith("google.") or isinstance(obj, Message):
            found.append(obj)
            continue
        todo.extend(gc.get_referents(obj))
    return found


def test_the_index_holds_no_protobuf_object_so_the_parsed_model_is_freed():
    # Nodes, weights and values are read out of the protobuf when the index is built: keeping any message (or a
    # repeated field of one) would keep the whole parsed model alive, as much memory again as the index.
    for path in (EXAMPLE, *sorted((REPO / "tests" / "fixtures" / "exported").glob("*/model.onnx"))[:6]):
        graph = build_graph(read_model(path), str(path))
        assert graph.nodes and graph.initializers
        graph.unordered_nodes, [n.attributes for n in graph.nodes]  # what rules decode later
        assert not _reachable_messages(graph), path


def test_what_the_index_copies_out_is_what_the_protobuf_says():
    for path in (EXAMPLE, *sorted((REPO / "tests" / "fixtures" / "exported").glob("*/model.onnx"))):
        model = read_model(path)
        graph = build_graph(model, str(path))
        main = [n for n in graph.nodes if n.graph is None]
        assert [n.position for n in main] == list(range(len(model.graph.node)))
        for node in main:
            proto = model.graph.node[node.position]
            assert (node.name, node.op_type, node.outputs) == (proto.name, proto.op_type, tuple(proto.output))
            assert [a.SerializeToString() for a in node.attribute_protos()] == [
                a.SerializeToString() for a in proto.attribute]
            assert node.attribute_types == {a.name: a.type for a in reversed(proto.attribute)}
            scopes = [p.value for p in proto.metadata_props if p.key in METADATA_KEYS]
            assert (node.index in graph.metadata_layers) == bool(scopes)
            if scopes:
                assert graph.metadata_layers[node.index] == layer_from_name(scopes[0])
        assert graph.early_metadata_keys() == {p.key for n in model.graph.node[:64] for p in n.metadata_props}
        for t in model.graph.initializer:
            init = graph.initializers[t.name]
            assert (init.dtype, init.dims) == (dtype_name(t.data_type), tuple(t.dims))
            entries = {e.key: e.value for e in t.external_data}
            assert init.location == (entries.get("location") if t.data_location == 1 else None)


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


def test_a_weight_in_a_constant_is_summarised_without_copying_it():
    big = helper.make_tensor("w", TensorProto.FLOAT, [20000], [0.5] * 20000)  # 80 KB: a weight
    small = helper.make_tensor("s", TensorProto.INT64, [2], [3, 4])
    nodes = [helper.make_node("Constant", [], ["w"], value=big), helper.make_node("Constant", [], ["s"], value=small)]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("w", TensorProto.FLOAT, [20000])])
    g = build_graph(helper.make_model(graph), "constants.onnx")
    weight, shape = g.nodes
    assert weight._attrs._live is not None and shape._attrs._live is None  # the weight's bytes stay in the model
    assert (weight.attributes["value"].dims, weight.attributes["value"].values) == ((20000,), None)
    assert g.constant_value("s") == (3, 4) and g.dtype("w") == "float"


def _external(name: str, location: str, *, external: bool = True):
    from onnx import TensorProto, helper

    t = helper.make_tensor(name, TensorProto.FLOAT, [4], [0.0] * 4)
    t.ClearField("float_data")
    if external:
        t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    return t


def _model_with_weights(path, weights, nodes=None):
    from onnx import TensorProto, helper

    nodes = nodes or [helper.make_node("Add", [weights[0].name, weights[-1].name], ["y"])]
    graph = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
                              initializer=weights)
    path.write_bytes(helper.make_model(graph, ir_version=10).SerializeToString())
    return path


def test_indexed_read_checks_locations_on_the_index_it_hands_over(tmp_path, monkeypatch):
    """Each weight's external-data entries are read once: the index read_model_indexed builds is the one the
    locations are checked on and the one the Graph keeps."""
    from ortgate.graph import build_graph, load
    from ortgate.graph.load import read_model_indexed

    walked: list[str] = []
    all_tensors = load._all_tensors

    def tensors(model, **kwargs):
        for t in all_tensors(model, **kwargs):
            walked.append(t.name if t is not None else "|")
            yield t

    monkeypatch.setattr(load, "_all_tensors", tensors)
    path = _model_with_weights(tmp_path / "model.onnx", [_external("w", "model.onnx.data"),
                                                          _external("v", "sub/../model.onnx.data")])
    model, weights = read_model_indexed(path)
    assert weights is not None and list(weights) == ["w", "v"]
    assert walked == ["|"]  # the initializers' entries were read once, by the index
    graph = build_graph(model, str(path), initializers=weights)
    assert graph.initializers is weights and graph.external_data_files == ["model.onnx.data",
                                                                              "sub/../model.onnx.data"]
    bad = _model_with_weights(tmp_path / "bad.onnx", [_external("w", "model.onnx.data"), _external("u", "/etc/passwd"),
                                                      _external("v", "../x")])
    with pytest.raises(InputError, match=r"bad.onnx: external data location '\.\./x' is outside the model's "):
        read_model_indexed(bad)


@pytest.mark.parametrize("where", ["inline tensor", "tensor attribute"])
def test_indexed_read_still_finds_a_location_the_index_does_not_read(tmp_path, where):
    """A location entry outside the external initializers (an inline tensor's, a Constant's) is still found."""
    from onnx import helper

    from ortgate.graph.load import read_model, read_model_indexed

    if where == "inline tensor":
        path = _model_with_weights(tmp_path / "model.onnx", [_external("w", "model.onnx.data"),
                                                              _external("v", "../../etc/passwd", external=False)])
    else:
        constant = helper.make_node("Constant", [], ["c"], value=_external("c_value", "../../etc/passwd"))
        path = _model_with_weights(tmp_path / "model.onnx", [_external("w", "model.onnx.data")],
                                   [constant, helper.make_node("Add", ["w", "c"], ["y"])])
    for read in (read_model, read_model_indexed):
        with pytest.raises(InputError, match="'../../etc/passwd' is outside the model's folder"):
            read(path)


def _with_location_in_text(path, where: str) -> None:
    """Rewrite the model at `path` with the word "location" in its metadata or doc strings."""
    import onnx

    model = onnx.load(path, load_external_data=False)
    if where == "metadata":
        model.metadata_props.add(key="stub_location", value='{"location": "model.onnx.data", "location2": 1}')
    elif where == "doc strings":
        model.doc_string = "weights: see each tensor's location"
        model.graph.doc_string = "location, location"
    path.write_bytes(model.SerializeToString())


@pytest.mark.parametrize("where", ["metadata", "doc strings"])
def test_location_in_metadata_text_does_not_hide_an_escaping_constant(tmp_path, where):
    """The word "location" in the model's own strings (a producer's config dumped as JSON, a doc string) does not
    stand in for an external-data entry: a Constant's escaping location is still searched for and found."""
    from onnx import helper

    from ortgate.graph.load import read_model, read_model_indexed

    constant = helper.make_node("Constant", [], ["c"], value=_external("c_value", "../../etc/passwd"))
    path = _model_with_weights(tmp_path / "model.onnx", [_external("w", "model.onnx.data")],
                               [constant, helper.make_node("Add", ["w", "c"], ["y"])])
    _with_location_in_text(path, where)
    for read in (read_model, read_model_indexed):
        with pytest.raises(InputError, match="'../../etc/passwd' is outside the model's folder"):
            read(path)


def test_is_constant_taken_before_its_first_call_gathers_the_constants_once():
    graph = build_graph(read_model(EXAMPLE), str(EXAMPLE))
    early = graph.is_constant  # bound before the set exists, as the patterns bind it once per block
    weight = next(iter(graph.initializers))
    activation = graph.nodes[0].outputs[0]
    assert early(weight) and not early(activation)
    built = graph._constants
    assert built is not None and weight in built
    assert early(weight) and not early("no such value")
    assert graph._constants is built  # the early-bound method tests the same set, not a new one per call
    assert graph.is_constant(weight) and not graph.is_constant(activation)
