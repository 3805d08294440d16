"""What `ortgate fix` produces, kept in the case file of each rule it repairs (`fix=` on its `@rule`), as a fix's diff is
snapshotted: tests/rule_cases/<CODE>.yaml ends with a `fix:` section whose entries name a model and record what
`ortgate fix MODEL -o OUT --select CODE` must give: whether it writes OUT, whether verification passed, how many of
the rule's findings OUT still has, and OUT's node inventory (op type -> count). ORTGATE_UPDATE_SNAPSHOTS=1 rewrites
the recorded outcomes (the `fix:` section only; review the diff).

    fix:
    - name: every expert on every token
      model: {spec: {moe: dense_loop}}      # or {file: tests/fixtures/...}
      written: true
      verified: true
      findings_after: 0
      nodes_after: {com.microsoft.MoE: 2, ...}
"""

from __future__ import annotations

import contextlib
import io
import json
from collections import Counter
from pathlib import Path

import onnx
import pytest
import yaml

from ortgate.cli import main
from ortgate.fix.pipeline import fixable_rules
from ortgate.rules import all_rules
from tests.conftest import REPO
from tests.helpers import rule_findings
from tests.rule_inputs import spec_model
from tests.test_rule_cases import CASES, UPDATE

SECTION = "\nfix:\n"


def inventory(path: Path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    ops = Counter((f"{n.domain}." if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in model.graph.node)
    return dict(sorted(ops.items()))


def outcome(code: str, model: dict, folder: Path) -> dict:
    source = spec_model(model["spec"], folder) if "spec" in model else REPO / model["file"]
    out = folder / "out"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        exit_code = main(["fix", str(source), "-o", str(out), "--select", code, "--format", "json"])
    assert exit_code == 0, text.getvalue()
    report = json.loads(text.getvalue())
    written = bool(report["written"])
    result = {"written": written, "verified": bool(report["verification"] and report["verification"]["passed"])}
    if written:
        name = next(r.name for r in all_rules() if r.code == code)
        result["findings_after"] = len(rule_findings(out / "model.onnx", name))
        result["nodes_after"] = inventory(out / "model.onnx")
    return result


@pytest.mark.parametrize("code", sorted(fixable_rules()))
def test_each_repaired_rule_records_what_fix_produces(code, tmp_path):
    path = CASES / f"{code}.yaml"
    text = path.read_text(encoding="utf-8")
    assert SECTION in text, f"{path.name} has no fix: section (what `ortgate fix --select {code}` must produce)"
    entries = yaml.safe_load(text)["fix"]
    assert entries, f"{path.name}: an empty fix: section"
    got = []
    for i, entry in enumerate(entries):
        folder = tmp_path / f"entry-{i}"
        folder.mkdir()
        got.append({"name": entry["name"], "model": entry["model"], **outcome(code, entry["model"], folder)})
    if UPDATE:
        head = text[: text.index(SECTION)]
        path.write_text(head + SECTION + yaml.safe_dump(got, sort_keys=False, width=118, default_flow_style=None), encoding="utf-8")
        return
    assert got == entries, f"{code}: what fix produces differs from {path.name} (ORTGATE_UPDATE_SNAPSHOTS=1 rewrites it)"
