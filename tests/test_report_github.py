"""GitHub workflow-command annotations: one per rule and file with the layer range, errors first, at most 10 of
each type per step with one line saying how many findings more, and escaping that keeps any node name or message
inside its own annotation."""

from __future__ import annotations

import re

from ortgate.engine.gate import decide
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Location, Severity
from ortgate.report.github import escape_data, escape_property, render, rule_annotation
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


def test_one_annotation_per_rule_and_file_carries_the_layer_range(make_model, write_policy):
    model = make_model(layers=12, moe="dense_loop", attention="decomposed", kv_cache=False)
    policy = write_policy("name: p\nrules:\n  severity: {gqa-not-fused: warning}\n")
    code, out, _ = run_cli("lint", model, "--policy", policy, "--select", "OGF001,OGF002", "--format", "github")
    assert code == 1
    lines = out.splitlines()
    commands = [parse(line) for line in lines if line.startswith("::")]
    assert [(kind, props["title"]) for kind, props, _ in commands] == [
        ("error", "OGF001 moe-not-fused: layers 0-11 (12 layers)"), ("warning", "OGF002 gqa-not-fused: layers 0-11 (12 layers)")]
    assert all(props["file"] == str(model) or model.name in props["file"] for _, props, _ in commands)
    message = commands[0][2].splitlines()
    assert message[0].startswith("layers 0-11 (12 layers): /model/layers.N/")  # the node, its layer abstracted
    assert len(message) == 2 and message[1].startswith("fix: Run `ortgate fix MODEL -o OUT`")
    assert lines[-1] == "ortgate: FAIL  12 errors, 12 warnings, 0 infos (fails on error and above)"


def test_more_than_ten_rule_annotations_of_a_type_say_how_many_findings_were_left_out():
    findings = [Finding(code=f"OGF{i:03d}", rule=f"rule-{i}", severity=Severity.ERROR, message=f"m{i}",
                        location=Location("m.onnx"), node=f"/layers.{layer}/n", layer=layer)
                for i in range(12) for layer in range(3)]
    out = render(LintResult(findings, decide(findings, Severity.ERROR), {"model": "m.onnx"}, []))
    commands = [parse(line) for line in out.splitlines() if line.startswith("::")]
    assert [props["title"] for _, props, _ in commands] == [f"OGF{i:03d} rule-{i}: layers 0-2 (3 layers)" for i in range(10)]
    assert "6 more findings not annotated (6 errors)" in out


def test_an_error_that_stops_the_model_loading_is_never_capped_away(tmp_path, write_policy):
    """A bfloat16 SplitToSequence (no kernel: ORT refuses the session) among twelve other error rules, sorted after
    them by code: it is annotated first, and its message says the session fails, not merely "no kernel"."""
    from tests.test_placement_truth import _model

    model = _model(tmp_path, "bfloat16", "bf16")
    others = [Finding(code=f"OGF{i:03d}", rule=f"rule-{i}", severity=Severity.ERROR, message=f"m{i}",
                      location=Location(model), node=f"/layers.{i}/n", layer=i) for i in range(12)]
    warning = Finding(code="OGF050", rule="warn", severity=Severity.WARNING, message="w", location=Location(model))
    from tests.helpers import lint_findings

    blocker = [f for f in lint_findings(model, select=["op-input-type"]) if f.severity is Severity.ERROR]
    assert blocker and all(f.stops_session for f in blocker)
    assert "creating the session fails" in blocker[0].message
    findings = others + [warning] + blocker
    out = render(LintResult(findings, decide(findings, Severity.ERROR), {"model": model}, []))
    commands = [parse(line) for line in out.splitlines() if line.startswith("::")]
    titles = [props["title"] for _, props, _ in commands]
    assert titles[0].startswith("OGX003 op-input-type") and len([k for k, _, _ in commands if k == "error"]) == 10
    assert "creating the session fails" in commands[0][2]
    assert any(k == "warning" for k, _, _ in commands)


def test_more_blocking_annotations_than_the_cap_are_all_said():
    blocking = [Finding(code=f"OGX{i:03d}", rule=f"refused-{i}", severity=Severity.ERROR, message=f"refused {i}",
                        location=Location("m.onnx"), node=f"/n{i}", properties=(("session_fails", True),))
                for i in range(13)]
    out = render(LintResult(blocking, decide(blocking, Severity.ERROR), {"model": "m.onnx"}, []))
    commands = [parse(line) for line in out.splitlines() if line.startswith("::")]
    assert len(commands) == 10
    assert commands[-1][1]["title"] == "4 more findings that stop the model from loading"
    assert all(f"refused {i}" in commands[-1][2] for i in range(9, 13))
    assert "not annotated" not in out


def test_different_findings_of_one_rule_share_its_annotation_fix_once():
    findings = [Finding(code="OGF005", rule="skip", severity=Severity.WARNING, message=f"{n} Adds in layer {i}",
                        location=Location("m.onnx"), node=f"/layers.{i}/add", layer=i, fix="fuse them")
                for i, n in ((0, 1), (1, 2), (2, 2), (3, 2))]
    [(kind, props, message)] = [parse(line) for line in render(LintResult(
        findings, decide(findings, Severity.ERROR), {"model": "m.onnx"}, [])).splitlines() if line.startswith("::")]
    assert props["title"] == "OGF005 skip: layers 0-3 (4 layers)"
    assert message.splitlines() == ["layer 0: /layers.0/add: 1 Adds in layer 0",
                                    "layers 1-3 (3 layers): /layers.N/add: 2 Adds in layer N", "fix: fuse them"]


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
    line = rule_annotation([hostile])
    assert "\n" not in line and "\r" not in line
    kind, props, message = parse(line)
    assert kind == "error"
    assert props == {"file": "models/a,b:c.onnx", "title": "OGF001 moe-not-fused: layer 0"}
    # the hostile newlines arrive escaped as text (\\n): the annotation's own lines are the entry and its fix
    assert message == ("layer 0: /model/layers.0/moe\\n::error::forged: 100% of experts\\r\\n::warning file=x::forged"
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
