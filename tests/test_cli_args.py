"""The subcommands' flags of one concern come from one argument group (ortgate.cli.args)."""

from __future__ import annotations

import argparse

import pytest

from ortgate.cli.args import (
    GROUPS,
    REPORT_FORMATS,
    GateArgs,
    GateRequest,
    GenaiConfigArgs,
    ReleaseArgs,
    ReportArgs,
)
from ortgate.cli.main import build_parser


def _commands(parser: argparse.ArgumentParser, prefix: str = ""):
    """Every (sub)command's parser, by its command line ("lint", "policy show", ...)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{prefix}{name}", sub
                yield from _commands(sub, f"{prefix}{name} ")


def _owners(parser: argparse.ArgumentParser, flags) -> dict[str, str | None]:
    return {opt: getattr(action, "ortgate_group", None)
            for action in parser._actions for opt in action.option_strings if opt in flags}


def test_every_gate_flag_comes_from_the_gate_group():
    seen = {}
    for name, parser in _commands(build_parser()):
        owners = _owners(parser, GateArgs.FLAGS)
        if owners:
            seen[name] = owners
    assert set(seen) >= {"lint", "run"}
    # `fix` has --select/--ignore of its own: the rules whose findings it repairs, not the gate's
    assert seen.pop("fix") == {"--select": None, "--ignore": None}
    for name, owners in seen.items():
        assert owners == dict.fromkeys(GateArgs.FLAGS, "GateArgs"), name


def test_a_flag_added_by_hand_is_not_the_group_s():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-on", choices=("error", "warning", "info"))
    assert _owners(parser, GateArgs.FLAGS) == {"--fail-on": None}


@pytest.mark.parametrize("command", ["lint", "run"])
def test_gate_group_parses_into_a_request(command):
    args = build_parser().parse_args([command, "m.onnx", "--policy", "p.yaml", "--select", "a, b,,c",
                                      "--fail-on", "warning", "--baseline", "b.json", "--prune-baseline"])
    request = GateArgs.parse(args)
    assert request == GateRequest(baseline="b.json", write_baseline=None, prune_baseline=True, fail_on="warning",
                                  select=["a", "b", "c"], ignore=None, preview=False)
    with pytest.raises(AttributeError):
        request.fail_on = "error"  # type: ignore[misc]


def test_every_release_flag_comes_from_the_release_group():
    seen = {name: _owners(parser, ReleaseArgs.FLAGS) for name, parser in _commands(build_parser())}
    seen = {name: owners for name, owners in seen.items() if owners}
    assert set(seen) >= {"lint", "estimate"}
    assert all(owners == {"--ort-version": "ReleaseArgs"} for owners in seen.values()), seen


def test_groups_are_listed():
    assert GROUPS == (GateArgs, ReleaseArgs, ReportArgs, GenaiConfigArgs)
    assert ReleaseArgs.parse(build_parser().parse_args(["estimate", "--ort-version", "1.32.0"])) == ("1.32.0",)


def test_every_gate_report_format_comes_from_the_report_group():
    """lint and run take --format and --output from ReportArgs; estimate, fix, rules, upgrade and policy show have
    report formats of their own (not the gate's)."""
    seen = {name: _owners(parser, ReportArgs.FLAGS) for name, parser in _commands(build_parser())}
    from_group = {name for name, owners in seen.items() if owners and set(owners.values()) == {"ReportArgs"}}
    assert from_group == {"lint", "run"}
    for name, parser in _commands(build_parser()):
        for action in parser._actions:
            if "--format" in action.option_strings and action.choices == REPORT_FORMATS:
                assert getattr(action, "ortgate_group", None) == "ReportArgs", name


def test_every_config_flag_comes_from_the_genai_config_group():
    seen = {name: _owners(parser, GenaiConfigArgs.FLAGS) for name, parser in _commands(build_parser())}
    seen = {name: owners for name, owners in seen.items() if owners}
    assert set(seen) >= {"lint", "estimate", "run", "upgrade"}
    assert all(owners == {"--config": "GenaiConfigArgs"} for owners in seen.values()), seen
