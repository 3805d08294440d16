"""`ortgate fix` against hostile surroundings: outputs that hold inputs, folders that appear while it runs, signals,
stale staging folders, odd modes. Nothing the user has is deleted; every refusal is one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortgate.cli import main
from ortgate.engine.fix import run_fix
from ortgate.errors import InputError
from ortgate.fix.pipeline import FixRequest, _process_start
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "qwen3-moe-tiny-fused"


def _staging(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if "ortgate-tmp" in p.name or "ortgate-old" in p.name]


def test_force_refuses_a_folder_holding_a_base_the_policy_extends(tmp_path, make_model, capsys):
    src = make_model(moe="dense_loop")
    base = tmp_path / "base"
    base.mkdir()
    (base / "base.yaml").write_text("name: base\nexecution_provider:\n  name: cpu\n")
    policy = tmp_path / "p.yaml"
    policy.write_text("extends: base/base.yaml\nname: child\n")
    code = main(["fix", str(src), "-o", str(base), "--force", "--policy", str(policy), "--select", "moe-not-fused"])
    err = capsys.readouterr().err
    assert code == 2 and "holds an input" in err and "base.yaml" in err, err
    assert (base / "base.yaml").read_text().startswith("name: base")


@pytest.mark.parametrize("force", [False, True])
def test_a_folder_that_appears_at_out_while_fix_runs_is_never_replaced(tmp_path, make_model, force):
    src = make_model(moe="dense_loop")
    out = tmp_path / "out"
    if force:
        out.mkdir()
        (out / "old.txt").write_text("old")
    intruder = tmp_path / "intruder"

    def note(message: str) -> None:
        if message.startswith("linting the output"):  # after the check, before the rename
            if force:  # OUT is replaced under fix by another folder
                os.rename(out, tmp_path / "moved-away")
            os.mkdir(out)
            (out / "theirs.txt").write_text("theirs")
            intruder.write_text("done")

    request = FixRequest(str(src), str(out), select=["moe-not-fused"], force=force)
    with pytest.raises(InputError) as info:
        run_fix(request, measure=False, note=note)
    assert intruder.exists()
    assert str(out) in str(info.value) and "nothing written" in str(info.value)
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    assert not _staging(tmp_path)
    if force:
        assert (tmp_path / "moved-away" / "old.txt").read_text() == "old"


def test_the_output_folder_gets_the_mode_mkdir_gives_it(tmp_path, make_model):
    src = make_model(moe="dense_loop")
    old = os.umask(0o022)
    try:
        assert main(["fix", str(src), "-o", str(tmp_path / "out"), "--select", "moe-not-fused", "--no-verify"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
    assert ".ortgate-staging" not in os.listdir(tmp_path / "out")


# ---- every bad input is exit 2 -----------------------------------------------------------------------------


def _one_line_error(code: int, err: str, names: str | Path, contains: str) -> None:
    assert code == 2, (code, err)
    assert err.count("\n") == 1 and err.startswith(f"ortgate: error: {names}"), err
    assert contains in err and "internal error" not in err, err


def _external_model(folder: Path, **external: str) -> Path:
    """x + w, w's 16 bytes in external data described by `external` (location, offset, length)."""
    folder.mkdir()
    (folder / "w.bin").write_bytes(b"\0" * 16)
    (folder / "sub").mkdir()
    w = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[4], data_location=TensorProto.EXTERNAL)
    for key, value in {"location": "w.bin", "offset": "0", "length": "16", **external}.items():
        w.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])], [w])
    path = folder / "model.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


