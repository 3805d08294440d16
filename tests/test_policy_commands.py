"""`ortgate policy validate` (every check lint runs on a policy, every problem at once, several files) and
`ortgate policy show` (the merged policy with each value's origin); `null` removes an inherited key."""

from __future__ import annotations

import json
import re

import yaml

from ortgate.config.policy import load_policy
from tests.conftest import EXAMPLES, POLICIES
from tests.helpers import run_cli, run_cli_json

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"


def _line_number(line: str) -> int:
    """The LINE of `ortgate: error: FILE:LINE: problem`."""
    return int(re.search(r"\.yaml:(\d+): ", line).group(1))


def test_validate_reports_every_schema_problem_at_once_in_line_order(write_policy):
    path = write_policy("name: p\n"
                        "session:\n"
                        "  graph_optimisation_level: ORT_ENABLE_ALL\n"   # 3: unknown key
                        "  intra_op_num_threads: many\n"                 # 4: wrong type
                        "execution_provider:\n"
                        "  name: CUDAExecutionProvider\n"
                        "  optionz: {}\n"                                # 7: unknown key
                        "rules: {fail_on: fatal}\n")                     # 8: enum
    code, out, err = run_cli("policy", "validate", path)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert [_line_number(line) for line in lines] == [3, 4, 7, 8], err
    assert all(line.startswith(f"ortgate: error: {path}:") for line in lines)
    assert "did you mean 'graph_optimization_level'?" in lines[0] and "fatal" in lines[3]


def test_validate_lists_unknown_rule_references_and_bad_waivers_together(write_policy):
    path = write_policy("name: p\n"
                        "rules:\n"
                        "  ignore: [moe-not-fussed]\n"
                        "waivers:\n"
                        "  - {rule: gqa-unfused, reason: x}\n"
                        "  - {rule: moe-not-fused, reason: '  ', expires: 2026-02-30}\n")
    code, out, err = run_cli("policy", "validate", path)
    assert code == 2
    lines = err.splitlines()
    numbers = [_line_number(line) for line in lines]
    assert len(lines) == 4 and numbers == sorted(numbers), err
    assert "unknown rule 'moe-not-fussed'; did you mean 'moe-not-fused'?" in err
    assert "waivers[0].rule: unknown rule 'gqa-unfused'" in err
    assert "waivers[1].reason: a waiver needs a reason" in err and "2026-02-30" in err


def test_validate_refuses_an_unknown_provider_as_lint_does(write_policy):
    path = write_policy("name: p\nexecution_provider: {name: QuantumExecutionProvider}\n")
    code, out, err = run_cli("policy", "validate", path)
    assert code == 2 and f"{path}:2: execution_provider.name: unknown execution provider" in err
    assert run_cli("lint", UNFUSED, "--policy", path)[0] == 2


def test_validate_runs_lints_policy_rules_with_the_policys_own_gate(write_policy):
    text = ("name: p\n"
            "model: {family: qwen9_moe}\n"
            "execution_provider:\n"
            "  name: CUDAExecutionProvider\n"
            "  options: {enable_cuda_graf: '1', arena_extend_strategy: kSameAsRequestedd}\n"
            "session:\n"
            "  config_entries: {session.disable_cpu_ep_fallbak: '1'}\n"
            "waivers:\n"
            "  - {rule: cuda-graph-disabled, reason: old, expires: 2020-01-01}\n")
    path = write_policy(text)
    code, out, err = run_cli("policy", "validate", path)
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert [int(line.split(":")[1]) for line in lines[:-1]] == [2, 5, 5, 7, 9], out
    assert "warning: model.family: 'qwen9_moe' is not a model family ortgate knows" in lines[0]
    assert "[OGP002 unknown-provider-option]" in out and "enable_cuda_graf" in out
    assert "[OGP003 provider-option-invalid-value]" in out and "kSameAsRequestedd" in out
    assert "[OGS007 unknown-session-config-key]" in out and "[OGW001 waiver-expired]" in out
    assert lines[-1].startswith(f"{path}: valid policy 'p'; lint reports ")
    # lint says the same about the policy
    _, report = run_cli_json("lint", UNFUSED, "--policy", path)
    assert {"OGP002", "OGP003", "OGS007", "OGW001"} <= {f["code"] for f in report["findings"]}

    ignored = write_policy(text + "rules: {ignore: [OGP, OGS007], severity: {waiver-expired: warning}}\n", "p2.yaml")
    code, out, _ = run_cli("policy", "validate", ignored)
    assert code == 0 and "OGP002" not in out and "OGS007" not in out and "warning: " in out


