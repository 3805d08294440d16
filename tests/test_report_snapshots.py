"""Every report format on the committed examples, compared byte for byte with tests/snapshots/.

Cases: the unfused example under policies/tiny-moe-cpu.yaml (fails), the fused example under the same
policy (passes), and the unfused example under tests/data/policies/tiny-moe-cpu-waivers.yaml (one waiver
applies, one expired, one matches nothing). Only the MoE and attention fusion rules (with the codes split off
them) and the waiver rules run, so a new rule elsewhere does not churn these files. The ortgate version is redacted.

After an intended change of output, the failing test leaves what it got beside the snapshot (`<name>.new`):
review the diff and accept it (tests/snapshot.py):

    python scripts/review_snapshots.py && python scripts/review_snapshots.py --accept
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ortgate import __version__
from tests.conftest import REPO
from tests.helpers import run_cli
from tests.snapshot import check_snapshot

SNAPSHOTS = REPO / "tests" / "snapshots"
SELECT = "moe-not-fused,gqa-not-fused,OGW"
FORMATS = {"text": "txt", "json": "json", "sarif": "sarif", "github": "log", "markdown": "md"}
CASES = {
    "unfused": ("examples/qwen3-moe-tiny-unfused", "policies/tiny-moe-cpu.yaml"),
    "fused": ("examples/qwen3-moe-tiny-fused", "policies/tiny-moe-cpu.yaml"),
    "waivers": ("examples/qwen3-moe-tiny-unfused", "tests/data/policies/tiny-moe-cpu-waivers.yaml"),
}


def redact(text: str) -> str:
    return text.replace(f'"{__version__}"', '"<version>"')


@pytest.fixture
def in_repo(monkeypatch):
    """Reports show paths relative to the source root: the repository here, as a checkout is on CI."""
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)


def assert_snapshot(name: str, actual: str) -> None:
    check_snapshot(SNAPSHOTS / name, actual)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", CASES)
def test_report_matches_its_snapshot(in_repo, case, fmt):
    model, policy = CASES[case]
    code, out, err = run_cli("lint", model, "--policy", policy, "--select", SELECT, "--format", fmt)
    assert err == ""
    assert code == (0 if case == "fused" else 1)
    assert_snapshot(f"{case}.{FORMATS[fmt]}", redact(out))


def test_two_runs_write_byte_identical_reports(tmp_path):
    """Separate processes with different hash seeds: no set or dict order, time or path leaks into output."""
    runs = []
    for seed in ("1", "2"):
        out = tmp_path / f"run{seed}"
        out.mkdir()
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}
        env.pop("GITHUB_WORKSPACE", None)
        # Each run in its own folder, writing relative names: the reports mention the baseline's path.
        proc = subprocess.run(
            [sys.executable, "-m", "ortgate", "lint", str(REPO / "examples/qwen3-moe-tiny-unfused"),
             "--policy", str(REPO / "tests/data/policies/tiny-moe-cpu-waivers.yaml"), "--format", "github",
             "--output", "annotations.log", "--sarif", "report.sarif", "--markdown", "summary.md",
             "--json", "report.json", "--write-baseline", "baseline.json"],
            cwd=out, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1, proc.stderr
        runs.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert sorted(runs[0]) == ["annotations.log", "baseline.json", "report.json", "report.sarif", "summary.md"]
    assert all(runs[0][name] for name in runs[0])
    assert runs[0] == runs[1]
