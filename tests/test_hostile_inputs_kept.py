"""Every file ortgate reads is kept from every output, what fix removes is only what it provably made, and what a
policy or a model folder names is read only where it may lead (symlinks followed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortgate.cli import main
from tests.conftest import REPO

UNFUSED = REPO / "examples" / "qwen3-moe-tiny-unfused"
FUSED = REPO / "examples" / "qwen3-moe-tiny-fused"
CALIBRATION = "figures:\n  memory_efficiency: 0.5\n"


def _policy_with_calibration(folder: Path, calibration: str = "cal/c.yaml") -> Path:
    (folder / "cal").mkdir(exist_ok=True)
    (folder / "cal" / "c.yaml").write_text(CALIBRATION)
    policy = folder / "p.yaml"
    policy.write_text(f"name: p\nexecution_provider:\n  name: cpu\nthroughput:\n  device: cpu\n"
                      f"  calibration: {calibration}\n")
    return policy


# ---- one rule: nothing read is ever an output ----------------------------------------------------------------


def test_fix_force_never_replaces_the_folder_holding_the_policys_calibration(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(UNFUSED, tmp_path / "m")
    policy = _policy_with_calibration(tmp_path)
    code = main(["fix", "m", "-o", "cal", "--force", "--policy", str(policy), "--no-verify"])
    err = capsys.readouterr().err
    assert code == 2 and "holds an input" in err and "c.yaml" in err, err
    assert (tmp_path / "cal" / "c.yaml").read_text() == CALIBRATION
    assert sorted(p.name for p in (tmp_path / "cal").iterdir()) == ["c.yaml"]


@pytest.mark.parametrize("flag", ["--output", "--write-baseline", "--sarif"])
def test_lint_never_writes_over_the_policys_calibration(tmp_path, monkeypatch, capsys, flag):
    monkeypatch.chdir(tmp_path)
    policy = _policy_with_calibration(tmp_path)
    assert main(["lint", str(FUSED), "--policy", str(policy), flag, "cal/c.yaml"]) == 2
    assert "input" in capsys.readouterr().err
    assert (tmp_path / "cal" / "c.yaml").read_text() == CALIBRATION


def test_estimate_never_writes_over_the_policys_calibration(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    policy = _policy_with_calibration(tmp_path)
    assert main(["estimate", str(FUSED), "--policy", str(policy), "--output", "cal/c.yaml"]) == 2
    assert "input" in capsys.readouterr().err
    assert (tmp_path / "cal" / "c.yaml").read_text() == CALIBRATION


def test_fix_never_writes_into_a_folder_holding_a_custom_op_library_the_policy_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(UNFUSED, tmp_path / "m")
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "ops.so").write_bytes(b"\x7fELF")
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nexecution_provider:\n  name: cpu\nsession:\n  custom_op_libraries: [libs/ops.so]\n")
    assert main(["fix", "m", "-o", "libs", "--force", "--policy", str(policy), "--no-verify"]) == 2
    assert "ops.so" in capsys.readouterr().err
    assert (tmp_path / "libs" / "ops.so").read_bytes() == b"\x7fELF"


# ---- fix removes only the staging it provably made ------------------------------------------------------------


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _looks_like_staging(folder: Path, output: str = "out") -> Path:
    shutil.copytree(UNFUSED, folder)
    (folder / ".ortgate-staging").write_text(json.dumps({"pid": 1, "start": "1", "output": output}))
    return folder


def test_fix_never_removes_its_input_that_looks_like_stale_staging(tmp_path, capsys):
    src = _looks_like_staging(tmp_path / ".out.ortgate-tmp-1-aaaa")
    (src / ".ortgate-staging").write_text(json.dumps({"pid": _dead_pid(), "start": "1", "output": "out",
                                                      "token": "aaaa"}))
    code = main(["fix", str(src), "-o", str(tmp_path / "out"), "--no-verify"])
    assert code == 0, capsys.readouterr().err
    assert (src / "model.onnx").is_file() and (tmp_path / "out" / "model.onnx").is_file()


def test_fix_never_removes_a_users_folder_shaped_like_stale_staging(tmp_path, capsys):
    mine = _looks_like_staging(tmp_path / ".out.ortgate-tmp-1-aaaa")
    assert main(["fix", str(UNFUSED), "-o", str(tmp_path / "out"), "--no-verify"]) == 0, capsys.readouterr().err
    assert (mine / "model.onnx").is_file() and (mine / ".ortgate-staging").is_file()


def test_a_staging_marker_that_is_a_symlink_is_not_followed(tmp_path, capsys):
    """A marker that points elsewhere (even at a real marker of ortgate's) proves nothing: the folder stays."""
    out = tmp_path / "out"
    code = ("import sys; from pathlib import Path; from ortgate.fix.pipeline import staging_folder; "
            "print(staging_folder(Path(sys.argv[1])))")
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    stale = Path(done.stdout.strip())
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.rename(stale / ".ortgate-staging", outside / "marker")
    (stale / ".ortgate-staging").symlink_to(outside / "marker")
    assert main(["fix", str(UNFUSED), "-o", str(out), "--no-verify"]) == 0, capsys.readouterr().err
    assert stale.is_dir() and (outside / "marker").is_file()


# ---- reads confined --------------------------------------------------------------------------------------------


def _outside_and_work(tmp_path: Path, monkeypatch) -> tuple[Path, Path]:
    outside, work = tmp_path / "outside", tmp_path / "work"
    outside.mkdir()
    work.mkdir()
    monkeypatch.chdir(work)
    return outside, work


def test_a_calibration_symlinked_out_of_the_policys_folder_is_not_read(tmp_path, monkeypatch, capsys):
    outside, work = _outside_and_work(tmp_path, monkeypatch)
    (outside / "c.yaml").write_text(CALIBRATION)
    (work / "lnk").symlink_to(outside)
    policy = work / "p.yaml"
    policy.write_text("name: p\nexecution_provider:\n  name: cpu\nthroughput:\n  device: cpu\n"
                      "  calibration: lnk/c.yaml\n")
    assert main(["lint", str(FUSED), "--policy", str(policy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ortgate: error: {policy}:6: throughput.calibration: 'lnk/c.yaml'") and "outside" in err, err


@pytest.mark.parametrize("given", ["folder", "file"])
def test_a_genai_config_symlinked_out_of_the_model_folder_is_not_read(tmp_path, capsys, given):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(FUSED / "model.onnx", folder / "model.onnx")
    (folder / "genai_config.json").symlink_to(FUSED / "genai_config.json")
    model = folder if given == "folder" else folder / "model.onnx"
    assert main(["lint", str(model)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ortgate: error: {folder / 'genai_config.json'}: leads outside the model folder"), err


def test_extends_through_a_symlinked_folder_beside_a_symlinked_policy_is_not_read(tmp_path, monkeypatch, capsys):
    """The policy named may be a link to a file anywhere; it opens no door to the folder it points into."""
    outside, work = _outside_and_work(tmp_path, monkeypatch)
    (outside / "base.yaml").write_text("name: base\nexecution_provider:\n  name: cpu\n")
    (outside / "p.yaml").write_text("name: child\nextends: lnk/base.yaml\n")
    (work / "p.yaml").symlink_to(outside / "p.yaml")
    (work / "lnk").symlink_to(outside)
    assert main(["policy", "validate", "p.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ortgate: error: p.yaml:2: extends: 'lnk/base.yaml'") and "outside" in err, err
