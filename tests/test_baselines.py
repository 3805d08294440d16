"""Baselines that survive a re-export: fingerprints by rule, the model's path relative to the working directory,
layer and the structure of the match (never a node name), stale entries reported and pruned, one model's baseline
never accepting another's findings, version-2 and version-1 files still loading."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import onnx
import pytest

from tests.conftest import EXAMPLES, EXPORTED, POLICIES, REPO
from tests.helpers import run_cli, run_cli_json

DYNAMO = EXPORTED / "dynamo-qwen3_moe"
UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"
CPU_POLICY = POLICIES / "tiny-moe-cpu.yaml"
# Written by the previous ortgate (baseline version 1, node names in every identity) for UNFUSED + CPU_POLICY.
V1_BASELINE = REPO / "tests" / "data" / "baselines" / "v1-qwen3-moe-tiny-unfused.json"


def renumbered(source: Path, folder: Path, shift: int = 1000) -> Path:
    """`source` as another torch dynamo export of the same model would name it: every node's number shifted
    (node_mul_572 -> node_mul_1572), its own name scope too, written as `folder`/model.onnx."""
    model = onnx.load(str(source / "model.onnx"), load_external_data=False)
    for node in model.graph.node:
        node.name = re.sub(r"(\d+)$", lambda m: str(int(m.group(1)) + shift), node.name) or node.name
        node.name = node.name if node.name[-1].isdigit() else f"{node.name}_{shift}"
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                scopes = json.loads(prop.value.replace("'", '"'))
                scopes[-1] = node.name
                prop.value = json.dumps(scopes).replace('"', "'")
    folder.mkdir()
    for extra in source.iterdir():
        if extra.name != "model.onnx":
            shutil.copy(extra, folder / extra.name)
    onnx.save(model, str(folder / "model.onnx"))
    return folder


def lint_json(*args) -> tuple[int, dict]:
    return run_cli_json("lint", *args)


def active(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["suppressed"] is None]


def test_a_baseline_survives_a_re_export_that_renames_every_node(tmp_path):
    baseline = tmp_path / "baseline.json"
    work = tmp_path / "model"
    shutil.copytree(DYNAMO, work)
    code, before = lint_json(work, "--write-baseline", baseline)
    assert code == 0 and before["findings"]
    shutil.rmtree(work)
    again = renumbered(DYNAMO, work)  # the re-export replaces the model where it was
    code, after = lint_json(again, "--baseline", baseline)
    renamed = {f["node"] for f in after["findings"] if f["node"]}
    assert renamed and not renamed & {f["node"] for f in before["findings"]}  # no node kept its name
    assert code == 0 and active(after) == []
    assert after["verdict"]["suppressed_by"] == {"baseline": len(before["findings"])}
    assert sorted(f["fingerprint"] for f in after["findings"]) == sorted(f["fingerprint"] for f in before["findings"])


def test_a_baseline_from_one_naming_style_covers_another(make_model, tmp_path):
    spec = dict(layers=3, moe="dense_loop", attention="decomposed", rotary="decomposed", norm="decomposed")
    hf = make_model("hf", naming="hf", **spec)
    opaque = make_model("opaque", naming="opaque", **spec)
    hf = hf.rename(tmp_path / "model.onnx")
    baseline = tmp_path / "baseline.json"
    code, written = lint_json(hf, "--write-baseline", baseline)
    assert code == 0 and len(written["findings"]) > 6
    opaque = opaque.replace(tmp_path / "model.onnx")  # re-exported with the other naming, at the same path
    code, report = lint_json(opaque, "--baseline", baseline)
    assert code == 0 and active(report) == []


def test_every_finding_has_its_own_fingerprint():
    for model in (DYNAMO, UNFUSED, EXPORTED / "genai-qwen3_5_moe-fp32-cpu"):
        _, report = lint_json(model, "--policy", CPU_POLICY)
        prints = [f["fingerprint"] for f in report["findings"]]
        assert len(prints) == len(set(prints)), model
        assert not any(f["node"] and f["node"] in f["fingerprint"] for f in report["findings"])


def test_fingerprints_tell_apart_identical_matches_in_one_layer(make_model, tmp_path):
    """A policy naming the wrong head counts: OGM002 reports each GroupQueryAttention attribute on the same node."""
    model = make_model(layers=2, attention="gqa", rotary="gqa", num_heads=4, kv_num_heads=2)
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nmodel: {num_heads: 8, kv_num_heads: 4}\n")
    _, report = lint_json(model, "--policy", policy, "--select", "gqa-config-mismatch")
    per_node = [f for f in report["findings"] if f["node"] == report["findings"][0]["node"]]
    assert len(per_node) >= 2 and {f["layer"] for f in per_node} == {None}  # each names both layers' nodes
    assert len({f["fingerprint"] for f in per_node}) == len(per_node)


def test_stale_entries_are_info_findings_at_their_line_and_prune_removes_them(make_model, tmp_path):
    spec = dict(moe="dense_loop", attention="decomposed", kv_cache=False)
    three = make_model(layers=3, **spec).rename(tmp_path / "model.onnx")
    baseline = tmp_path / "baseline.json"
    assert run_cli("lint", three, "--select", "OGF001,OGF002,OGW", "--write-baseline", baseline)[0] == 0
    two = make_model(layers=2, **spec).replace(tmp_path / "model.onnx")  # the next version of the model
    code, report = lint_json(two, "--select", "OGF001,OGF002,OGW", "--baseline", baseline)
    stale = [f for f in report["findings"] if f["rule"] == "baseline-entry-stale"]
    assert code == 0 and len(stale) == 2  # layer 2's moe-not-fused and gqa-not-fused are gone
    assert all(f["severity"] == "info" and f["file"] == str(baseline) and f["line"] for f in stale)
    lines = baseline.read_text().splitlines()
    assert all('"layer": 2' in "".join(lines[f["line"] - 1:f["line"] + 8]) for f in stale)
    assert "--prune-baseline" in stale[0]["fix"]

    code, pruned = lint_json(two, "--select", "OGF001,OGF002,OGW", "--baseline", baseline, "--prune-baseline")
    assert code == 0 and not [f for f in pruned["findings"] if f["rule"] == "baseline-entry-stale"]
    entries = json.loads(baseline.read_text())["findings"]
    assert len(entries) == 4 and {e["layer"] for e in entries} == {0, 1}


def test_entries_of_rules_that_did_not_run_are_neither_stale_nor_pruned(make_model, tmp_path):
    model = make_model(layers=2, moe="dense_loop", attention="decomposed", kv_cache=False)
    baseline = tmp_path / "baseline.json"
    run_cli("lint", model, "--select", "OGF001,OGF002", "--write-baseline", baseline)
    code, report = lint_json(model, "--select", "OGF001,OGW", "--baseline", baseline, "--prune-baseline")
    assert code == 0 and not [f for f in report["findings"] if f["rule"] == "baseline-entry-stale"]
    assert {e["rule"] for e in json.loads(baseline.read_text())["findings"]} == {"moe-not-fused", "gqa-not-fused"}


def test_a_version_1_baseline_still_loads_and_prune_rewrites_it_as_the_current_version(tmp_path):
    baseline = tmp_path / "baseline.json"
    shutil.copy(V1_BASELINE, baseline)
    code, report = lint_json(UNFUSED, "--policy", CPU_POLICY, "--baseline", baseline)
    assert code == 0 and active(report) == []  # every finding matched by its version-1 identity
    code, report = lint_json(UNFUSED, "--policy", CPU_POLICY, "--baseline", baseline, "--prune-baseline")
    assert code == 0 and active(report) == []
    doc = json.loads(baseline.read_text())
    assert doc["version"] == 4 and all("fingerprint" in e and "identity" not in e for e in doc["findings"])
    assert len(doc["findings"]) == len(json.loads(V1_BASELINE.read_text())["findings"])


def test_a_version_1_baseline_loses_renamed_nodes_and_says_how_to_migrate(tmp_path):
    renamed = tmp_path / "model"
    renamed.mkdir()
    model = onnx.load(str(UNFUSED / "model.onnx"))
    for i, node in enumerate(model.graph.node):
        node.name = f"node_{node.op_type}_{i}"
    onnx.save(model, str(renamed / "model.onnx"))
    code, report = lint_json(renamed, "--policy", CPU_POLICY, "--baseline", V1_BASELINE)
    stale = [f for f in report["findings"] if f["rule"] == "baseline-entry-stale"]
    assert code == 1 and stale and "version 1" in stale[0]["message"]


def test_a_baseline_from_a_newer_ortgate_is_an_input_error(tmp_path):
    path = tmp_path / "b.json"
    path.write_text('{"format": "ortgate-baseline", "version": 5, "findings": []}')
    code, out, err = run_cli("lint", UNFUSED, "--baseline", path)
    assert code == 2 and "newer ortgate" in err and err.count("\n") == 1


@pytest.mark.parametrize("args, problem", [
    (["--prune-baseline"], "give --baseline"),
    (["--baseline", str(V1_BASELINE), "--prune-baseline", "--write-baseline", "x.json"], "use one"),
])
def test_prune_baseline_usage_errors(args, problem):
    code, out, err = run_cli("lint", UNFUSED, *args)
    assert code == 2 and out == "" and problem in err


# ---- one baseline per model: two models of one file name never share an entry -------------------------------------


def _two_models_named_alike(tmp_path: Path) -> tuple[Path, Path]:
    for name in ("a", "b"):
        shutil.copytree(UNFUSED, tmp_path / name)
    return tmp_path / "a", tmp_path / "b"


def test_a_baseline_of_one_model_never_accepts_another_models_findings(tmp_path):
    a, b = _two_models_named_alike(tmp_path)
    baseline = tmp_path / "baseline.json"
    assert run_cli("lint", a, "--policy", CPU_POLICY, "--write-baseline", baseline)[0] == 0  # all accepted
    code, report = lint_json(a, b, "--policy", CPU_POLICY, "--baseline", baseline)
    assert code == 1
    still = {f["file"] for f in active(report) if f["file"].endswith(".onnx")}
    assert still == {str(b / "model.onnx")}  # a's findings accepted, b's all reported
    doc = json.loads(baseline.read_text())
    assert doc["version"] == 4 and {e["file"] for e in doc["findings"]} >= {(a / "model.onnx").as_posix()}


def test_fingerprints_name_the_path_relative_to_the_working_directory(tmp_path, monkeypatch):
    a, b = _two_models_named_alike(tmp_path)
    monkeypatch.chdir(tmp_path)
    _, report = lint_json("a", "b", "--policy", CPU_POLICY, "--select", "moe-not-fused")
    prints = {f["file"]: f["fingerprint"] for f in report["findings"] if f["layer"] == 0}
    assert prints["a/model.onnx"] == "moe-not-fused|a/model.onnx|0|model:MatMul#0"
    assert prints["b/model.onnx"] == "moe-not-fused|b/model.onnx|0|model:MatMul#0"
    _, again = lint_json("./a/model.onnx", "--policy", CPU_POLICY, "--select", "moe-not-fused")
    assert {f["fingerprint"] for f in again["findings"]} == {f["fingerprint"] for f in report["findings"]
                                                            if f["file"] == "a/model.onnx"}
    code, out, _ = run_cli("lint", "a", "b", "--policy", CPU_POLICY, "--select", "moe-not-fused", "--format", "sarif")
    results = json.loads(out)["runs"][0]["results"]
    sarif = {r["partialFingerprints"]["ortgate/v3"] for r in results}
    assert len(sarif) == len(results) == 4  # 2 layers x 2 models: no two collide


def test_a_version_2_baseline_still_matches_by_file_name_and_says_so(tmp_path):
    a, b = _two_models_named_alike(tmp_path)
    baseline = tmp_path / "baseline.json"
    run_cli("lint", a, "--policy", CPU_POLICY, "--write-baseline", baseline)
    doc = json.loads(baseline.read_text())
    doc["version"] = 2  # as the previous ortgate wrote it: the file's name alone
    for e in doc["findings"]:
        rule, file, rest = e["fingerprint"].split("|", 2)
        e["fingerprint"], e["file"] = f"{rule}|{Path(file).name}|{rest}", Path(file).name
    baseline.write_text(json.dumps(doc))
    code, report = lint_json(b, "--policy", CPU_POLICY, "--baseline", baseline)
    assert code == 0 and [f["rule"] for f in active(report)] == ["baseline-entry-stale"]
    [note] = active(report)
    assert note["severity"] == "info" and "version 2" in note["message"] and "every model of that name" in note["message"]
    code, report = lint_json(b, "--policy", CPU_POLICY, "--baseline", baseline, "--prune-baseline")
    doc = json.loads(baseline.read_text())
    assert doc["version"] == 4 and all(e["file"] == (b / "model.onnx").as_posix() for e in doc["findings"]
                                       if e["file"].endswith(".onnx"))


# ---- every entry names the model it was written for -----------------------------------------------------------


def _two_models_and_a_policy(tmp_path, monkeypatch, make_model):
    monkeypatch.chdir(tmp_path)
    for name, layers in (("a", 2), ("b", 1)):
        folder = tmp_path / "models" / name
        folder.mkdir(parents=True)
        shutil.move(str(make_model(layers=layers)), folder / "model.onnx")
    (tmp_path / "p.yaml").write_text("name: p\nexecution_provider:\n  name: cpu\nmodel:\n  moe_layers: 48\n"
                                     "  attention_layers: 48\n")
    return "models/a", "models/b", "p.yaml"


def test_a_baseline_written_for_one_model_never_suppresses_anothers_findings(tmp_path, monkeypatch, make_model):
    a, b, policy = _two_models_and_a_policy(tmp_path, monkeypatch, make_model)
    assert lint_json(a, "--policy", policy, "--write-baseline", "bl.json")[0] == 0
    entries = json.loads(Path("bl.json").read_text())["findings"]
    mismatch = [e for e in entries if e["rule"] == "moe-layer-count-mismatch"]
    assert mismatch and all(e["model"] == "models/a/model.onnx" and e["file"] == "p.yaml" for e in mismatch)
    assert all(e.get("model") == "models/a/model.onnx" for e in entries)
    code, report = lint_json(b, "--policy", policy, "--baseline", "bl.json")
    assert code == 1
    assert {"moe-layer-count-mismatch", "attention-layer-count-mismatch"} <= {f["rule"] for f in active(report)}
    stale = [f for f in report["findings"] if f["rule"] == "baseline-entry-stale"]
    assert not stale, stale  # a's entries were not judged: a was not linted
    assert lint_json(a, "--policy", policy, "--baseline", "bl.json")[0] == 0


def test_a_baseline_of_two_models_accepts_each_ones_findings_in_it_only(tmp_path, monkeypatch, make_model):
    a, b, policy = _two_models_and_a_policy(tmp_path, monkeypatch, make_model)
    assert lint_json(a, b, "--policy", policy, "--write-baseline", "bl.json")[0] == 0
    models = {e.get("model") for e in json.loads(Path("bl.json").read_text())["findings"]
              if e["rule"] == "moe-layer-count-mismatch"}
    assert models == {"models/a/model.onnx", "models/b/model.onnx"}
    assert lint_json(b, "--policy", policy, "--baseline", "bl.json")[0] == 0


def test_a_version_3_baseline_still_loads_its_entries_accepting_any_model_and_lint_says_so(tmp_path, monkeypatch,
                                                                                            make_model):
    a, b, policy = _two_models_and_a_policy(tmp_path, monkeypatch, make_model)
    assert lint_json(a, "--policy", policy, "--write-baseline", "bl.json")[0] == 0
    doc = json.loads(Path("bl.json").read_text())
    doc["version"] = 3
    for entry in doc["findings"]:
        entry.pop("model", None)
    Path("v3.json").write_text(json.dumps(doc))
    code, report = lint_json(b, "--policy", policy, "--baseline", "v3.json")
    notes = [f for f in report["findings"] if f["rule"] == "baseline-entry-stale" and "name no model" in f["message"]]
    assert notes and notes[0]["severity"] == "info", report["findings"]
    assert "moe-layer-count-mismatch" not in {f["rule"] for f in active(report)}  # as version 3 read it
    assert lint_json(a, "--policy", policy, "--baseline", "v3.json", "--prune-baseline")[0] == 0
    pruned = json.loads(Path("v3.json").read_text())
    assert pruned["version"] == 4
    assert {e.get("model") for e in pruned["findings"] if e["rule"] == "moe-layer-count-mismatch"} == \
        {"models/a/model.onnx"}
