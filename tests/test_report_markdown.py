"""The markdown job summary: verdict and counts, what to fix first (errors before warnings, then the rule
whose fix clears the most findings), findings by layer, and suppressed findings with their justification."""

from __future__ import annotations

import re

from ortgate.engine.gate import decide
from ortgate.engine.pipeline import LintResult
from ortgate.findings import Finding, Location, Severity
from ortgate.report.markdown import render
from tests.helpers import run_cli


def table(markdown: str, heading: str) -> list[list[str]]:
    """The rows (cells split on unescaped pipes) of the first table after `heading`."""
    lines = markdown.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])])
        elif rows:
            break
    return rows[2:]  # without the header and the alignment row


def summary(model, policy, *extra) -> tuple[int, str]:
    code, out, err = run_cli("lint", model, "--policy", policy, "--select", "OGF001,OGF002,OGW",
                             "--format", "markdown", *extra)
    assert err == ""
    return code, out


def test_errors_rank_before_more_numerous_warnings(make_model, write_policy):
    # 4 layers: one MoE error left after the waiver, four attention findings turned into warnings.
    model = make_model(layers=4, moe="dense_loop", attention="decomposed", kv_cache=False)
    policy = write_policy("name: p\nrules:\n  severity: {gqa-not-fused: warning}\n"
                          "waivers:\n  - {rule: moe-not-fused, node: '/model/layers.[123]/*', reason: tracked}\n")
    code, md = summary(model, policy)
    assert code == 1 and md.startswith("## ❌ ortgate: FAIL\n")
    fix_first = table(md, "### What to fix first")
    assert [(row[1], row[2], row[3], row[4]) for row in fix_first] == [
        ("`OGF001` moe-not-fused", "error", "1", "layer 0"),
        ("`OGF002` gqa-not-fused", "warning", "4", "layers 0–3"),
    ]
    assert fix_first[0][5].startswith("Run `ortgate fix MODEL -o OUT`: it rewrites this block into one com.microsoft.MoE node")


def test_among_errors_the_rule_with_more_findings_ranks_first(make_model, write_policy):
    model = make_model(layers=3, moe="dense_loop", attention="decomposed", kv_cache=False)
    policy = write_policy("name: p\nwaivers:\n  - {rule: gqa-not-fused, node: '/model/layers.2/*', reason: x}\n")
    _, md = summary(model, policy)
    assert [row[1] for row in table(md, "### What to fix first")] == ["`OGF001` moe-not-fused",
                                                                      "`OGF002` gqa-not-fused"]
    policy = write_policy("name: p\nwaivers:\n  - {rule: moe-not-fused, node: '/model/layers.2/*', reason: x}\n")
    _, md = summary(model, policy)
    assert [row[1] for row in table(md, "### What to fix first")] == ["`OGF002` gqa-not-fused",
                                                                      "`OGF001` moe-not-fused"]


def test_findings_by_layer_count_each_layer_and_identical_layers_share_a_row(make_model, write_policy):
    model = make_model(layers=4, moe="dense_loop", attention="decomposed", kv_cache=False)
    policy = write_policy("name: p\nrules:\n  severity: {gqa-not-fused: info}\nmodel:\n  moe_layers: 5\n"
                          "waivers:\n  - {rule: gqa-not-fused, node: '/model/layers.2/*', reason: x}\n")
    _, md = summary(model, policy)
    rows = table(md, "### Findings by layer")
    assert rows == [
        ["layers 0–1 (2)", "1 each", "0", "1 each", "`OGF001` moe-not-fused, `OGF002` gqa-not-fused"],
        ["layer 2", "1", "0", "0", "`OGF001` moe-not-fused"],
        ["layer 3", "1", "0", "1", "`OGF001` moe-not-fused, `OGF002` gqa-not-fused"],
        ["model / config", "1", "0", "0", "`OGM008` moe-layer-count-mismatch"],
    ]
    assert "**5 errors**, 0 warnings, **3 infos**" in md
    # All findings: identical ones across layers are one row; --expand lists each.
    assert "All 8 findings as 3 rows (identical findings across layers share one)" in md
    rows = table(md, "<details><summary>All")
    assert [(r[1], r[2]) for r in rows] == [("`OGF001` moe-not-fused", "layers 0–3 (4)"),
                                            ("`OGM008` moe-layer-count-mismatch", "model / config"),
                                            ("`OGF002` gqa-not-fused", "layers 0–1, 3 (3)")]
    assert rows[0][4] == "`/model/layers.N/moe/router/MatMul`"
    code, out, _ = run_cli("lint", model, "--policy", policy, "--format", "markdown", "--expand")
    assert "<summary>All 8 findings</summary>" in out


def test_suppressed_findings_are_listed_with_their_justification(make_model, write_policy):
    model = make_model(moe="dense_loop", kv_cache=False)
    policy = write_policy("name: p\nwaivers:\n  - {rule: moe-not-fused, reason: 'kept | for now'}\n")
    code, md = summary(model, policy)
    assert code == 0 and md.startswith("## ✅ ortgate: PASS\n") and "2 suppressed" in md
    rows = table(md, "<details><summary>2 suppressed findings</summary>")
    assert [(r[0], r[1], r[4]) for r in rows] == [("`OGF001` moe-not-fused", "layer 0", "kept | for now"),
                                                  ("`OGF001` moe-not-fused", "layer 1", "kept | for now")]
    assert rows[0][3] == f"waiver ({policy}:3)"


def test_cells_escape_pipes_and_newlines():
    f = Finding(code="OGF002", rule="gqa-not-fused", severity=Severity.WARNING, message="a | b\nc",
                location=Location("m.onnx"), node="x|y", layer=2)
    md = render(LintResult([f], decide([f], Severity.ERROR), {"model": "m.onnx", "nodes": 1}, []))
    [row] = table(md, "<details><summary>All 1 finding</summary>")
    assert row == ["warning", "`OGF002` gqa-not-fused", "layer 2", "`m.onnx`", "`x|y`", "a | b\\nc"]


def test_what_stops_the_model_from_loading_is_fixed_first_and_never_capped_away():
    """Twelve error rules with many findings each, and one op-input-type finding ORT refuses the session for: it is
    the first row of "What to fix first" (capped at ten rules) and of the findings table."""
    findings = [Finding(code=f"OGF{i:03d}", rule=f"rule-{i}", severity=Severity.ERROR, message=f"m{i}",
                        location=Location("m.onnx"), node=f"/layers.{n}/n{i}", layer=n)
                for i in range(12) for n in range(3)]
    findings.append(Finding(code="OGX003", rule="op-input-type", severity=Severity.ERROR, message="refused",
                            location=Location("m.onnx"), node="/split", properties=(("session_fails", True),)))
    out = render(LintResult(findings, decide(findings, Severity.ERROR), {"model": "m.onnx"}, []))
    first = out[out.index("### What to fix first"):]
    rows = [line for line in first.splitlines() if line.startswith("| 1 |")]
    assert rows and "OGX003" in rows[0]
    assert "What stops the model from loading comes first." in first
    table = out[out.index("<details>"):]
    assert table.index("OGX003") < table.index("OGF000")