EXTERNAL_CASES = {
    "location-dot": ({"location": "."}, "model.onnx", "location '.'"),
    "location-newline": ({"location": "a\nb"}, "model.onnx", "control characters"),
    "location-trailing-slash": ({"location": "sub/"}, "model.onnx", "location 'sub/'"),
    "location-tilde": ({"location": "~"}, "model.onnx", "location '~'"),
    "location-dotdot-inside": ({"location": "sub/../w.bin"}, "model.onnx", "'..'"),
    "offset-negative": ({"offset": "-8"}, "model.onnx", "offset '-8'"),
    "offset-2^63": ({"offset": str(2**63)}, "model.onnx", "offset '9223372036854775808'"),
    "length-negative": ({"length": "-16"}, "model.onnx", "length '-16'"),
    "length-2^63": ({"length": str(2**63)}, "model.onnx", "length '9223372036854775808'"),
    "offset-text": ({"offset": "abc"}, "model.onnx", "offset 'abc'"),
    "truncated": ({"offset": "8"}, "w.bin", "truncated: tensor 'w'"),
    "missing": ({"location": "gone.bin"}, "gone.bin", "tensor 'w' are missing"),
    "directory": ({"location": "sub"}, "sub", "not a regular file"),
}


@pytest.mark.parametrize("case", EXTERNAL_CASES)
def test_external_data_fix_would_read_is_checked_before_onnx_ir_sees_it(tmp_path, case, capsys):
    external, names, contains = EXTERNAL_CASES[case]
    model = _external_model(tmp_path / "m", **external)
    code = main(["fix", str(model), "-o", str(tmp_path / "out"), "--dry-run", "--select", "rmsnorm-not-fused"])
    _one_line_error(code, capsys.readouterr().err, model.parent / names, contains)


