"""ORT's CPU com.microsoft.MoE in-place defect (knowledge/ort_moe.json cpu_inplace_defect), re-proved on the installed
onnxruntime: scripts/ort_moe_inplace_check.py builds the one-node cases, and what they give must be what the knowledge
file claims for that release. With ORTGATE_OTHER_ORT_PYTHON naming another Python (e.g. one with onnxruntime 1.32.0),
the same check runs there too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ortgate.knowledge.moe_op import moe_op_facts

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ort_moe_inplace_check.py"
WRONG = 1e-2  # the defect gives errors of order 0.1 to 1; a correct kernel ~1e-7
RIGHT = 1e-5
TRIGGERED = ("intermediate_n0", "intermediate_side_n0")


def _check(python: str) -> dict:
    done = subprocess.run([python, str(SCRIPT)], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_claim(result: dict) -> None:
    defect = moe_op_facts().inplace_defect
    version, errors = result["onnxruntime"], result["errors"]
    status = defect.status(version)
    untouched = {name: e for name, e in errors.items() if name not in TRIGGERED}
    assert all(e < RIGHT for e in untouched.values()), (version, untouched)  # incl. the workaround, both settings
    if status == "affected":
        assert all(errors[name] > WRONG for name in TRIGGERED), (version, errors)
    elif status == "fixed":
        assert all(errors[name] < RIGHT for name in TRIGGERED), (version, errors)
    else:
        wrong = all(errors[name] > WRONG for name in TRIGGERED)
        pytest.fail(f"onnxruntime {version} is {status} in ort_moe.json; the one-node cases say it is "
                    f"{'affected' if wrong else 'right'}: record it in cpu_inplace_defect")


def test_the_installed_release_computes_the_one_node_cases_as_the_knowledge_file_says():
    _assert_claim(_check(sys.executable))


@pytest.mark.skipif(not os.environ.get("ORTGATE_OTHER_ORT_PYTHON"),
                    reason="ORTGATE_OTHER_ORT_PYTHON names no other Python with onnxruntime")
def test_another_release_computes_the_one_node_cases_as_the_knowledge_file_says():
    _assert_claim(_check(os.environ["ORTGATE_OTHER_ORT_PYTHON"]))


def test_release_status_reads():
    defect = moe_op_facts().inplace_defect
    assert defect.status("1.31.1") == "affected" and defect.affects("1.31.1")
    assert defect.status("1.29.0") == "presumed affected" and defect.affects("1.29.0")
    assert defect.status("1.32.0") == "fixed" and not defect.affects("1.32.1")
    assert defect.status("1.20.0") == "unknown" and defect.status(None) == "unknown"
    assert defect.triggered_by(0) and defect.triggered_by(None) and not defect.triggered_by(1)