def test_validate_takes_several_files_and_exits_with_the_worst(write_policy):
    good = POLICIES / "tiny-moe-cpu.yaml"
    bad = write_policy("name: p\nsession: 5\n")
    code, out, err = run_cli("policy", "validate", good, bad, POLICIES / "qwen3-30b-a3b-cuda.yaml")
    assert code == 2
    assert out.splitlines() == [f"{good}: valid policy 'tiny-moe-cpu' (extends builtin:cpu)",
                                (f"{POLICIES / 'qwen3-30b-a3b-cuda.yaml'}: valid policy 'qwen3-30b-a3b-cuda' "
                                 "(extends builtin:cuda-decode)")]
    assert err == f"ortgate: error: {bad}:2: session: expected object, got int 5\n"


def test_null_removes_an_inherited_key(write_policy):
    write_policy("name: base\nextends: builtin:cuda-decode\n"
                 "session:\n  config_entries: {session.disable_cpu_ep_fallback: '1', session.intra_op.allow_spinning: '0'}\n"
                 "throughput: {device: cpu, min_tokens_per_s: 5}\n", "base.yaml")
    child = write_policy("name: child\nextends: base.yaml\n"
                         "session:\n  config_entries: {session.intra_op.allow_spinning: null}\n"
                         "throughput: null\n"
                         "execution_provider: {options: {enable_cuda_graph: null}}\n", "child.yaml")
    policy = load_policy(child)
    assert policy.get("session", "config_entries") == {"session.disable_cpu_ep_fallback": "1"}
    assert policy.get("throughput") is None and "throughput" not in policy.data
    assert policy.get("execution_provider", "options") == {} and policy.get("execution_provider", "name")
    assert policy.removed[("throughput",)].line == 5
    # a removed option is a finding of its own: CUDA graph is off again, at the child's line
    _, report = run_cli_json("lint", UNFUSED, "--policy", child, "--select", "cuda-graph-disabled")
    assert [f["file"] for f in report["findings"]] == [str(child)]


def test_null_on_a_required_key_is_an_error_at_its_line(write_policy):
    write_policy("name: base\nexecution_provider: {name: CUDAExecutionProvider}\n", "base.yaml")
    child = write_policy("name: child\nextends: base.yaml\nexecution_provider:\n  name: null\n", "child.yaml")
    code, _, err = run_cli("policy", "validate", child)
    assert code == 2 and f"{child}:4: execution_provider.name: expected string, got null" in err


def test_show_prints_the_merged_policy_with_every_values_origin(write_policy):
    base = write_policy("name: base\nextends: builtin:cuda-decode\n"
                        "session:\n  config_entries: {session.intra_op.allow_spinning: '0'}\n", "base.yaml")
    child = write_policy("name: child\nextends: base.yaml\nrunner: {past_sequence_length: 64}\n"
                         "session:\n  config_entries: {session.intra_op.allow_spinning: null}\n", "child.yaml")
    code, out, err = run_cli("policy", "show", child)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == f"# effective policy 'child': {child} <- {base} <- builtin:cuda-decode"
    origin = {line.split("#")[0].strip(): line.split("# ")[-1] for line in lines[1:] if "#" in line and ": " in line}
    assert origin["name: child"] == f"{child}:1"
    assert origin["past_sequence_length: 64"] == f"{child}:3"
    assert origin["name: CUDAExecutionProvider"].startswith("builtin:cuda-decode:")
    assert lines[-1] == f"# session.config_entries.session.intra_op.allow_spinning: removed (null) by {child}:5"
    # the printed policy is itself a policy, and the same one
    assert yaml.safe_load(out) == load_policy(child).data


def test_show_json_names_each_values_origin(write_policy):
    child = write_policy("name: child\nextends: builtin:cpu\nrunner: {iterations: 5}\n")
    code, out, _ = run_cli("policy", "show", child, "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["chain"] == [str(child), "builtin:cpu"]
    assert doc["sources"]["runner.iterations"] == {"file": str(child), "line": 3}
    assert doc["sources"]["execution_provider.name"]["file"] == "builtin:cpu"
    assert doc["policy"] == load_policy(child).data
