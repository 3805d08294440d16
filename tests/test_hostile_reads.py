"""Reads stay inside what was given: a policy's `extends` and a model folder's files."""

from __future__ import annotations

import shutil

from ortgate.cli import main
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "qwen3-moe-tiny-fused"


def test_extends_leaving_the_working_directory_and_repository_is_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "base.yaml").write_text("name: base\nexecution_provider:\n  name: cpu\n")
    (tmp_path / "team").mkdir()
    policy = tmp_path / "team" / "p.yaml"
    policy.write_text("name: child\nextends: ../shared/base.yaml\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["policy", "validate", str(policy)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ortgate: error: {policy}:2: extends: '../shared/base.yaml'") and "outside" in err, err
    monkeypatch.chdir(tmp_path)  # run from a folder that holds the base: read
    assert main(["policy", "validate", str(policy)]) == 0, capsys.readouterr().err


def test_a_decoder_symlinked_out_of_the_model_folder_is_refused(tmp_path, capsys):
    folder = tmp_path / "m"
    folder.mkdir()
    shutil.copy(EXAMPLE / "genai_config.json", folder / "genai_config.json")
    (folder / "model.onnx").symlink_to(EXAMPLE / "model.onnx")
    assert main(["lint", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ortgate: error: {folder / 'model.onnx'}: leads outside the model folder"), err


def test_a_genai_config_with_a_byte_order_mark_is_read_as_a_policy_with_one_is(tmp_path, capsys):
    folder = tmp_path / "m"
    shutil.copytree(EXAMPLE, folder)
    config = folder / "genai_config.json"
    config.write_bytes(b"\xef\xbb\xbf" + config.read_bytes())
    policy = tmp_path / "p.yaml"
    policy.write_bytes(b"\xef\xbb\xbfname: bom\nexecution_provider:\n  name: cpu\n")
    assert main(["lint", str(folder), "--policy", str(policy)]) in (0, 1)
    assert capsys.readouterr().err == ""
