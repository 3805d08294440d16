"""Policy loading: schema violations name the key path and the line; extends inherits then overrides."""

from __future__ import annotations

import pytest

from ortgate.config.policy import load_policy
from ortgate.errors import InputError
from tests.conftest import EXAMPLES, POLICIES
from tests.helpers import run_cli


@pytest.mark.parametrize("path", sorted(POLICIES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_policies_are_valid(path):
    policy = load_policy(path)
    assert policy.name == path.stem


def test_extends_inherits_then_overrides(write_policy):
    write_policy("name: base\nsession:\n  graph_optimization_level: ORT_ENABLE_BASIC\n"
                 "  free_dimension_overrides: {batch_size: 1}\n", "base.yaml")
    child = write_policy("name: child\nextends: base.yaml\nsession:\n  graph_optimization_level: ORT_ENABLE_ALL\n",
                         "child.yaml")
    policy = load_policy(child)
    assert policy.get("session", "graph_optimization_level") == "ORT_ENABLE_ALL"
    assert policy.get("session", "free_dimension_overrides") == {"batch_size": 1}
    # Each key remembers the file and line that set it.
    assert policy.where("session", "graph_optimization_level").file.endswith("child.yaml")
    inherited = policy.where("session", "free_dimension_overrides", "batch_size")
    assert inherited.file.endswith("base.yaml") and inherited.line == 4


def test_builtin_base(write_policy):
    policy = load_policy(write_policy("name: mine\nextends: builtin:cuda-decode\n"))
    assert policy.get("execution_provider", "options", "enable_cuda_graph") == "1"
    assert policy.name == "mine"


def _error(path) -> InputError:
    with pytest.raises(InputError) as info:
        load_policy(path)
    return info.value


def test_unknown_key_names_path_line_and_suggestion(write_policy):
    path = write_policy("name: p\nsession:\n  graph_optimisation_level: ORT_ENABLE_ALL\n")
    err = _error(path)
    assert err.line == 3
    assert "session.graph_optimisation_level: unknown key; did you mean 'graph_optimization_level'?" in err.problem


def test_wrong_type_names_key_path(write_policy):
    err = _error(write_policy("name: p\nsession:\n  free_dimension_overrides:\n    batch_size: one\n"))
    assert err.line == 4
    assert err.problem.startswith("session.free_dimension_overrides.batch_size: expected integer")


def test_enum_violation_lists_allowed_values(write_policy):
    err = _error(write_policy("name: p\nsession:\n  graph_optimization_level: MAX\n"))
    assert "'MAX' is not one of" in err.problem and "ORT_ENABLE_ALL" in err.problem


def test_name_is_required(write_policy):
    assert "'name' is a required property" in _error(write_policy("session: {}\n")).problem


def test_extends_cycle(write_policy):
    write_policy("name: a\nextends: b.yaml\n", "a.yaml")
    path = write_policy("name: b\nextends: a.yaml\n", "b.yaml")
    assert "extends cycle" in _error(path).problem


def test_extends_missing_file(write_policy):
    err = _error(write_policy("name: a\nextends: nowhere.yaml\n"))
    assert "'nowhere.yaml' does not exist" in err.problem and err.line == 2


@pytest.mark.parametrize("command", [("lint", str(EXAMPLES / "qwen3-moe-tiny-fused")), ("policy", "validate")])
def test_a_nul_byte_in_extends_is_one_line_exit_2(write_policy, command):
    """No file name holds a NUL byte; the path calls would raise ValueError on it."""
    path = write_policy('name: a\nextends: "a\\0b.yaml"\n')
    args = [*command, "--policy", path] if command[0] == "lint" else [*command, path]
    code, out, err = run_cli(*args)
    assert code == 2 and not out
    assert err.count("\n") == 1 and "NUL byte" in err and f"{path.name}:2:" in err and "internal error" not in err


def test_invalid_yaml_names_the_line(write_policy):
    err = _error(write_policy("name: p\nsession: [unclosed\n"))
    assert err.problem.startswith("invalid YAML") and err.line is not None


def test_aliases_are_refused(write_policy):
    err = _error(write_policy("name: &n p\ndescription: *n\n"))
    assert "aliases" in err.problem and err.line == 2


def test_duplicate_keys_are_refused(write_policy):
    err = _error(write_policy("name: p\nname: q\n"))
    assert "duplicate key name" in err.problem and err.line == 2
