"""Each root cause is priced once: a layer count that restates the per-layer findings (moe-layer-count-mismatch,
attention-layer-count-mismatch) carries no second price, and the saves/token column never sums past the step."""

from __future__ import annotations

from tests.conftest import EXAMPLES, POLICIES
from tests.helpers import run_cli, run_cli_json

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"


def _miscounting(write_policy):
    text = (POLICIES / "tiny-moe-cpu.yaml").read_text()
    return write_policy(text.replace("moe_layers: 2", "moe_layers: 3").replace("attention_layers: 2",
                                                                              "attention_layers: 3"))


def test_a_layer_count_finding_is_not_priced_twice(write_policy):
    policy = _miscounting(write_policy)
    code, report = run_cli_json("lint", UNFUSED, "--policy", policy)
    by_rule = {}
    for f in report["findings"]:
        by_rule.setdefault(f["rule"], []).append(f)
    assert {"moe-layer-count-mismatch", "attention-layer-count-mismatch"} <= set(by_rule)
    for restating in ("moe-layer-count-mismatch", "attention-layer-count-mismatch"):
        assert all(f["price"] is None for f in by_rule[restating])
    assert all(f["price"] is not None for f in by_rule["moe-not-fused"] + by_rule["gqa-not-fused"])
    shares = sum(f["price"]["share_of_step"] for f in report["findings"] if f["price"] and f["suppressed"] is None)
    assert shares <= 1.0


def test_the_summary_table_prices_each_rule_once(write_policy):
    policy = _miscounting(write_policy)
    _, out, _ = run_cli("lint", UNFUSED, "--policy", policy)
    rows = [line for line in out.splitlines() if line.startswith(("OGM008", "OGM009"))]
    assert len(rows) == 2 and not any("us (" in row or "ms (" in row for row in rows), rows
    shares = [int(part.split("(")[1].rstrip("%)")) for line in out.splitlines() if line.startswith("OG")
              for part in line.split("  ") if part.strip().endswith("%)")]
    assert shares and sum(shares) <= 100
