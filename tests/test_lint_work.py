"""What a lint computes: a rule whose precondition fails computes nothing beyond that check, and the walks that
scale with the graph are walked once."""

from __future__ import annotations

from ortgate.engine.gate import gate_config_from
from ortgate.engine.pipeline import LintRequest, lint, load_inputs
from ortgate.graph.index import Graph


def _lint(path, select: list[str]):
    inputs = load_inputs(LintRequest(str(path)))
    result = lint(inputs, gate_config_from(None, cli_select=select, cli_ignore=None, fail_on=None))
    return inputs.model, result.findings


def _computed(graph: Graph) -> set[str]:
    return set(graph.__dict__.get("_pattern_cache", {}))


def test_gate_up_not_merged_finds_no_gated_mlps_in_a_graph_without_an_expert_loop(make_model):
    """OGF008 looks for separate gate and up projections inside expert loops: a dense model (whose MLPs have them)
    has none, no MoE layer at all, so the rule's need `moe` is unmet and its body never runs."""
    graph, findings = _lint(make_model(moe="dense", gate_up="separate", norm="fused"), ["gate-up-not-merged"])
    assert findings == []
    assert "gated_mlps" not in _computed(graph)  # tests/test_graph_needs.py: the body itself is not called


def test_gate_up_not_merged_still_finds_separate_projections_in_an_expert_loop(make_model):
    graph, findings = _lint(make_model(moe="dense_loop", gate_up="separate"), ["gate-up-not-merged"])
    assert [f.rule for f in findings] == ["gate-up-not-merged"] * 2 and "gated_mlps" in _computed(graph)


def test_op_input_type_walks_the_contracted_inputs_once(make_model, monkeypatch):
    """op-input-type's untyped inputs and its violations come from one pass over the contracted nodes' inputs."""
    import ortgate.rules.contracts as contracts

    walks = []
    real = contracts._contracted

    def counting(graph):
        walks.append(1)
        return real(graph)

    monkeypatch.setattr(contracts, "_contracted", counting)
    _lint(make_model(moe="dense_loop", layers=2), ["op-input-type"])
    assert len(walks) == 1


def test_the_sum_of_the_experts_is_found_without_revisiting_every_value_per_expert(make_model, monkeypatch):
    """The routed sum over E experts is a chain of E - 1 Adds: finding where it ends looks at the consumers of each
    value once (it used to look at all of them again for every Add that joined: quadratic in the experts)."""
    from ortgate.graph.patterns import moe_anatomy

    calls = []
    real = moe_anatomy._combine_end

    def counting(graph, muls):
        before = len(calls)
        original = graph.consumers

        def consumers(value):
            calls.append(value)
            return original(value)

        graph.consumers = consumers
        try:
            return real(graph, muls)
        finally:
            del graph.consumers
            counted.append((len(muls), len(calls) - before))

    counted: list[tuple[int, int]] = []
    monkeypatch.setattr(moe_anatomy, "_combine_end", counting)
    _lint(make_model(moe="dense_loop", experts=32, layers=1), ["moe-not-fused"])
    assert counted, "no expert loop was read"
    for experts, looked in counted:
        assert experts == 32 and looked <= 3 * experts, (experts, looked)


def test_a_rule_whose_declared_need_is_unmet_is_not_run(make_model):
    """The engine skips a rule whose `needs` the inputs lack (no policy: no session), and runs it once they have
    them: what the rule would compute on such inputs is never computed."""
    import dataclasses

    from ortgate.engine.pipeline import run_rules
    from ortgate.rules import all_rules
    from tests.conftest import REPO

    rule = next(r for r in all_rules() if r.code == "OGS001")
    calls = []

    def spy(ctx):
        calls.append(ctx.inputs.policy)
        return rule.check(ctx)

    counted = dataclasses.replace(rule, check=spy)
    model = make_model(moe="dense")
    run_rules(load_inputs(LintRequest(str(model))), [counted])
    assert calls == []
    run_rules(load_inputs(LintRequest(str(model), str(REPO / "policies" / "tiny-moe-cpu.yaml"))), [counted])
    assert len(calls) == 1
