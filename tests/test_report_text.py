"""The text report scales: identical findings across layers are one entry with the layer range and count,
each fix is printed once, lines are wrapped to the width, configuration comes first and a per-rule table
ends the report. The JSON and SARIF reports keep every finding."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ortgate.engine.gate import decide
from ortgate.engine.pipeline import LintResult, LintSummary, ModelSummary
from ortgate.findings import Finding, Location, Severity
from ortgate.report.groups import group_findings, ranges
from ortgate.report.text import TextOptions, render
from tests.helpers import run_cli
from tests.models.make_examples import UNFUSED
from tests.models.qwen_moe import build_model, save_model

POLICY_48 = """name: qwen3-moe-48
extends: builtin:cpu
model:
  family: qwen3_moe
  layers: 48
  moe_layers: 48
  attention_layers: 48
  experts: 4
  top_k: 2
  num_heads: 4
  kv_num_heads: 2
  head_size: 16
"""


@pytest.fixture(scope="module")
def unfused_48(tmp_path_factory):
    """A 48-layer model as torch.onnx exports Qwen3-MoE: nothing fused, every layer alike."""
    folder = tmp_path_factory.mktemp("unfused48")
    model = save_model(build_model(replace(UNFUSED, layers=48)), folder / "model.onnx")
    policy = folder / "policy.yaml"
    policy.write_text(POLICY_48)
    return model, policy


def test_a_48_layer_unfused_model_fits_in_60_lines_and_json_and_sarif_keep_every_finding(unfused_48):
    model, policy = unfused_48
    code, text, err = run_cli("lint", model, "--policy", policy)
    assert code == 1 and err == ""
    lines = text.splitlines()
    assert len(lines) <= 60, text
    assert max(len(line) for line in lines) <= 120
    assert "layers 0-47 (48 layers)" in text and "model.layers.N.mlp.gate/MatMul" in text
    assert text.count("fix: Run `ortgate fix MODEL -o OUT`") == 1  # the fix once, at its rule's first entry

    code, out, _ = run_cli("lint", model, "--policy", policy, "--format", "json")
    findings = json.loads(out)["findings"]
    code, out, _ = run_cli("lint", model, "--policy", policy, "--format", "sarif")
    results = json.loads(out)["runs"][0]["results"]
    assert len(findings) == len(results) > 300
    moe = [f for f in findings if f["code"] == "OGF001" and f["layer"] is not None]
    assert sorted(f["layer"] for f in moe) == list(range(48))
    assert {f["node"] for f in moe} == {f"model.layers.{i}.mlp.gate/MatMul" for i in range(48)}
    # The summary table counts what JSON holds, rule by rule.
    table = {line.split()[0]: int(line.split()[3]) for line in lines if line[:3] in ("OGF", "OGS", "OGP")
             and len(line.split()) > 3 and line.split()[3].isdigit()}
    assert table == {code: sum(1 for f in findings if f["code"] == code) for code in table}
    assert sum(table.values()) == len(findings)


def test_expand_lists_every_layer(unfused_48):
    model, policy = unfused_48
    _, text, _ = run_cli("lint", model, "--policy", policy, "--select", "OGF001", "--expand")
    for layer in range(48):
        assert f"  layer {layer}  model.layers.{layer}.mlp.gate/MatMul" in text
    assert "--expand lists each one" not in text
    _, grouped, _ = run_cli("lint", model, "--policy", policy, "--select", "OGF001")
    assert "model.layers.47." not in grouped
    assert "48 findings shown as 1 entry of identical findings; --expand lists each one" in grouped


def _finding(layer, message, node, *, code="OGF004", file="m.onnx", fix="fuse it", line=None, key=None):
    return Finding(code=code, rule="rule", severity=Severity.WARNING, message=message,
                   location=Location(file, line, key), node=node, layer=layer, fix=fix)


def test_identical_means_the_same_structure_with_layer_numbers_and_node_names_abstracted():
    # transformers-style names carry the layer number; torch dynamo's opaque names carry a counter
    hf = [_finding(i, f"2 RMSNorms in layer {i} ({f'model.layers.{i}.norm/Mul'})", f"model.layers.{i}.norm/Mul")
          for i in range(4)]
    dynamo = [_finding(i, f"2 RMSNorms in layer {i} (node_Mul_{100 + 7 * i})", f"node_Mul_{100 + 7 * i}")
              for i in range(4)]
    [g_hf] = group_findings(hf)
    [g_dynamo] = group_findings(dynamo)
    assert (g_hf.count, g_hf.where()) == (4, "layers 0-3 (4 layers)")
    assert g_hf.message == "2 RMSNorms in layer N (model.layers.N.norm/Mul)" and g_hf.target == "model.layers.N.norm/Mul"
    assert g_dynamo.message == "2 RMSNorms in layer N (node_Mul_*)" and g_dynamo.target == "node_Mul_*"


def test_different_quantities_shapes_rules_or_fixes_are_not_identical():
    findings = [
        _finding(0, "1 residual Add in layer 0", "model.layers.0.add"),
        _finding(1, "2 residual Adds in layer 1", "model.layers.1.add"),
        _finding(2, "2 residual Adds in layer 2", "model.layers.2.add"),
        _finding(3, "2 residual Adds in layer 3 [64, 32]", "model.layers.3.add"),
        _finding(4, "2 residual Adds in layer 4", "model.layers.4.add", code="OGF005"),
        _finding(5, "2 residual Adds in layer 5", "model.layers.5.add", fix="another fix"),
        _finding(6, "2 residual Adds in layer 6", "model.layers.6.add"),
    ]
    groups = group_findings(findings)
    assert [[f.layer for f in g.findings] for g in groups] == [[0], [1, 2, 6], [3], [4], [5]]
    assert groups[1].where() == "layers 1-2, 6 (3 layers)"


def test_config_findings_group_only_with_exact_duplicates():
    a = _finding(None, "dim 'batch_size' has no override", None, file="p.yaml", line=4, key="overrides.batch_size")
    b = _finding(None, "dim 'sequence_length' has no override", None, file="p.yaml", line=4,
                 key="overrides.sequence_length")
    assert [g.count for g in group_findings([a, b, a])] == [2, 1]


def test_ranges():
    assert ranges([7, 0, 1, 2, 5, 8]) == "0-2, 5, 7-8"
    assert ranges([3]) == "3"


def _result(findings):
    return LintResult(findings, decide(findings, Severity.ERROR),
                      LintSummary((ModelSummary("m.onnx", nodes=10, layers=2),)), [])


def test_configuration_first_each_fix_once_and_wrapped_to_the_width():
    long_fix = "Fuse " + " ".join(f"step{i}" for i in range(60))
    findings = [_finding(i, f"norm in layer {i} " + "x" * 150, f"model.layers.{i}.n", fix=long_fix)
                for i in range(3)]
    findings.append(_finding(None, "the policy asks for something", None, file="policy.yaml", line=3,
                             key="session.x", fix=long_fix))
    text = render(_result(findings), TextOptions(width=70))
    lines = text.splitlines()
    assert lines[0] == "policy.yaml" and "m.onnx" in lines
    assert all(len(line) <= 70 for line in lines[:-1]), text  # the verdict stays one line, for scripts
    assert text.count("fix: Fuse") == 1 and "(ortgate explain OGF004)" in text
    expanded = render(_result(findings), TextOptions(width=70, expand=True))
    assert "step59" in expanded and expanded.count("fix: Fuse") == 1


def test_the_summary_table_is_rich_on_a_terminal_and_plain_text_otherwise():
    findings = [_finding(i, f"norm in layer {i}", f"model.layers.{i}.n") for i in range(3)]
    plain = render(_result(findings), TextOptions())
    colored = render(_result(findings), TextOptions(color=True))
    assert "\x1b[" not in plain and "─" not in plain
    assert "OGF004 rule  warning          3  layers 0-2 (3 layers)" in plain
    assert "\x1b[" in colored and "─" in colored


def test_where_names_the_whole_graph_for_a_finding_with_no_node_and_configuration_for_a_policy_key():
    from ortgate.report.groups import where

    model = Finding(code="OGM012", rule="kv-cache-not-fed-back", severity=Severity.ERROR, message="m",
                    location=Location("model.onnx"))
    config = Finding(code="OGS002", rule="free-dim-override-missing", severity=Severity.WARNING, message="m",
                     location=Location("policy.yaml", line=3, key_path="session.free_dimension_overrides"))
    assert where([model]) == "the whole graph"
    assert where([config]) == "configuration"
    assert where([model, model]) == "the whole graph (2 findings)"


# ---- the uncoloured report is written without rich, as rich writes it ---------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]


def _lint_result(model, policy=None):
    from ortgate.engine.gate import gate_config_from
    from ortgate.engine.pipeline import LintRequest, lint, load_inputs

    inputs = load_inputs(LintRequest(str(model), str(policy) if policy else None, None, None))
    config = gate_config_from(inputs.policy, cli_select=None, cli_ignore=None, fail_on=None)
    return lint([inputs], config)


def _real_results():
    exported = REPO_ROOT / "tests" / "fixtures" / "exported"
    policies = REPO_ROOT / "policies"
    yield _lint_result(REPO_ROOT / "examples" / "qwen3-moe-tiny-unfused", policies / "tiny-moe-cpu.yaml")
    yield _lint_result(REPO_ROOT / "examples" / "qwen3-moe-tiny-fused")
    yield _lint_result(REPO_ROOT / "examples" / "qwen3-moe-tiny-fused-cpu", policies / "qwen3-30b-a3b-cuda.yaml")
    for name in ("dynamo-qwen3_moe", "dynamo-gpt_oss", "dynamo-mixtral", "dynamo-jamba"):
        yield _lint_result(exported / name / "model.onnx", policies / "qwen3-30b-a3b-cuda.yaml")


def _hostile_results():
    """Findings whose text rich lays out in its own way: tabs, control and wide characters, words longer than a
    line, a table wider than the width."""
    texts = ["tab\there", "bell\x07and\rreturn", "wide 専門家 experts", "é accented", "word" * 40,
             "a " * 90, "  leading spaces and a very long tail " * 5, "ends with space ", "-" * 59, "x" * 61]
    for text in texts:
        findings = [_finding(i, text, f"model.layers.{i}.{text[:20]}", fix=text) for i in range(3)]
        findings.append(_finding(None, text, None, file=f"{text[:30]}.yaml", line=3, key=text[:40], fix=text))
        yield _result(findings)


@pytest.mark.parametrize("width", [60, 61, 79, 80, 100, 120, 200])
@pytest.mark.parametrize("expand", [False, True])
def test_the_plain_writer_writes_what_rich_writes(width, expand):
    from ortgate.report.text import _plain_text, _rich_text

    options = TextOptions(width=width, expand=expand)
    real = _cached_real_results()
    plain = 0
    for result in [*real, *_hostile_results()]:
        ours = _plain_text(result, options)
        if ours is None:
            assert result not in real, "a real report is written by rich"
            continue
        plain += 1
        assert [line.rstrip() for line in ours.splitlines()] == [line.rstrip() for line in
                                                                  _rich_text(result, options).splitlines()]
    assert plain > len(real), plain  # every real report, and hostile ones that are plain after all


_CACHE: list = []


def _cached_real_results():
    if not _CACHE:
        _CACHE.extend(_real_results())
    return _CACHE


@given(text=st.text(alphabet=st.sampled_from(" ab-.\u00e9"), max_size=300), width=st.integers(1, 90))
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
def test_plain_folding_is_rich_folding(text, width):
    from rich.console import Console
    from rich.text import Text

    from ortgate.report.text import _NotPlain, _PlainText

    try:
        ours = [line.plain for line in _PlainText(text).wrap(None, width, overflow="fold")]
    except _NotPlain:
        assert not text.isascii()
        return
    theirs = [line.plain for line in Text(text).wrap(Console(width=200), width, overflow="fold")]
    assert [line.rstrip() for line in ours] == [line.rstrip() for line in theirs]


CELL = st.text(alphabet=st.sampled_from("ab -.0()%"), max_size=70)


@given(rows=st.lists(st.tuples(CELL, CELL, CELL, CELL, CELL), min_size=1, max_size=6), width=st.integers(20, 140),
       headers=st.tuples(CELL, CELL, CELL, CELL, CELL).filter(lambda h: all(x.strip() for x in h)))
@settings(max_examples=400, deadline=None, derandomize=True, database=None)
def test_plain_table_is_rich_table(rows, width, headers):
    """The rule table's layout (a left column, a left, two right, a folding one), narrowed to the width as rich
    narrows it."""
    import io

    from rich.console import Console
    from rich.table import Table

    from ortgate.report.text import _NotPlain, _PlainTable

    layout = [("left", None), ("left", None), ("right", None), ("right", None), ("left", "fold")]
    ours, theirs = _PlainTable(), Table(box=None, pad_edge=False, show_edge=False, header_style="")
    for header, (justify, overflow) in zip(headers, layout):
        ours.add_column(header, justify=justify, overflow=overflow)
        theirs.add_column(header, justify=justify, **({"overflow": overflow} if overflow else {}))
    for row in rows:
        ours.add_row(*row)
        theirs.add_row(*row)
    try:
        plain = ours.lines(width)
    except _NotPlain:
        return
    buffer = io.StringIO()
    Console(file=buffer, width=width, no_color=True, highlight=False, soft_wrap=True, emoji=False,
            markup=False).print(theirs)
    assert [line.rstrip() for line in plain] == [line.rstrip() for line in buffer.getvalue().splitlines()]
