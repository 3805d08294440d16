"""What reading an expert loop computes: a check that is the same for every expert of a layer is made once per
distinct weight signature, a value every expert reads is looked at once, and an expert unlike the others is still
named by its own index."""

from __future__ import annotations

import onnx
import pytest

from ortgate.graph import build_graph
from ortgate.graph.patterns import moe, moe_anatomy


def _graph(path, edit=None):
    model = onnx.load(str(path), load_external_data=False)
    if edit is not None:
        edit(model)
    return build_graph(model, str(path))


def _counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_expert_shapes_are_checked_once_per_distinct_weight_signature(make_model, monkeypatch):
    """Every expert of a layer has weights of the same dims and dtype: the shape check sizes expert 0's views and
    one expert's of that signature, not every expert's (it used to size 3 views of each of the E experts)."""
    graph = _graph(make_model(moe="dense_loop", gate_up="separate", experts=16, layers=2))
    sized = _counting(monkeypatch, moe_anatomy, "view_shape")
    anatomies = moe_anatomy.moe_anatomies(graph)
    assert [a.refusal for a in anatomies] == [None, None] and [len(a.experts) for a in anatomies] == [16, 16]
    assert len(sized) <= 2 * (2 + 3), len(sized)


def _initializer(model: onnx.ModelProto, *parts: str) -> onnx.TensorProto:
    found = [t for t in model.graph.initializer if all(p in t.name for p in parts)]
    assert len(found) == 1, [t.name for t in found]
    return found[0]


@pytest.mark.parametrize(("edit", "refusal"), [
    (lambda t: (t.ClearField("dims"), t.dims.extend([64, 16]), setattr(t, "raw_data", bytes(64 * 16 * 4))),
     "expert 5's projections differ in shape from expert 0's"),
    (lambda t: setattr(t, "data_type", onnx.TensorProto.FLOAT16), "expert weights and hidden state differ in dtype"),
])
def test_an_expert_unlike_the_others_is_refused_by_its_own_index(make_model, edit, refusal):
    """The verdict shared by experts alike is keyed by what the check reads (dims, dtype, orientation, rows): an
    expert whose weight differs gets its own verdict, and the refusal names it."""
    path = make_model(moe="dense_loop", gate_up="separate", experts=8, layers=1)
    graph = _graph(path, lambda m: edit(_initializer(m, "layers.0", "experts.5", "up_proj")))
    (anatomy,) = moe_anatomy.moe_anatomies(graph)
    assert anatomy.refusal == refusal


def test_the_hidden_state_every_expert_reads_is_looked_at_once_for_token_dispatch(make_model, monkeypatch):
    """Whether experts read tokens gathered for them is asked of each value they read: in a dense loop every
    expert's gate and up read the same x, looked at once per layer (it used to be once per projection)."""
    graph = _graph(make_model(moe="dense_loop", gate_up="separate", experts=16, layers=2))
    looked = _counting(monkeypatch, moe, "_selected_rows")
    blocks = moe.moe_blocks(graph)
    assert [b.expert_form for b in blocks] == [moe.ExpertForm.DENSE] * 2
    assert len(looked) == 2, len(looked)


def test_a_projection_with_no_selection_below_gets_no_routing_region(make_model, monkeypatch):
    """Every projection to a few outputs is a router candidate (attention's o_proj is one): a candidate from whose
    output no TopK / ArgMax can be reached through nodes a routing region takes in is passed over before its
    routing region is read (it used to read one for each candidate, its inputs traced up the whole residual
    stream)."""
    graph = _graph(make_model(moe="dense_loop", experts=8, layers=3))
    candidates = [n for n, _ in moe._router_candidates(graph)]
    regions = _counting(monkeypatch, moe, "_routing_region")
    blocks = moe.moe_blocks(graph)
    assert len(blocks) == 3 and len(candidates) > len(blocks)
    assert [args[1] for args in regions] == [b.router for b in blocks]


def test_a_merged_gate_up_projection_is_read_once_for_its_two_parts(make_model, monkeypatch):
    """The gate and up halves of a merged gate_up projection are two outputs of one Split of one MatMul: its weight
    view is read once per expert, with the down projection's (it used to be read for each half)."""
    graph = _graph(make_model(moe="dense_loop", gate_up="merged", experts=8, layers=2))
    viewed = _counting(monkeypatch, moe_anatomy, "_linear_view")
    anatomies = moe_anatomy.moe_anatomies(graph)
    assert [a.refusal for a in anatomies] == [None, None]
    assert all(e.gate is not None and e.gate.initializer == e.up.initializer and e.gate.rows != e.up.rows
               for a in anatomies for e in a.experts)
    assert len(viewed) == 2 * 8 * 2, len(viewed)


def test_a_merged_gate_up_read_through_its_split_is_found_without_the_upstream_walk(make_model, monkeypatch):
    """Gate and up of a merged gate_up projection are the two outputs of one Split of one MatMul: the gated-MLP
    pattern finds that MatMul for both without walking upstream (it used to walk from each of the 2 x E values),
    and finds what the walk finds."""
    from ortgate.graph.patterns import projections

    graph = _graph(make_model(moe="dense_loop", gate_up="merged", experts=8, layers=2))
    walked = _counting(monkeypatch, projections, "trace_to_projections")
    mlps = projections.gated_mlps(graph)
    assert len(mlps) == 16 and all(m.merged for m in mlps)
    assert walked == [], len(walked)
    for m in mlps:  # the walk itself, asked of the same values, names the same projection
        (gate,) = projections.trace_to_projections(graph, m.activation[0].input(0)).linears
        assert gate is m.gate


def test_a_dense_loop_s_constant_weights_are_not_searched_for_a_gathered_stack(make_model, monkeypatch):
    """Whether an expert's down projection gathers its weight from a stack by the routing is asked of its
    computed inputs only: a constant weight is no Gather's output (it used to be walked up from, once per expert)."""
    graph = _graph(make_model(moe="dense_loop", gate_up="separate", experts=16, layers=2))
    walked = _counting(monkeypatch, moe, "_gather_above")
    blocks = moe.moe_blocks(graph)
    assert [b.routed_experts_found for b in blocks] == [16, 16]
    assert [b.expert_form for b in blocks] == [moe.ExpertForm.DENSE] * 2
    assert walked and not [v for _, v in walked if graph.is_constant(v)]


def test_separate_gate_and_up_matmuls_are_read_as_linears_without_the_projection_walk(make_model, monkeypatch):
    """An expert's gate and up projections that are plain MatMuls of x are read as linears directly; the walk
    through Split / Slice / bias views is left to merged or biased projections (it used to run for every part)."""
    graph = _graph(make_model(moe="dense_loop", gate_up="separate", experts=8, layers=2))
    walked = _counting(monkeypatch, moe_anatomy, "_projection_part")
    anatomies = moe_anatomy.moe_anatomies(graph)
    assert [a.refusal for a in anatomies] == [None, None]
    assert all(e.gate is not None and e.gate.initializer != e.up.initializer for a in anatomies for e in a.experts)
    assert walked == []
