"""`ortgate lint MODEL --compare BASE_MODEL` and `ortgate estimate MODEL --compare BASE_MODEL`: the committed fused
and unfused examples compared both ways, the regression gate (throughput.max_regression), bad bases, nothing
written, the JSON comparison, SARIF baselineState against the official schema, and the markdown chart checked by a
structural parser of Mermaid's xychart-beta grammar (and by Mermaid's own renderer where it is installed)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest

from tests.conftest import EXAMPLES, REPO
from tests.helpers import run_cli

# Relative to the repository, where the tests run (reports name them so).
POLICY = Path("policies/tiny-moe-cpu.yaml")
FUSED, UNFUSED, FUSED_CPU = (Path("examples") / n for n in ("qwen3-moe-tiny-fused", "qwen3-moe-tiny-unfused",
                                                            "qwen3-moe-tiny-fused-cpu"))
PAIRS = [(UNFUSED, FUSED), (FUSED, UNFUSED), (UNFUSED, FUSED_CPU), (FUSED_CPU, UNFUSED)]


@pytest.fixture(autouse=True)
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)


def compared(model, base, *extra) -> tuple[int, dict]:
    code, out, err = run_cli("lint", model, "--policy", POLICY, "--compare", base, "--format", "json", *extra)
    assert err == "", err
    return code, json.loads(out)


def rules(findings: list[dict]) -> set[str]:
    return {f["rule"] for f in findings}


# ---- the committed pairs ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "base"), PAIRS, ids=lambda p: p.name)
def test_every_fused_unfused_pair_reports_what_appeared_disappeared_and_the_estimates_change(model, base):
    code, report = compared(model, base)
    c = report["comparison"]
    assert c["base_file"] == str(base / "model.onnx") and (EXAMPLES / base.name).is_dir()
    unfused_now = model == UNFUSED
    changed = c["appeared"] if unfused_now else c["disappeared"]
    assert {"moe-not-fused", "gqa-not-fused"} <= rules(changed)
    assert "moe-not-fused" not in rules(c["disappeared"] if unfused_now else c["appeared"])
    # every finding of the model is either new or unchanged, and the count of unchanged ones is the rest
    assert len(c["appeared"]) + c["unchanged"] == len([f for f in report["findings"]
                                                        if not f["code"].startswith("OGW")])
    est = c["estimate"]
    a = est["as_exported"]
    change = a["model"]["tokens_per_s_expected"] / a["base"]["tokens_per_s_expected"] - 1
    assert a["tokens_per_s_change"] == pytest.approx(change, abs=1e-4)
    assert (change < -0.5) if unfused_now else (change > 1.0)  # the unfused example is several times slower
    moe = next(p for p in est["components"] if p["component"] == "moe")
    assert (moe["delta_ms"] > 0) == unfused_now
    assert moe["delta_ms"] == pytest.approx(moe["model_ms"] - moe["base_ms"], abs=2e-6)
    assert [g["layers"] for g in est["layer_groups"]] in ([[0, 1]], [[0], [1]])
    assert est["layers_differ"] is None and est["memory"]["base_bytes"] > 0
    # the findings that appeared (or disappeared) with a price explain the change, costliest first
    explained = c["explained_by"]
    assert explained and {e["change"] for e in explained} == {"appeared" if unfused_now else "disappeared"}
    assert [e["ms_per_token"] for e in explained] == sorted((e["ms_per_token"] for e in explained), reverse=True)
    assert code == (1 if unfused_now else code)


def test_the_text_report_and_estimate_show_the_comparison():
    code, out, err = run_cli("lint", UNFUSED, "--policy", POLICY, "--compare", FUSED)
    assert code == 1 and err == ""
    assert "compared with examples/qwen3-moe-tiny-fused/model.onnx: 16 findings appeared, 1 disappeared" in out
    assert "  appeared    error   OGF001 moe-not-fused  layers 0-1 (2 layers)  model.layers.N.mlp.gate/MatMul" in out
    assert re.search(r"estimate  cpu: 35,571 -> 6,757 tokens/s as exported \(-81\.0%\)", out), out
    code, out, err = run_cli("estimate", UNFUSED, "--policy", POLICY, "--compare", FUSED)
    assert code == 0 and err == ""
    tail = out[out.index("compared with examples/qwen3-moe-tiny-fused/model.onnx"):]
    assert re.search(r"^    moe +\S+ us -> +\S+ us \(\+", tail, re.M), tail
    code, out, err = run_cli("estimate", UNFUSED, "--device", "h100-sxm", "--compare", FUSED, "--format", "json")
    data = json.loads(out)["comparison"]
    assert data["base"].endswith("qwen3-moe-tiny-fused/model.onnx") and data["device"] == "h100-sxm"
    assert data["as_exported"]["tokens_per_s_change"] < -0.5


def test_renamed_nodes_are_the_same_findings(tmp_path):
    # A re-export that renames every node keeps its findings (the identity baselines use has no node name).
    model = onnx.load(str(UNFUSED / "model.onnx"))
    for node in model.graph.node:
        node.name = f"{node.name}_renamed"
    onnx.save(model, str(tmp_path / "model.onnx"))
    code, report = compared(tmp_path / "model.onnx", UNFUSED)
    c = report["comparison"]
    assert c["appeared"] == [] and c["disappeared"] == [] and c["unchanged"] >= 16
    assert any("_renamed" in (f["node"] or "") for f in report["findings"])


# ---- the regression gate ---------------------------------------------------------------------------------------------


def test_a_10_percent_slower_export_fails_max_regression_and_names_why(make_model, write_policy):
    base = make_model()
    slower = make_model(qk_norm=True, control_flow=True)  # per-head q/k norms and a prompt/decode If
    gate = write_policy("name: p\nthroughput: {device: h100-sxm, context_length: 1024, max_regression: 0.05}\n")
    code, out, err = run_cli("lint", slower, "--policy", gate, "--compare", base, "--format", "json")
    report = json.loads(out)
    (found,) = [f for f in report["findings"] if f["rule"] == "throughput-regression"]
    assert code == 1 and not report["verdict"]["passed"] and found["severity"] == "error"
    change = found["properties"]["tokens_per_s_change"]
    assert -0.12 < change < -0.08
    assert f"dropped {-change:.1%} against the base {base}" in found["message"]
    assert "more than throughput.max_regression allows (5%)" in found["message"]
    # it names the components and the layers that lost the time
    assert re.search(r"Time grew in: (attention|norms|other) \+", found["message"]), found["message"]
    assert "Layers: layers 0-1 +" in found["message"]
    assert found["line"] == 2 and found["key_path"] == "throughput.max_regression"
    # a looser gate lets it pass; the faster direction never fails
    loose = write_policy("name: p\nthroughput: {device: h100-sxm, context_length: 1024, max_regression: 0.15}\n",
                         "loose.yaml")
    code, out, _ = run_cli("lint", slower, "--policy", loose, "--compare", base, "--format", "json")
    assert not [f for f in json.loads(out)["findings"] if f["rule"] == "throughput-regression"]
    code, out, _ = run_cli("lint", base, "--policy", gate, "--compare", slower, "--format", "json")
    assert not [f for f in json.loads(out)["findings"] if f["rule"] == "throughput-regression"]


def test_a_base_of_another_depth_is_said_and_the_lint_still_runs(make_model, write_policy):
    gate = write_policy("name: p\nthroughput: {device: h100-sxm, context_length: 1024, max_regression: 0.05}\n")
    code, out, err = run_cli("lint", make_model(), "--policy", gate, "--compare", make_model(layers=3),
                             "--format", "json")
    report = json.loads(out)
    (found,) = [f for f in report["findings"] if f["rule"] == "throughput-regression"]
    assert found["kind"] == "undecided" and "the base has 3 decoder layers and the model 2" in found["message"]
    assert report["comparison"]["estimate"]["layer_groups"] == []
    assert "not the same model" in report["comparison"]["estimate"]["layers_differ"]


# ---- bad input, nothing written --------------------------------------------------------------------------------------


def _tree_digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(("args", "problem"), [
    ([str(FUSED), "--compare", str(FUSED / "model.onnx")], "--compare: the base is the model itself"),
    ([str(FUSED / "model.onnx"), "--compare", str(FUSED)], "--compare: the base is the model itself"),
    ([str(FUSED), "--compare", str(POLICY)], "--compare: not an ONNX model"),
    ([str(FUSED), "--compare", "no/such/model"], "no/such/model: --compare: no such file or directory"),
    ([str(FUSED), str(UNFUSED), "--compare", str(FUSED_CPU)], "--compare compares one model with its base"),
])
@pytest.mark.parametrize("command", ["lint", "estimate"])
def test_a_bad_base_is_one_line_and_exit_2(command, args, problem):
    if command == "estimate" and len([a for a in args if not a.startswith("-")]) > 2:
        pytest.skip("estimate takes one model")
    code, out, err = run_cli(command, *args, "--policy", POLICY)
    assert code == 2 and out == ""
    assert err.startswith("ortgate: error: ") and err.count("\n") == 1 and problem in err, err


def test_nothing_is_written_beside_the_model_or_the_base(tmp_path):
    model, base = tmp_path / "model", tmp_path / "base"
    shutil.copytree(UNFUSED, model)
    shutil.copytree(FUSED, base)
    before = _tree_digest(tmp_path)
    for fmt in ("json", "sarif", "markdown", "text"):
        code, _, err = run_cli("lint", model, "--policy", POLICY, "--compare", base, "--format", fmt)
        assert code == 1, err
    assert _tree_digest(tmp_path) == before
    for target in (base / "model.onnx", base / "genai_config.json"):  # the base's files are inputs too
        code, _, err = run_cli("lint", model, "--policy", POLICY, "--compare", base, "--output", target)
        assert code == 2 and err == f"ortgate: error: {target}: refusing to write the report over an input file\n"
    assert _tree_digest(tmp_path) == before


# ---- SARIF ------------------------------------------------------------------------------------------------------------


def test_sarif_marks_new_unchanged_and_absent_results_and_stays_valid():
    from tests.test_report_sarif import validator

    code, out, err = run_cli("lint", FUSED, "--policy", POLICY, "--compare", UNFUSED, "--format", "sarif")
    log = json.loads(out)
    errors = sorted(validator().iter_errors(log), key=lambda e: list(e.path))
    assert not errors, errors[0].message
    results = log["runs"][0]["results"]
    states = {r.get("baselineState") for r in results}
    assert states <= {"new", "unchanged", "absent", None}
    absent = [r for r in results if r.get("baselineState") == "absent"]
    assert {r["ruleId"] for r in absent} >= {"OGF001", "OGF002"}
    assert all(r["kind"] == "pass" and r["level"] == "none" and "suppressions" not in r for r in absent)
    assert all(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] ==
               "examples/qwen3-moe-tiny-fused/model.onnx" for r in absent)  # named as the model's file
    new = [r for r in results if r.get("baselineState") == "new"]
    assert [r["ruleId"] for r in new] == ["OGC001"]  # the fused example's genai_config.json disagrees with the policy
    assert log["runs"][0]["properties"]["comparison"]["disappeared"] == len(absent)
    # unchanged: the same model against a renamed copy of itself would be all unchanged; here the pair with itself
    code, out, _ = run_cli("lint", UNFUSED, "--policy", POLICY, "--compare", FUSED, "--format", "sarif")
    assert {r.get("baselineState") for r in json.loads(out)["runs"][0]["results"]} == {"new", "absent"}


# ---- the markdown chart ----------------------------------------------------------------------------------------------


MERMAID_BLOCK = re.compile(r"```mermaid\n(.*?)```", re.S)
_QUOTED = r'"[^"\n]*"'


def check_xychart(block: str) -> dict:
    """Mermaid's xychart-beta grammar, the subset ortgate writes, parsed strictly: the header, a quoted title, a
    category x-axis of quoted labels, a numeric y-axis range, one bar series with a value per category within the
    range. Returns what it read; raises AssertionError on anything else."""
    lines = [line.strip() for line in block.strip().splitlines()]
    assert lines[0] in ("xychart-beta", "xychart-beta horizontal"), lines[0]
    seen: dict = {}
    for line in lines[1:]:
        if m := re.fullmatch(rf"title ({_QUOTED})", line):
            seen["title"] = m.group(1)[1:-1]
        elif m := re.fullmatch(rf"x-axis \[((?:{_QUOTED})(?:, {_QUOTED})*)\]", line):
            seen["x"] = [s[1:-1] for s in re.findall(_QUOTED, m.group(1))]
        elif m := re.fullmatch(rf"y-axis ({_QUOTED}) (-?[\d.]+) --> (-?[\d.]+)", line):
            seen["y"] = (float(m.group(2)), float(m.group(3)))
        elif m := re.fullmatch(r"bar \[(-?[\d.]+(?:, -?[\d.]+)*)\]", line):
            seen.setdefault("bars", []).append([float(v) for v in m.group(1).split(", ")])
        else:
            raise AssertionError(f"not xychart-beta: {line!r}")
    assert set(seen) == {"title", "x", "y", "bars"}, seen
    low, high = seen["y"]
    assert low < high
    for bar in seen["bars"]:
        assert len(bar) == len(seen["x"]) and all(low <= v <= high for v in bar), (bar, seen)
    return seen


def test_the_structural_check_rejects_what_mermaid_would():
    good = 'xychart-beta\n  title "t"\n  x-axis ["a", "b"]\n  y-axis "ms" 0 --> 10\n  bar [1, 2]\n'
    check_xychart(good)
    for bad in (good.replace("bar [1, 2]", "bar [1]"), good.replace('["a", "b"]', '[a b'),
                good.replace("0 --> 10", "10 --> 0"), good.replace("bar [1, 2]", "bar [1, 20]"),
                good.replace('title "t"', 'title "t"x"')):
        with pytest.raises(AssertionError):
            check_xychart(bad)


def markdown_chart(model=UNFUSED, base=FUSED) -> str:
    code, out, err = run_cli("lint", model, "--policy", POLICY, "--compare", base, "--format", "markdown")
    assert err == ""
    (block,) = MERMAID_BLOCK.findall(out)
    return block


def test_the_markdown_report_carries_the_table_and_a_chart_of_the_step_time_per_component():
    code, out, err = run_cli("lint", UNFUSED, "--policy", POLICY, "--compare", FUSED, "--format", "markdown")
    assert "### Compared with `examples/qwen3-moe-tiny-fused/model.onnx`" in out
    assert "| Findings that appeared | Rule | Layer | Where | Message |" in out
    assert "| Findings that disappeared | Rule | Layer | Where | Message |" in out
    assert "| tokens/s (expected) | 35,571 | 6,757 | -81.0% |" in out
    chart = check_xychart(markdown_chart())
    assert chart["x"][:2] == ["attention base", "attention change"] and "us, estimated on cpu" in chart["title"]
    # the chart's bars are the table's numbers
    rows = dict(re.findall(r"^\| (attention|moe) \| ([\d.]+) us \|", out, re.M))
    assert chart["bars"][0][0] == pytest.approx(float(rows["attention"]), rel=0.01)


def _mermaid_cli() -> list[str] | None:
    """Mermaid's own renderer (npm @mermaid-js/mermaid-cli, headless Chromium): ORTGATE_MMDC or mmdc on PATH,
    with a Chromium on PATH. None where either is missing."""
    mmdc = os.environ.get("ORTGATE_MMDC") or shutil.which("mmdc")
    chromium = next((p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None)
    if not mmdc or not Path(mmdc).exists() or not chromium:
        return None
    return [mmdc, chromium]


def mermaid_renders(block: str, folder: Path) -> tuple[bool, str]:
    found = _mermaid_cli()
    assert found is not None
    mmdc, chromium = found
    config = folder / "puppeteer.json"
    config.write_text(json.dumps({"executablePath": chromium, "args": ["--no-sandbox", "--disable-gpu"]}))
    source = folder / "chart.mmd"
    source.write_text(block)
    done = subprocess.run([mmdc, "-p", str(config), "-i", str(source), "-o", str(folder / "chart.svg")],
                          capture_output=True, text=True, timeout=180)
    return done.returncode == 0 and (folder / "chart.svg").is_file(), done.stderr


@pytest.mark.skipif(_mermaid_cli() is None, reason="Mermaid's renderer (mmdc and Chromium) is not installed")
def test_mermaids_own_renderer_parses_the_chart(tmp_path):
    ok, err = mermaid_renders(markdown_chart(), tmp_path)
    assert ok, err
    (tmp_path / "broken").mkdir()
    broken, _ = mermaid_renders("xychart-beta\n    x-axis [a b\n    bar [1", tmp_path / "broken")
    assert not broken  # the renderer does refuse a chart it cannot parse


# ---- the documentation -----------------------------------------------------------------------------------------------


def test_docs_compare_shows_what_the_commands_print():
    from tests.test_readme import _update_readme

    update = _update_readme()
    page = (REPO / "docs" / "compare.md").read_text()
    assert "docs/compare.md" in update.DOCS
    blocks = list(update.MARKER.finditer(page))
    assert {m.group(2).split()[1] for m in blocks} == {"lint"} and len(blocks) == 2
    for m in blocks:
        assert update.example_block(m.group(2)) == m.group(0), m.group(2)
    assert "compared with examples/qwen3-moe-tiny-fused/model.onnx: 16 findings appeared" in page
    assert "OGT006 throughput-regression" in page and "$ echo $?\n1\n" in page
    assert "[docs/compare.md](docs/compare.md)" in (REPO / "README.md").read_text()


def test_without_a_device_the_findings_are_compared_and_the_estimates_said_not_to_be():
    code, out, err = run_cli("lint", UNFUSED, "--compare", FUSED, "--format", "json")
    c = json.loads(out)["comparison"]
    assert c["estimate"] is None and c["explained_by"] == [] and "moe-not-fused" in rules(c["appeared"])
    code, out, err = run_cli("lint", UNFUSED, "--compare", FUSED)
    assert "  estimate  not compared: no device is priced (name one in the policy's throughput.device)" in out
    code, out, err = run_cli("lint", UNFUSED, "--compare", FUSED, "--format", "markdown")
    assert "Estimates not compared: no device is priced" in out and "```mermaid" not in out
