"""Measured ratios come with their spread: `ortgate fix` (original vs fixed) and `ortgate run --compare-default`
(policy vs ORT's default session) time the two sessions in alternated rounds, report the median ratio with the
smallest and largest round's, and say "within noise" when the two sessions' per-round p50 intervals overlap."""

from __future__ import annotations

import re

from ortgate.cli import main
from ortgate.runner.measure import ROUNDS, round_ratio
from tests.test_fix import fix_json
from tests.test_runner_cli import CPU_POLICY, QWEN35, run_json

SPREAD = re.compile(r"median of the per-round ratios (\d+\.\d+)x \((\d+\.\d+)x-(\d+\.\d+)x over (\d+) alternated "
                    r"rounds(; within noise)?\)")
# The speedup printed beside the two p50s is their ratio, named as such.
PLAIN = re.compile(r"original p50 (\d+\.\d+) ms, fixed p50 (\d+\.\d+) ms, speedup (\d+\.\d+)x \(original p50 / fixed p50\)")


def test_overlapping_rounds_are_within_noise_and_apart_ones_are_not():
    # per round, the runs' latencies in seconds: the ratio is the median of the per-round p50 ratios
    close = round_ratio([[1.0, 1.1], [1.3, 1.2], [0.9, 1.0]], [[1.0, 1.0], [1.1, 1.1], [1.2, 1.2]])
    assert close.within_noise and close.rounds == 3
    assert close.low <= close.value <= close.high
    apart = round_ratio([[2.0, 2.1], [2.2, 2.0], [1.9, 2.0]], [[1.0, 1.0], [1.1, 1.1], [1.0, 1.2]])
    assert not apart.within_noise and apart.low > 1.5
    assert apart.describe().endswith("over 3 alternated rounds)") and "within noise" in close.describe()


def test_fix_reports_its_speedup_with_the_spread_over_alternated_rounds(tmp_path, make_model, capsys):
    src = make_model(moe="dense_loop")
    assert main(["fix", str(src), "-o", str(tmp_path / "out"), "--select", "moe-not-fused"]) == 0
    out = capsys.readouterr().out
    found = SPREAD.search(out)
    assert found, "no speedup with its spread"
    plain = PLAIN.search(out)
    assert plain, "no speedup beside the p50s"
    original_ms, fixed_ms, speedup = (float(plain.group(i)) for i in (1, 2, 3))
    # the p50s are printed to 0.001 ms and the speedup to 0.01: their ratio within that rounding
    low_ratio, high_ratio = (original_ms - 5e-4) / (fixed_ms + 5e-4), (original_ms + 5e-4) / max(fixed_ms - 5e-4, 1e-9)
    assert low_ratio - 0.005 <= speedup <= high_ratio + 0.005
    value, low, high, rounds = (float(found.group(i)) for i in (1, 2, 3, 4))
    assert low <= value <= high and rounds == ROUNDS
    code, report = fix_json(src, "-o", tmp_path / "out2", "--select", "moe-not-fused")
    m = report["measurement"]
    assert code == 0 and m["rounds"] == ROUNDS and isinstance(m["within_noise"], bool)
    assert m["speedup_spread"][0] <= m["speedup"] <= m["speedup_spread"][1]


def test_run_reports_the_speedup_over_the_default_session_with_its_spread(write_policy):
    code, report, _ = run_json(QWEN35, "--policy", write_policy(CPU_POLICY), "--compare-default")
    ratio = report["run"]["versus_default"]
    assert ratio["rounds"] == ROUNDS and ratio["low"] <= ratio["value"] <= ratio["high"]
    assert report["run"]["speedup_vs_default"] == ratio["value"]
    assert isinstance(ratio["within_noise"], bool)
