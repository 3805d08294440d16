"""Work that must stay linear in what a hostile input holds, and outputs that must never block."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import ortgate.config.policy as policy_module
from ortgate.cli import main
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "qwen3-moe-tiny-fused"


def test_describing_unknown_keys_lists_them_once_per_mapping_not_once_per_key(tmp_path, monkeypatch, capsys):
    calls = {"n": 0}
    original = policy_module._unknown_keys

    def counted(error):
        calls["n"] += 1
        return original(error)

    monkeypatch.setattr(policy_module, "_unknown_keys", counted)
    bad = tmp_path / "many.yaml"
    keys = 2000
    bad.write_text("name: x\nexecution_provider:\n  name: cpu\n" + "".join(f"k{i}: 1\n" for i in range(keys)))
    assert main(["policy", "validate", str(bad)]) == 2
    assert capsys.readouterr().err.count("unknown key") == keys
    assert calls["n"] <= 4  # once per additionalProperties error (lint and validate each check once), never per key


@pytest.mark.parametrize("flag", ["--output", "--sarif", "--markdown", "--json", "--junit"])
def test_an_output_fifo_with_no_reader_is_refused_not_waited_on(tmp_path, flag, capsys):
    fifo = tmp_path / "r.fifo"
    os.mkfifo(fifo)
    result: dict = {}
    worker = threading.Thread(target=lambda: result.setdefault("code", main(["lint", str(EXAMPLE), flag, str(fifo)])),
                              daemon=True)
    worker.start()
    worker.join(timeout=60)
    if worker.is_alive():  # unblock the writer so the test run can end, then fail
        with open(fifo, "rb") as reader:
            reader.read()
        pytest.fail(f"lint {flag} FIFO blocked")
    err = capsys.readouterr().err
    assert result["code"] == 2 and str(fifo) in err and "no reader" in err, err


def test_a_report_name_of_254_bytes_is_written(tmp_path, capsys):
    report = tmp_path / ("r" * 250 + ".txt")
    assert main(["lint", str(EXAMPLE), "--output", str(report)]) == 0, capsys.readouterr().err
    assert "PASS" in report.read_text()
    assert [p.name for p in tmp_path.iterdir()] == [report.name]


def test_onnxscripts_warnings_and_logs_never_reach_stderr_on_success(tmp_path, make_model, monkeypatch, capsys):
    import logging
    import warnings

    import onnx_ir

    original = onnx_ir.serde.deserialize_model

    def noisy(*args, **kwargs):
        warnings.warn("onnx_ir says something", UserWarning, stacklevel=1)
        logging.getLogger("onnx_ir.noisy").warning("and logs it")
        print("and prints it")
        return original(*args, **kwargs)

    monkeypatch.setattr(onnx_ir.serde, "deserialize_model", noisy)
    src = make_model(moe="dense_loop", norm="decomposed")
    assert main(["fix", str(src), "-o", str(tmp_path / "out"), "--no-verify"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "and prints it" not in captured.out


def test_importing_onnxruntime_through_ortgate_writes_nothing_in_home(tmp_path):
    """ONNX Runtime's telemetry database under ~/.cache/Microsoft/ is never written; the user may still opt in."""
    home = tmp_path / "home"
    home.mkdir()
    code = ("import sys, ortgate.cli.output as o; o.require_onnxruntime('x'); import onnxruntime; "
            "import os; print(os.environ['ORT_DISABLE_TELEMETRY'])")
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "HOME": str(home), "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    assert list(home.rglob("*")) == []
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**env, "HOME": str(home), "PYTHONPATH": str(REPO), "ORT_DISABLE_TELEMETRY": "0"})
    assert done.stdout.strip() == "0"  # the user's own setting wins