def _rmsnorm(x: str, y: str) -> tuple[list, list]:
    """A decomposed RMSNorm of `x` into `y` (nodes, initializers): something the fusions would take, so the model
    reaches onnx_ir."""
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.ones(4, np.float32), "gamma")]
    nodes = [helper.make_node("Pow", [x, "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", [x, "inv"], ["normed"]),
             helper.make_node("Mul", ["normed", "gamma"], [y])]
    return nodes, inits


def _function_model(path: Path, functions: dict[str, str], *, nodes: list | None = None) -> Path:
    """A graph calling local function F after a decomposed RMSNorm; `functions` maps each local function to the op
    its body calls."""
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    protos = [helper.make_function("local", name, ["a"], ["b"], [helper.make_node(body, ["a"], ["b"], domain="local")],
                                   opsets) for name, body in functions.items()]
    norm, inits = _rmsnorm("x", "h")
    graph = helper.make_graph(norm + (nodes or [helper.make_node("F", ["h"], ["y"], domain="local")]), "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=opsets, functions=protos), path)
    return path


@pytest.mark.parametrize("functions", [{"F": "F"}, {"F": "G", "G": "F"}], ids=["recursive", "mutually-recursive"])
def test_recursive_local_functions_are_an_input_error(tmp_path, functions, capsys):
    model = _function_model(tmp_path / "m.onnx", functions)
    code = main(["fix", str(model), "-o", str(tmp_path / "out"), "--dry-run", "--select", "rmsnorm-not-fused"])
    _one_line_error(code, capsys.readouterr().err, model, "local functions call each other in a cycle")


def test_a_graph_onnx_ir_refuses_is_an_input_error(tmp_path, capsys):
    """Two nodes writing one value: onnx loads it, onnx_ir refuses it."""
    path = tmp_path / "dup.onnx"
    norm, inits = _rmsnorm("x", "h")
    graph = helper.make_graph(norm + [helper.make_node("Relu", ["h"], ["y"]), helper.make_node("Relu", ["h"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    code = main(["fix", str(path), "-o", str(tmp_path / "out"), "--dry-run", "--select", "rmsnorm-not-fused"])
    _one_line_error(code, capsys.readouterr().err, path, "redeclared")


def test_system_refusals_name_the_path(tmp_path, capsys):
    long_name = tmp_path / ("a" * 300 + ".onnx")
    code = main(["lint", str(long_name)])
    _one_line_error(code, capsys.readouterr().err, long_name, "File name too long")
    loop = tmp_path / "loop1"
    loop.symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(loop)
    for args in (["lint", str(loop)], ["lint", str(EXAMPLE), "--policy", str(loop)],
                 ["fix", str(EXAMPLE), "-o", str(loop), "--dry-run"]):
        code = main(args)
        _one_line_error(code, capsys.readouterr().err, loop, "loop of symbolic links")


@pytest.mark.parametrize("out", [".", ".."])
def test_force_never_replaces_the_working_directory_or_above(tmp_path, make_model, monkeypatch, capsys, out):
    src = make_model(moe="dense_loop")
    work = tmp_path / "a" / "work"  # `..` holds no input: only the working-directory rule refuses it
    work.mkdir(parents=True)
    (work / "keep.txt").write_text("keep")
    monkeypatch.chdir(work)
    code = main(["fix", str(src), "-o", out, "--force", "--select", "moe-not-fused", "--no-verify"])
    _one_line_error(code, capsys.readouterr().err, out, "working directory")
    assert (work / "keep.txt").read_text() == "keep" and src.exists()


def test_a_full_disk_while_writing_out_names_out_and_leaves_nothing(tmp_path, make_model, monkeypatch, capsys):
    src = make_model(moe="dense_loop")

    def disk_full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    out = tmp_path / "out"
    code = main(["fix", str(src), "-o", str(out), "--select", "moe-not-fused", "--no-verify"])
    _one_line_error(code, capsys.readouterr().err, out, "No space left on device")
    assert not out.exists() and not _staging(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every file")
def test_unreadable_inputs_are_an_input_error(tmp_path, capsys):
    folder = tmp_path / "m"
    shutil.copytree(EXAMPLE, folder)
    os.chmod(folder / "genai_config.json", 0)
    code = main(["lint", str(folder)])
    _one_line_error(code, capsys.readouterr().err, folder / "genai_config.json", "ermission")


def test_with_stderr_closed_the_error_line_never_lands_in_stdout(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nexecution_provider:\n  name: cpu\n" + "".join(f"bogus{i}: 1\n" for i in range(50)))
    done = subprocess.run(f'"{sys.executable}" -m ortgate policy validate "{bad}" 2>&-', shell=True,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert (done.returncode, done.stdout) == (2, "")


def _shell(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(f'"{sys.executable}" -m ortgate {command}', shell=True, executable="/bin/bash",
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120,
                          cwd=REPO)


def test_a_closed_stdout_is_an_output_error_not_an_internal_one():
    done = _shell(f'lint "{EXAMPLE}" >&-')
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and "standard output is closed" in done.stderr, done.stderr


def test_a_closed_stderr_changes_nothing_but_the_error_lines():
    closed, shown = _shell(f'lint "{EXAMPLE}" 2>&-'), _shell(f'lint "{EXAMPLE}"')
    assert shown.returncode in (0, 1), shown.stderr
    assert (closed.returncode, closed.stdout) == (shown.returncode, shown.stdout)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("command", [f'lint "{EXAMPLE}"', f'lint "{EXAMPLE}" --format json', "rules"])
def test_a_full_stdout_is_an_output_error_naming_it(command):
    done = _shell(f"{command} > /dev/full")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert "standard output" in done.stderr and "No space left on device" in done.stderr, done.stderr


def test_a_broken_pipe_never_passes(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nexecution_provider:\n  name: cpu\n" + "".join(f"bogus{i}: 1\n" for i in range(2000)))
    done = subprocess.run(f'"{sys.executable}" -m ortgate policy validate "{bad}" 2>&1 | head -1; '
                          'exit "${PIPESTATUS[0]}"', shell=True, executable="/bin/bash", capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Exception ignored" not in done.stderr


# ---- signals and what a killed fix leaves ------------------------------------------------------------------


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signalled_fix_removes_its_staging_folder(tmp_path, make_model, signum, code):
    """The signal lands while the staged folder is written and not yet delivered, however loaded the machine: the
    fix waits at that point (the `after_write` seam) until the test has sent it."""
    src = make_model(moe="dense_loop")
    out = tmp_path / "out"
    hold = ("import sys, time\n"
            "import ortgate.fix.pipeline as pipeline\n"
            "def held(staged):\n"
            "    print('staged', flush=True)\n"
            "    time.sleep(600)\n"
            "pipeline.after_write = held\n"
            "from ortgate.cli.main import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", hold, "fix", str(src), "-o", str(out), "--select",
                             "moe-not-fused"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "staged\n", "fix ended before it staged anything"
        assert _staging(tmp_path)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, (proc.returncode, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert not out.exists() and not _staging(tmp_path)


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _killed_fix_staging(out: Path) -> Path:
    """A staging folder as a fix to `out` makes it, left by a process that is gone."""
    code = ("import sys; from pathlib import Path; from ortgate.fix.pipeline import staging_folder; "
            "f = staging_folder(Path(sys.argv[1])); (f / 'model.onnx').write_bytes(b'partial'); print(f)")
    done = subprocess.run([sys.executable, "-c", code, str(out)], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return Path(done.stdout.strip())


def test_the_next_fix_removes_staging_a_killed_fix_left_and_nothing_else(tmp_path, make_model):
    src = make_model(moe="dense_loop")
    out = tmp_path / "out"
    stale = _killed_fix_staging(out)
    marker = json.loads((stale / ".ortgate-staging").read_text())

    def staging(name: str, marker: dict | None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.onnx").write_bytes(b"partial")
        if marker is not None:
            (folder / ".ortgate-staging").write_text(json.dumps(marker))
        return folder

    live = staging(f".out.ortgate-tmp-{os.getpid()}-running", {"pid": os.getpid(),
                                                              "start": _process_start(os.getpid()), "output": "out"})
    other_out = staging(".other.ortgate-tmp-killed", {"pid": _dead_pid(), "start": "1", "output": "other"})
    unmarked = staging(".out.ortgate-tmp-user", None)
    copied = tmp_path / f".out.ortgate-tmp-{marker['pid']}-{'0' * 16}"
    shutil.copytree(stale, copied)  # a copy: the marker names another folder (inode)
    (copied / ".ortgate-staging").write_text(json.dumps({**marker, "token": "0" * 16}))
    assert main(["fix", str(src), "-o", str(out), "--select", "moe-not-fused", "--no-verify"]) == 0
    assert not stale.exists()
    assert live.exists() and other_out.exists() and unmarked.exists() and copied.exists()


def test_a_disk_that_fills_while_writing_sarif_leaves_no_file(tmp_path, monkeypatch, capsys):
    def disk_full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    sarif = tmp_path / "r.sarif"
    code = main(["lint", str(EXAMPLE), "--sarif", str(sarif)])
    _one_line_error(code, capsys.readouterr().err, sarif, "No space left on device")
    assert list(tmp_path.iterdir()) == []


def test_fusions_are_not_run_on_a_graph_with_nothing_they_could_match(tmp_path, monkeypatch, capsys):
    """A 3,000-node Relu chain: onnxscript's matchers would walk it for tens of seconds to change nothing."""
    import onnx_ir

    def never(*_args, **_kwargs):
        raise AssertionError("onnx_ir was handed a graph with nothing to fuse")

    monkeypatch.setattr(onnx_ir.serde, "deserialize_model", never)
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"]) for i in range(3000)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("v3000", TensorProto.FLOAT, [4])])
    path = tmp_path / "chain.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    for extra in (["--dry-run"], ["--no-verify"]):
        assert main(["fix", str(path), "-o", str(tmp_path / "out"), *extra]) == 0, capsys.readouterr().err
    assert not (tmp_path / "out").exists()
