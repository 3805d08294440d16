"""Every JSON document ortgate writes is JSON: numbers that JSON cannot carry (NaN, the infinities) and numbers that
overflow a float are refused where the user wrote them, naming the key and the line."""

from __future__ import annotations

import ast
import json

import pytest

from tests.conftest import EXAMPLES, REPO
from tests.helpers import run_cli

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"


@pytest.mark.parametrize(("block", "key", "line"), [
    ("throughput:\n  device: h100-sxm\n  min_tokens_per_s: .nan\n", "throughput.min_tokens_per_s", 5),
    ("throughput:\n  device: h100-sxm\n  min_tokens_per_s: -.inf\n", "throughput.min_tokens_per_s", 5),
    ("throughput:\n  device: h100-sxm\n  max_ms_per_token: .NaN\n", "throughput.max_ms_per_token", 5),
    ("runner:\n  timeout: .inf\n", "runner.timeout", 4),
    ("session:\n  free_dimension_overrides: {batch_size: 1" + "0" * 400 + "}\n",
     "session.free_dimension_overrides.batch_size", 4),
])
def test_non_finite_and_huge_policy_numbers_are_refused_naming_key_and_line(write_policy, block, key, line):
    policy = write_policy("name: p\nextends: builtin:cpu\n" + block)
    for command in (["policy", "validate", policy], ["policy", "show", policy, "--format", "json"],
                    ["lint", UNFUSED, "--policy", policy, "--format", "json"]):
        code, out, err = run_cli(*command)
        assert code == 2 and out == "", (command, out)
        assert err.startswith(f"ortgate: error: {policy}:{line}: {key}: ") and err.count("\n") == 1, err
        assert "NaN" not in out and "Infinity" not in out


@pytest.mark.parametrize("value", [".inf", "1.0e-300", "1" + "0" * 320])
def test_a_calibration_file_with_a_number_out_of_range_is_refused(write_policy, tmp_path, value):
    (tmp_path / "calibration.yaml").write_text(f"device: cpu\nfigures:\n  bandwidth_gb_s: {value}\n  kernel_us: 0.5\n")
    policy = write_policy("name: p\nextends: builtin:cpu\nthroughput: {device: cpu, calibration: calibration.yaml}\n")
    code, out, err = run_cli("lint", UNFUSED, "--policy", policy, "--format", "json")
    assert code == 2 and out == ""
    assert err.startswith(f"ortgate: error: {tmp_path / 'calibration.yaml'}:3: figures.bandwidth_gb_s: "), err


def test_every_json_document_is_written_with_allow_nan_false():
    """A NaN that still reached a writer fails loudly (an internal error) instead of printing `NaN`."""
    unguarded = []
    for path in sorted((REPO / "ortgate").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("dump", "dumps")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "json"):
                flags = {k.arg: k.value for k in node.keywords}
                if not (isinstance(flags.get("allow_nan"), ast.Constant) and flags["allow_nan"].value is False):
                    unguarded.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not unguarded, unguarded
    with pytest.raises(ValueError):
        json.dumps(float("nan"), allow_nan=False)
