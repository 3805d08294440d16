"""What `ortgate fix` produces, kept in the case file of each rule it repairs (`fix=` on its `@rule`), as a fix's diff is
snapshotted: tests/rule_cases/<CODE>.yaml ends with a `fix:` section whose entries name a model and record what
`ortgate fix MODEL -o OUT --select CODE` must give: whether it writes OUT, whether verification passed, how many of
the rule's findings OUT still has, and OUT's node inventory (op type -> count). Beside it, the plan's diff of every
entry (the nodes fix removed and added, and the attributes of the MoE nodes it wrote) is kept in
tests/rule_cases/snapshots/<CODE>.fix.txt, as a fix's diff is snapshotted. A change leaves what fix gives now beside
the file (<CODE>.yaml.new with the `fix:` section rewritten, <CODE>.fix.txt.new) for review:
`python scripts/review_snapshots.py`, then `--accept`.

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
from tests.snapshot import check_snapshot
from tests.test_rule_cases import CASES, SNAPSHOTS

SECTION = "\nfix:\n"


def inventory(path: Path) -> dict[str, int]:
    model = onnx.load(str(path), load_external_data=False)
    ops = Counter((f"{n.domain}." if n.domain not in ("", "ai.onnx") else "") + n.op_type for n in model.graph.node)
    return dict(sorted(ops.items()))


MOE_OPS = ("com.microsoft.MoE", "com.microsoft.QMoE")


def _attribute(attr: onnx.AttributeProto) -> str:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, float):
        value = float(f"{value:.7g}")  # a float32 attribute, as written
    return f"{attr.name}={value}"


def plan_diff(source: Path, out: Path) -> list[str]:
    """What fix changed: the nodes it removed and added (op type x count) and the attributes of each distinct MoE
    node it wrote (with how many nodes share them)."""
    before, after = Counter(inventory(source)), Counter(inventory(out))
    removed, added = before - after, after - before
    lines = [f"  removed: {', '.join(f'{op} x{n}' for op, n in sorted(removed.items())) or 'nothing'}",
             f"  added: {', '.join(f'{op} x{n}' for op, n in sorted(added.items())) or 'nothing'}"]
    model = onnx.load(str(out), load_external_data=False)
    moe = Counter((f"{n.domain}.{n.op_type}", ", ".join(sorted(_attribute(a) for a in n.attribute)))
                  for n in model.graph.node if f"{n.domain}.{n.op_type}" in MOE_OPS)
    lines += [f"  {op} x{count}: {attributes}" for (op, attributes), count in sorted(moe.items())]
    return lines


def outcome(code: str, model: dict, folder: Path, diff: list[str] | None = None) -> dict:
    """What `ortgate fix --select code` gives on `model`; the plan's diff is appended to `diff` when given."""
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
        if diff is not None:
            diff += plan_diff(source, out / "model.onnx")
    elif diff is not None:
        diff.append("  nothing written")
    return result


@pytest.mark.parametrize("code", sorted(fixable_rules()))
def test_each_repaired_rule_records_what_fix_produces(code, tmp_path):
    path = CASES / f"{code}.yaml"
    text = path.read_text(encoding="utf-8")
    assert SECTION in text, f"{path.name} has no fix: section (what `ortgate fix --select {code}` must produce)"
    entries = yaml.safe_load(text)["fix"]
    assert entries, f"{path.name}: an empty fix: section"
    got = []
    diff = [f"{code}: ortgate fix MODEL -o OUT --select {code}", ""]
    for i, entry in enumerate(entries):
        folder = tmp_path / f"entry-{i}"
        folder.mkdir()
        diff.append(f"[{entry['name']}]")
        got.append({"name": entry["name"], "model": entry["model"], **outcome(code, entry["model"], folder, diff)})
        diff.append("")
    plan = SNAPSHOTS / f"{code}.fix.txt"
    if got != entries:
        head = text[: text.index(SECTION)]
        recorded = head + SECTION + yaml.safe_dump(got, sort_keys=False, width=118, default_flow_style=None)
        check_snapshot(path, recorded, f"what fix produces for {code}")
    check_snapshot(plan, "\n".join(diff), f"the plan's diff for {code}")
