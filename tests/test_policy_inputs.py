"""`ortgate policy validate` runs the rules that judge a policy alone on inputs of their own type (PolicyInputs: the
policy and the session it declares, no model), and a rule that raises there is reported as lint reports one: an
info finding that it could not decide, at the policy, never a crash (exit 3)."""

from __future__ import annotations

import dataclasses

import pytest

from ortgate.engine.pipeline import STRICT_ENV
from ortgate.engine.policy_check import check_policy
from ortgate.rules import all_rules
from ortgate.rules.base import _REGISTRY
from ortgate.rules.context import NoModel, PolicyInputs
from tests.helpers import run_cli

CUDA_POLICY = "name: p\nexecution_provider: {name: CUDAExecutionProvider, options: {device_id: 0}}\n"


def _replace_check(monkeypatch, code: str, check) -> None:
    rule = next(r for r in all_rules() if r.code == code)
    assert rule.policy_only
    monkeypatch.setitem(_REGISTRY, code, dataclasses.replace(rule, check=check))


def _raises(ctx):
    raise ValueError("an odd value")


def _reads_the_model(ctx):
    return [ctx.finding("about a node", node=ctx.model.nodes[0], graph=ctx.model)]


@pytest.mark.parametrize("check, said", [
    (_raises, "could not decide: internal error ValueError: an odd value"),
    (_reads_the_model, ("could not decide: internal error NoModel: OGP002 unknown-provider-option reads a model, and "
                       "`ortgate policy validate` has none")),
], ids=["raises", "reads-the-model"])
def test_a_policy_rule_that_raises_is_reported_not_a_crash(monkeypatch, write_policy, check, said):
    monkeypatch.delenv(STRICT_ENV, raising=False)  # as a user runs it: a rule's exception is a finding
    _replace_check(monkeypatch, "OGP002", check)
    path = write_policy(CUDA_POLICY)
    code, out, err = run_cli("policy", "validate", path)
    assert code == 0, err
    assert said in out, out
    assert "Traceback" not in err and "AttributeError" not in out + err
    (problem,) = [p for p in check_policy(path).problems if p.rule == "OGP002 unknown-provider-option"]
    assert (problem.file, problem.severity, problem.refused) == (str(path), "info", False)


def test_policy_validate_gives_the_rules_policy_inputs(monkeypatch, write_policy):
    seen = []

    def look(ctx):
        seen.append(ctx.given)
        with pytest.raises(NoModel):
            _ = ctx.inputs
        return []

    _replace_check(monkeypatch, "OGP002", look)
    path = write_policy(CUDA_POLICY)
    code, _, err = run_cli("policy", "validate", path)
    assert code == 0, err
    (given,) = seen
    assert isinstance(given, PolicyInputs)
    assert given.policy.path == path and given.deployment.provider == "CUDAExecutionProvider"
