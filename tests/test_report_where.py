"""Where a finding is, said truly: counts say what they count, a finding spanning several layers is not "outside
the decoder layers", dynamo's bare name is index 0 of its pattern, and the not-checked line names the inputs the
lint really had."""

from __future__ import annotations

from ortgate.findings import Finding, Location, Severity
from ortgate.report.groups import group_findings, where
from tests.conftest import EXPORTED
from tests.helpers import run_cli_json


def _finding(layer, node="model.layers.0.mlp.gate/MatMul", message="MoE layer computed with standard ops"):
    return Finding("OGF001", "moe-not-fused", Severity.ERROR, message, Location("m.onnx"), node=node, layer=layer)


def test_counts_name_what_they_count():
    assert where([_finding(i) for i in range(48)]) == "layers 0-47 (48 layers)"
    assert where([_finding(3), _finding(3, node="b")]) == "layer 3 (2 findings)"
    assert where([_finding(0), _finding(1), _finding(1, node="b")]) == "layers 0-1 (2 layers, 3 findings)"
    assert where([_finding(5)]) == "layer 5"


def test_a_finding_spanning_several_layers_says_which():
    spanning = _finding(None, node="/model/layers.0/moe/router",
                        message="routing differs from the policy in layers 0-1: softmax where sigmoid was declared")
    assert where([spanning]) == "across layers 0-1"
    assert where([spanning, _finding(None, node="/model/norm/Mul")]) == "across layers 0-1; outside the decoder layers"


def test_dynamo_names_form_one_pattern_with_the_bare_name_as_index_0():
    findings = [_finding(0, node="node_linear", message="router node_linear -> softmax"),
                *(_finding(i, node=f"node_linear_{7 * i}", message=f"router node_linear_{7 * i} -> softmax")
                  for i in range(1, 4))]
    [group] = group_findings(findings)
    assert group.target == "node_linear_*" and group.message == "router node_linear_* -> softmax"
    assert group.where() == "layers 0-3 (4 layers)"


def test_not_checked_names_the_genai_config_a_folder_has():
    _, report = run_cli_json("lint", EXPORTED / "genai-gpt_oss-fp32-cpu")
    reasons = [gap["reason"] for gap in report["inputs"]["not_checked"]]
    assert reasons and not any("nor genai_config.json" in r for r in reasons)
    assert any("no policy is given" in r for r in reasons)
