"""No output ortgate writes may be, replace or (a folder) contain a file it reads: the model, its external
weights, genai_config.json, the policy and every file it extends, the baseline, the optimized dump. Each case
runs the real command on real files and compares every input's hash before and after.

Reports are replaced whole (a temporary file in the same folder, then a rename), so a failed write leaves the
previous report as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import onnx
import pytest

from ortgate.cli.output import Output, check_outputs, write_file
from ortgate.errors import InputError
from tests.conftest import POLICIES
from tests.helpers import run_cli
from tests.models.make_examples import genai_config
from tests.models.qwen_moe import ModelSpec, build_model, save_model

SPEC = ModelSpec()


@pytest.fixture
def folder(tmp_path) -> Path:
    """A model folder as onnxruntime-genai ships one: model.onnx, its weights in model.onnx.data, and
    genai_config.json; beside it a policy that extends a base policy in another file, and a baseline."""
    model_dir = tmp_path / "model"
    save_model(build_model(SPEC), model_dir / "model.onnx", external_data=True)
    assert (model_dir / "model.onnx.data").is_file()
    (model_dir / "genai_config.json").write_text(json.dumps(genai_config(SPEC), indent=2))
    (tmp_path / "base.yaml").write_text("name: base\nextends: builtin:cpu\n")
    (tmp_path / "policy.yaml").write_text("name: child\nextends: base.yaml\nsession:\n"
                                          "  free_dimension_overrides: {batch_size: 1, sequence_length: 1}\n")
    code, _, err = run_cli("lint", model_dir, "--policy", tmp_path / "policy.yaml",
                           "--write-baseline", tmp_path / "baseline.json", "--format", "json")
    assert code in (0, 1), err
    return tmp_path


def digests(root: Path) -> dict[str, str]:
    """Every file under root (symlinks as their own text), by content hash."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            out[str(path.relative_to(root))] = "-> " + os.readlink(path)
        elif path.is_file():
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def refused(root: Path, *argv, contains: str = "refusing to write") -> str:
    before = digests(root)
    code, out, err = run_cli(*argv)
    assert (code, out) == (2, ""), (code, out, err)
    assert err.startswith("ortgate: error: ") and err.count("\n") == 1 and contains in err, err
    assert digests(root) == before
    return err


LINT_REPORT_FLAGS = ["--output", "--json", "--sarif", "--markdown", "--write-baseline"]
INPUTS = {
    "model": "model/model.onnx",
    "weights": "model/model.onnx.data",
    "genai_config": "model/genai_config.json",
    "policy": "policy.yaml",
    "extended_policy": "base.yaml",
}


@pytest.mark.parametrize("flag", LINT_REPORT_FLAGS)
@pytest.mark.parametrize("victim", INPUTS)
def test_lint_never_writes_over_an_input_of_a_model_folder(folder, flag, victim):
    """MODEL given as its folder: the files inside it are inputs all the same."""
    refused(folder, "lint", folder / "model", "--policy", folder / "policy.yaml", flag, folder / INPUTS[victim])


@pytest.mark.parametrize("flag", ["--output", "--json", "--sarif", "--markdown"])
def test_lint_never_writes_a_report_over_the_baseline_or_the_optimized_dump(folder, flag):
    dump = folder / "model" / "model.optimized.onnx"
    save_model(build_model(SPEC), dump)
    argv = ["lint", folder / "model", "--policy", folder / "policy.yaml", "--baseline", folder / "baseline.json",
            "--optimized", dump]
    refused(folder, *argv, flag, folder / "baseline.json")
    refused(folder, *argv, flag, dump)


def test_the_error_names_the_input_a_path_reaches(folder):
    err = refused(folder, "lint", folder / "model", "--output", folder / "model" / "model.onnx.data")
    assert "refusing to write the report over an input file" in err
    link = folder / "report.txt"
    link.symlink_to(folder / "model" / "genai_config.json")
    err = refused(folder, "lint", folder / "model", "--sarif", link)
    assert "SARIF report over an input file" in err and "genai_config.json" in err


@pytest.mark.parametrize("victim", INPUTS)
def test_a_symlink_to_an_input_is_refused(folder, victim):
    link = folder / f"{victim}.link"
    link.symlink_to(folder / INPUTS[victim])
    refused(folder, "lint", folder / "model", "--policy", folder / "policy.yaml", "--json", link)


def test_a_path_through_a_symlinked_folder_or_a_hard_link_is_refused(folder):
    (folder / "alias").symlink_to(folder / "model", target_is_directory=True)
    refused(folder, "lint", folder / "model", "--output", folder / "alias" / "model.onnx")
    os.link(folder / "policy.yaml", folder / "hardlink.yaml")
    refused(folder, "lint", folder / "model", "--policy", folder / "policy.yaml", "--markdown",
            folder / "hardlink.yaml")


def test_a_model_given_by_a_symlink_is_protected_at_its_real_path(folder):
    (folder / "link.onnx").symlink_to(folder / "model" / "model.onnx")
    refused(folder, "lint", folder / "link.onnx", "--output", folder / "model" / "model.onnx")
    refused(folder, "lint", folder / "link.onnx", "--output", folder / "model" / "model.onnx.data")


