"""GitHub workflow-command annotations: errors first, at most 10 of each type per step with one line saying
how many more, and escaping that keeps any node name or message inside its own annotation."""

from __future__ import annotations

import re

from ortgate.engine.gate import decide
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Location, Severity
from ortgate.report.github import annotation, escape_data, escape_property, render
from tests.helpers import run_cli

COMMAND = re.compile(r"^::(error|warning|notice) (?P<props>[^:]*)::(?P<message>.*)$")


def unescape(value: str) -> str:
    """The runner's decoding (actions/runner ActionCommand.Unescape...)."""
    return (value.replace("%0D", "\r").replace("%0A", "\n").replace("%3A", ":").replace("%2C", ",")
            .replace("%25", "%"))


def parse(line: str) -> tuple[str, dict[str, str], str]:
    m = COMMAND.match(line)
    assert m, line
    props = dict(p.split("=", 1) for p in m["props"].split(","))
    return m.group(1), {k: unescape(v) for k, v in props.items()}, unescape(m["message"])


def test_twelve_layers_fill_ten_error_and_ten_warning_annotations_then_say_how_many_more(make_model, write_policy):
    model = make_model(layers=12, moe="dense_loop", attention="decomposed", kv_cache=False)
    policy = write_policy("name: p\nrules:\n  severity: {gqa-not-fused: warning}\n")
    code, out, _ = run_cli("lint", model, "--policy", policy, "--select", "OGF001,OGF002", "--format", "github")
    assert code == 1
    lines = out.splitlines()
    commands = [parse(line) for line in lines if line.startswith("::")]
    kinds = [kind for kind, _, _ in commands]
    assert kinds == ["error"] * 10 + ["warning"] * 10  # the most severe first, 10 of each
    assert [props["title"] for _, props, _ in commands[:10]] == [
        f"OGF001 moe-not-fused (layer {i})" for i in range(10)]
    assert all(props["file"] == str(model) or model.name in props["file"] for _, props, _ in commands)
    assert "4 more findings not annotated (2 errors, 2 warnings)" in out
    assert lines[-1] == "ortgate: FAIL  12 errors, 12 warnings, 0 infos (fails on error and above)"


def test_config_findings_carry_file_and_line(write_policy, make_model):
    model = make_model(moe="dense_loop", kv_cache=False)
    policy = write_policy("name: p\nmodel:\n  moe_layers: 3\n")  # the graph has 2
    _, out, _ = run_cli("lint", model, "--policy", policy, "--select", "OGF001", "--format", "github")
    [config] = [parse(line) for line in out.splitlines() if "moe_layers" in line]
    assert config[1]["line"] == "3" and config[1]["file"].endswith("policy.yaml")
    assert config[2].startswith("model.moe_layers: ")


def test_escaping_keeps_hostile_names_inside_one_annotation():
    hostile = Finding(code="OGF001", rule="moe-not-fused", severity=Severity.ERROR,
                      message="100% of experts\r\n::warning file=x::forged",
                      location=Location("models/a,b:c.onnx"), node="/model/layers.0/moe\n::error::forged",
                      layer=0, fix="fuse: all, now")
    line = annotation(hostile)
    assert "\n" not in line and "\r" not in line
    kind, props, message = parse(line)
    assert kind == "error"
    assert props == {"file": "models/a,b:c.onnx", "title": "OGF001 moe-not-fused (layer 0)"}
    assert message == ("/model/layers.0/moe\n::error::forged: 100% of experts\r\n::warning file=x::forged"
                       "\nfix: fuse: all, now")


def test_escape_rules():
    assert escape_data("50%\r\n:,") == "50%25%0D%0A:,"
    assert escape_property("50%\r\n:,") == "50%25%0D%0A%3A%2C"


def test_suppressed_findings_are_counted_not_annotated():
    findings = [
        Finding(code="OGF002", rule="gqa-not-fused", severity=Severity.ERROR, message="m", location=Location("m.onnx"),
                node=f"n{i}").suppress("waiver" if i else "baseline", "why")
        for i in range(3)
    ]
    result = LintResult(findings, decide(findings, Severity.ERROR), {"model": "m.onnx"}, [])
    out = render(result)
    assert "::" not in out
    assert out.splitlines() == ["ortgate: 3 findings suppressed (1 in the baseline, 2 waived)",
                                "ortgate: PASS  0 errors, 0 warnings, 0 infos (fails on error and above)"]
