"""The norm / rotary / attention fusions stay linear in the graph's size.

onnxscript's default rewrite rules include SlicesSplit (two Slices of one x -> one Split), a pattern with two end
nodes; onnxscript's own matcher tries every Slice of the graph as the second end of every Slice, a full walk of the
graph per candidate. ortgate's fusions look for the second end among the first one's neighbours: the same rewrites,
with work that grows with the graph, not its square.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper
from onnxscript.optimizer import optimize
from onnxscript.rewriter import _matcher

from ortgate.fix.fusions import _bounded_multi_output_matching


def _halves(pairs: int) -> onnx.ModelProto:
    """`pairs` independent halves: y_i = X + c_i; z_i = Slice(y_i, 4:8) - Slice(y_i, 0:4) on the last axis, the Slices'
    starts, ends and axes shared by all (as a deduplicated export has them)."""
    inits = [numpy_helper.from_array(np.array(v, dtype=np.int64), name) for name, v in
             (("zero", [0]), ("half", [4]), ("full", [8]), ("last", [-1]))]
    nodes, outputs = [], []
    for i in range(pairs):
        inits.append(numpy_helper.from_array(np.full((1, 8), float(i), dtype=np.float32), f"c{i}"))
        nodes.append(helper.make_node("Add", ["X", f"c{i}"], [f"y{i}"]))
        # the second half first: onnxscript's matcher tries (first, first) before (first, second), and a
        # (first half, first half) pair fails SlicesSplit's condition without trying the next pair
        nodes.append(helper.make_node("Slice", [f"y{i}", "half", "full", "last"], [f"b{i}"]))
        nodes.append(helper.make_node("Slice", [f"y{i}", "zero", "half", "last"], [f"a{i}"]))
        nodes.append(helper.make_node("Sub", [f"b{i}", f"a{i}"], [f"z{i}"]))
        outputs.append(helper.make_tensor_value_info(f"z{i}", TensorProto.FLOAT, [1, 4]))
    graph = helper.make_graph(nodes, "halves", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 8])],
                              outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _optimized(model: onnx.ModelProto, *, bounded: bool, monkeypatch) -> tuple[list[str], int]:
    """The optimized graph's op types and how many end-node combinations the two-end matcher tried."""
    tried = 0
    original = _matcher.SimplePatternMatcher._multi_match

    def counting(self, candidate, check_removable):
        nonlocal tried
        tried += 1
        return original(self, candidate, check_removable)

    monkeypatch.setattr(_matcher.SimplePatternMatcher, "_multi_match", counting)
    ir_model = ir.serde.deserialize_model(model)
    if bounded:
        with _bounded_multi_output_matching():
            optimize(ir_model)
    else:
        optimize(ir_model)
    monkeypatch.undo()
    return [node.op_type for node in ir_model.graph], tried


def test_two_end_rewrites_are_the_same_as_onnxscripts(monkeypatch):
    model = _halves(12)
    ours, _ = _optimized(model, bounded=True, monkeypatch=monkeypatch)
    theirs, _ = _optimized(model, bounded=False, monkeypatch=monkeypatch)
    assert ours == theirs
    assert ours.count("Split") == 12 and "Slice" not in ours


def test_two_end_matching_grows_linearly_with_the_graph(monkeypatch):
    pairs = 300
    ops, tried = _optimized(_halves(pairs), bounded=True, monkeypatch=monkeypatch)
    assert ops.count("Split") == pairs
    # Each Slice is paired with the Slices of its own input only (2 here), not with every Slice of the graph
    # (onnxscript's matcher: 2 * pairs candidates each, ~2 * pairs^2 = 180,000 tries).
    assert tried <= 8 * pairs, tried


def test_onnxscripts_matchers_are_back_after_the_fusions():
    from onnxscript import rewriter

    before = [rule._matcher for rule in rewriter._DEFAULT_REWRITE_RULES]
    with _bounded_multi_output_matching():
        pass
    assert [rule._matcher for rule in rewriter._DEFAULT_REWRITE_RULES] == before