def test_write_baseline_may_rewrite_the_baseline_it_read_and_nothing_else(folder):
    baseline = folder / "baseline.json"
    code, _, err = run_cli("lint", folder / "model", "--policy", folder / "policy.yaml", "--baseline", baseline,
                           "--write-baseline", baseline)
    assert code in (0, 1), err
    assert json.loads(baseline.read_text())["format"] == "ortgate-baseline"
    refused(folder, "lint", folder / "model", "--policy", folder / "policy.yaml", "--baseline", baseline,
            "--write-baseline", folder / "base.yaml")


def test_two_outputs_on_one_file_are_refused(folder):
    (folder / "r.json").symlink_to(folder / "report.json")
    refused(folder, "lint", folder / "model", "--json", folder / "report.json", "--output", folder / "r.json",
            contains="two outputs would be written to the same file")


def test_a_new_report_inside_the_model_folder_is_fine(folder):
    before = digests(folder)
    code, _, err = run_cli("lint", folder / "model", "--policy", folder / "policy.yaml",
                           "--output", folder / "model" / "report.txt", "--sarif", folder / "model" / "o.sarif")
    assert code in (0, 1), err
    after = digests(folder)
    assert {k: v for k, v in after.items() if k in before} == before
    assert sorted(set(after) - set(before)) == ["model/o.sarif", "model/report.txt"]


# ortgate run: every output is checked before ORT writes anything ------------------------------------------------

RUN_FLAGS = ["--output", "--dump", "--profile"]


@pytest.mark.parametrize("flag", RUN_FLAGS)
@pytest.mark.parametrize("victim", INPUTS)
def test_run_never_writes_over_an_input(folder, flag, victim):
    refused(folder, "run", folder / "model", "--policy", folder / "policy.yaml", flag, folder / INPUTS[victim])


def test_run_never_writes_the_dumps_weights_over_the_models(tmp_path):
    """ORT writes a large model's dump weights to DUMP.data: here that is the file the model's weights are in."""
    model = build_model(SPEC)
    onnx.save_model(model, tmp_path / "model.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="opt.onnx.data", size_threshold=0)
    policy = tmp_path / "p.yaml"
    policy.write_text("name: p\nextends: builtin:cpu\n")
    err = refused(tmp_path, "run", tmp_path / "model.onnx", "--policy", policy, "--dump", tmp_path / "opt.onnx")
    assert "optimized dump's weights over an input file" in err


# A folder output (`ortgate fix OUT`): OUT may neither be nor contain an input -----------------------------------

def test_a_folder_output_may_not_be_or_hold_an_input(folder):
    reads = [folder / "model" / "model.onnx", folder / "policy.yaml"]
    for out in (folder / "model", folder, folder / "alias-of-model"):
        if out.name == "alias-of-model":
            out.symlink_to(folder / "model", target_is_directory=True)
        with pytest.raises(InputError, match="into a folder that holds an input file"):
            check_outputs([Output(str(out), "output folder", folder=True)], reads)
    check_outputs([Output(str(folder / "model" / "fixed"), "output folder", folder=True)], reads)
    with pytest.raises(InputError, match="exists and is not a folder"):
        check_outputs([Output(str(folder / "baseline.json"), "output folder", folder=True)], reads)


# Replacing a report ---------------------------------------------------------------------------------------------

def test_a_failed_write_leaves_the_previous_report_whole(tmp_path, monkeypatch):
    report = tmp_path / "report.json"
    report.write_text('{"previous": "report"}\n')
    os.chmod(report, 0o640)

    def disk_full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    code, _, err = run_cli("lint", POLICIES.parent / "examples" / "qwen3-moe-tiny-fused", "--output", report)
    assert code == 2 and "cannot write: No space left on device" in err
    assert report.read_text() == '{"previous": "report"}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]  # no temporary file left behind
    monkeypatch.undo()
    code, out, err = run_cli("lint", POLICIES.parent / "examples" / "qwen3-moe-tiny-fused", "--output", report)
    assert (code, out) == (0, "") and "PASS" in report.read_text()
    assert stat.S_IMODE(report.stat().st_mode) == 0o640  # replacing keeps the file's permissions


def test_a_symlinked_report_stays_a_symlink(tmp_path):
    real = tmp_path / "runs" / "42.txt"
    real.parent.mkdir()
    real.write_text("old\n")
    (tmp_path / "latest.txt").symlink_to(real)
    write_file(tmp_path / "latest.txt", b"new\n")
    assert (tmp_path / "latest.txt").is_symlink() and real.read_text() == "new\n"


def test_a_fifo_is_written_in_place_never_replaced(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader is there before the write
    try:
        write_file(fifo, b"report\n")
        got = os.read(reader, 100)
    finally:
        os.close(reader)
    assert got == b"report\n" and stat.S_ISFIFO(fifo.stat().st_mode)
