"""A lint's report is a function of its inputs: the same model and policy give the same bytes in every format,
from one process to the next. The `cpu` device is measured only when asked (`ortgate run --write-calibration`,
`ortgate estimate --probe`); a lint without its figures says what it did not judge."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from tests.conftest import EXAMPLES, REPO
from tests.helpers import run_cli, run_cli_json

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"
FORMATS = ("text", "json", "sarif", "github", "markdown", "junit", "codequality")

# Every format of one lint, in a fresh process (a probe's figures would be cached for a process, never across).
RENDER_ALL = """
import hashlib, io, json, sys
from contextlib import redirect_stdout
from ortgate.cli import main
digests = {}
for fmt in sys.argv[3:]:
    out = io.StringIO()
    with redirect_stdout(out):
        main(["lint", sys.argv[1], "--policy", sys.argv[2], "--format", fmt])
    digests[fmt] = hashlib.sha256(out.getvalue().encode()).hexdigest()
print(json.dumps(digests))
"""


def test_two_lints_of_an_uncalibrated_cpu_policy_are_byte_identical_in_every_format(write_policy):
    policy = write_policy("name: p\nextends: builtin:cpu\nthroughput: {device: cpu, min_tokens_per_s: 400}\n")
    runs = [subprocess.run([sys.executable, "-c", RENDER_ALL, str(UNFUSED), str(policy), *FORMATS], capture_output=True,
                           text=True, cwd=REPO, timeout=300, check=True).stdout for _ in range(2)]
    assert json.loads(runs[0]) == json.loads(runs[1])
    in_process = {fmt: hashlib.sha256(run_cli("lint", UNFUSED, "--policy", policy, "--format", fmt)[1].encode())
                  .hexdigest() for fmt in FORMATS}
    assert in_process == json.loads(runs[0])


def test_an_uncalibrated_cpu_estimate_is_not_judged_and_says_what_to_add(write_policy):
    policy = write_policy("name: p\nextends: builtin:cpu\nthroughput: {device: cpu, min_tokens_per_s: 400}\n")
    code, report = run_cli_json("lint", UNFUSED, "--policy", policy)
    assert code == 1 and "estimate" not in report["inputs"]
    assert all(f.get("price") is None for f in report["findings"])
    [gap] = [f for f in report["findings"] if f["rule"] == "throughput-not-judged"]
    assert "targets and the findings' prices are not judged" in gap["message"]
    assert "--write-calibration" in gap["message"] and gap["line"] == 3
    code, out, err = run_cli("estimate", UNFUSED, "--device", "cpu")
    assert code == 2 and out == "" and "--probe" in err and "throughput.calibration" in err


def test_estimate_probe_measures_this_machine_when_asked():
    code, report = run_cli_json("estimate", UNFUSED, "--device", "cpu", "--probe")
    assert code == 0 and report["figures"]["bandwidth_gb_s"]["confidence"] == "probe"
