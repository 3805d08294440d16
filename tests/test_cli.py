"""The command line: commands, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ortgate.rules import all_rules
from ortgate.rules.base import REQUIRED_SECTIONS
from tests.conftest import EXAMPLES, POLICIES, REPO
from tests.helpers import run_cli, run_cli_json

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused" / "model.onnx"
FUSED = EXAMPLES / "qwen3-moe-tiny-fused"
CPU_POLICY = POLICIES / "tiny-moe-cpu.yaml"


def test_version_names_ortgate_onnxruntime_and_the_kernel_table():
    code, out, _ = run_cli("--version")
    import onnxruntime

    assert code == 0
    assert out.startswith("ortgate ")
    assert f"onnxruntime {onnxruntime.__version__}" in out
    assert "kernel table: " in out


def test_rules_lists_every_rule_with_code_name_severity_summary():
    code, out, _ = run_cli("rules")
    assert code == 0
    for r in all_rules():
        assert any(line.split()[:3] == [r.code, r.name, r.severity.label] for line in out.splitlines()), r.name


def test_the_rule_catalog_rules_and_explain_read_is_the_registered_rules():
    from ortgate.rules.catalog import CATALOG_PATH, catalog, catalog_text

    # The Bad examples' outputs are checked where the examples run (tests/test_rule_docs.py).
    outputs = {r.code: r.example_output for r in catalog()}
    assert CATALOG_PATH.read_text(encoding="utf-8") == catalog_text(all_rules(), outputs), \
        "ortgate/rules/catalog.json is stale: run python scripts/update_readme.py"


def test_rules_json():
    code, out, _ = run_cli("rules", "--format", "json")
    listed = json.loads(out)
    assert code == 0
    assert [r["code"] for r in listed] == [r.code for r in all_rules()]
    assert all(r["summary"] and r["severity"] in ("error", "warning", "info") for r in listed)


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.name)
def test_explain_shows_every_section(rule):
    for key in (rule.code, rule.name, rule.code.lower()):
        code, out, _ = run_cli("explain", key)
        assert code == 0
        assert out.startswith(f"# {rule.code} {rule.name}")
        for section in REQUIRED_SECTIONS:
            assert f"## {section}" in out


def test_explain_unknown_rule_suggests():
    code, out, err = run_cli("explain", "moe-not-fussed")
    assert code == 2 and out == ""
    assert err == "ortgate: error: unknown rule 'moe-not-fussed'; did you mean 'moe-not-fused'?\n"


def test_policy_validate(write_policy):
    code, out, _ = run_cli("policy", "validate", CPU_POLICY)
    assert code == 0 and "valid policy 'tiny-moe-cpu' (extends" in out
    bad = write_policy("name: p\nexecution_provider: {name: CUDAExecutionProvider, options: {enable_cuda_graph: [1]}}\n")
    code, out, err = run_cli("policy", "validate", bad)
    assert code == 2
    assert err.startswith(f"ortgate: error: {bad}:2: execution_provider.options.enable_cuda_graph: expected")
    assert err.count("\n") == 1


def test_lint_unfused_example_fails_the_gate():
    code, report = run_cli_json("lint", UNFUSED, "--policy", CPU_POLICY)
    assert code == 1
    assert report["verdict"]["passed"] is False
    assert {"moe-not-fused", "gqa-not-fused"} <= {f["rule"] for f in report["findings"]}


def test_lint_fused_example_passes_its_gpu_config_gate():
    code, report = run_cli_json("lint", FUSED)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert code == 0, errors
    assert report["inputs"]["genai_config"].endswith("genai_config.json")


def test_json_findings_carry_the_required_fields():
    _, report = run_cli_json("lint", UNFUSED, "--policy", CPU_POLICY)
    for f in report["findings"]:
        for key in ("code", "rule", "severity", "message", "file", "node", "op_type", "layer", "fix"):
            assert key in f
    graph_findings = [f for f in report["findings"] if f["node"]]
    assert graph_findings and all(f["file"] == str(UNFUSED) for f in graph_findings)
    assert {f["layer"] for f in graph_findings} >= {0, 1}


def test_select_and_ignore(tmp_path):
    _, only = run_cli_json("lint", UNFUSED, "--select", "moe-not-fused")
    assert {f["rule"] for f in only["findings"]} == {"moe-not-fused"}
    _, rest = run_cli_json("lint", UNFUSED, "--ignore", "OGF001,gqa-not-fused")
    assert not {"moe-not-fused", "gqa-not-fused"} & {f["rule"] for f in rest["findings"]}


def test_unknown_rule_in_select_is_an_input_error():
    code, out, err = run_cli("lint", UNFUSED, "--select", "moe-unfused")
    assert code == 2 and out == ""
    assert err.startswith("ortgate: error: --select: unknown rule 'moe-unfused'")


def test_unknown_rule_in_policy_names_file_and_line(write_policy):
    policy = write_policy("name: p\nrules:\n  ignore:\n    - moe-not-fusd\n")
    code, _, err = run_cli("lint", UNFUSED, "--policy", policy)
    assert code == 2
    assert err.startswith(f"ortgate: error: {policy}:4: unknown rule 'moe-not-fusd'; did you mean 'moe-not-fused'?")


def test_fail_on_threshold_is_inclusive(make_model, write_policy):
    # A fused model under a policy that pins no dims: its worst findings are warnings.
    model = make_model()
    policy = write_policy("name: p\nsession: {graph_optimization_level: ORT_ENABLE_ALL}\n")
    _, report = run_cli_json("lint", model, "--policy", policy)
    assert report["verdict"]["counts"]["error"] == 0 and report["verdict"]["counts"]["warning"] > 0
    assert run_cli("lint", model, "--policy", policy, "--fail-on", "error")[0] == 0
    assert run_cli("lint", model, "--policy", policy, "--fail-on", "warning")[0] == 1
    assert run_cli("lint", model, "--policy", policy, "--fail-on", "info")[0] == 1


def test_exit_zero(tmp_path):
    code, _, _ = run_cli("lint", UNFUSED, "--exit-zero")
    assert code == 0


def test_missing_model_is_one_line_exit_2(tmp_path):
    code, out, err = run_cli("lint", tmp_path / "nope.onnx")
    assert (code, out) == (2, "")
    assert err == f"ortgate: error: {tmp_path / 'nope.onnx'}: no such file or directory\n"


def test_output_never_overwrites_an_input(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text(CPU_POLICY.read_text().replace("extends: builtin:cpu", "extends: builtin:cpu"))
    before = policy.read_bytes()
    code, _, err = run_cli("lint", UNFUSED, "--policy", policy, "--output", policy)
    assert code == 2 and "refusing to write the report over an input file" in err
    assert policy.read_bytes() == before


def test_usage_error_is_one_line():
    code, _, err = run_cli("lint")
    assert code == 2 and err.startswith("ortgate: error: ") and err.count("\n") == 1


def test_console_script_runs_as_a_module():
    proc = subprocess.run([sys.executable, "-m", "ortgate", "lint", str(UNFUSED), "--format", "json"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    assert json.loads(proc.stdout)["verdict"]["passed"] is False
