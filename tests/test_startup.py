"""What a short command's process pays besides its work: no cyclic garbage collection while it runs, none of
the shutdown's collections over what it built (the collector is restored for whoever called `main` in-process)."""

from __future__ import annotations

import gc
import importlib
import subprocess
import sys

from tests.conftest import EXAMPLES, POLICIES, REPO
from tests.helpers import run_cli

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"
CPU_POLICY = POLICIES / "tiny-moe-cpu.yaml"


PACKAGE = str(REPO / "ortgate")


def _collections_during(*args) -> tuple[int, int]:
    """The command's exit code, and how many collections started while ortgate's code ran (other than the first
    lines of `main`, before it pauses the collector)."""
    entry = importlib.import_module("ortgate.cli.main").main.__code__
    collections = []

    def count(phase, info):
        frame = sys._getframe(1)
        while frame is not None and not frame.f_code.co_filename.startswith(PACKAGE):
            frame = frame.f_back
        if phase == "start" and frame is not None and frame.f_code is not entry:
            collections.append(info["generation"])

    gc.callbacks.append(count)
    try:
        code, _out, _err = run_cli(*args)
    finally:
        gc.callbacks.remove(count)
    return code, len(collections)


def test_a_lint_runs_without_cyclic_collections_and_restores_the_collector():
    assert gc.isenabled()
    code, collections = _collections_during("lint", UNFUSED, "--policy", CPU_POLICY, "--format", "json")
    assert code == 1 and collections == 0
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        code, collections = _collections_during("rules")
        assert code == 0 and collections == 0 and not gc.isenabled()
    finally:
        gc.enable()


def test_long_commands_keep_the_collector(monkeypatch):
    cli = importlib.import_module("ortgate.cli.main")
    states: list[bool] = []
    monkeypatch.setattr(cli, "_main", lambda args: states.append(gc.isenabled()) or 0)
    for command in ("run", "fix", "lint", "policy", "estimate"):
        cli.main([command, "x"])
    assert states == [True, True, False, False, False] and gc.isenabled()


PROBE = """
import gc, sys
from ortgate.cli import main
sys.argv = ["ortgate", *sys.argv[1:]]
code = main()
print(code, gc.get_freeze_count() > 10000, gc.isenabled())
"""


def test_the_process_entry_leaves_its_objects_to_the_exit():
    done = subprocess.run([sys.executable, "-c", PROBE, "lint", str(UNFUSED), "--policy", str(CPU_POLICY), "--format",
                           "json", "--output", "/dev/null"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.stdout.split() == ["1", "True", "True"], done.stdout + done.stderr


EXIT_PROBE = """
import atexit, sys
from ortgate.cli.main import console
from ortgate.graph.index import Graph
Graph.__del__ = lambda self: print("graph freed", file=sys.stderr)
atexit.register(lambda: print("atexit ran", end=""))
print("buffered", end=" ")
sys.argv = ["ortgate", *sys.argv[1:]]
console()
"""


def test_the_process_leaves_lints_index_to_the_exit_after_doing_what_an_exit_does(tmp_path):
    """The `ortgate` process skips the interpreter's teardown after a lint (the graph index is never freed object
    by object), yet its atexit callbacks run, its buffered output is flushed and its exit code is main()'s."""
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-c", EXIT_PROBE, "lint", str(UNFUSED), "--policy", str(CPU_POLICY),
                           "--format", "json", "--output", str(report)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (1, "buffered atexit ran", "")
    assert report.read_text().startswith("{")
    # In-process, a lint frees its index when it returns, as any library call does.
    in_process = subprocess.run([sys.executable, "-c", EXIT_PROBE.replace("console()", "main(sys.argv[1:])").replace(
        "import console", "import main"), "lint", str(UNFUSED), "--format", "json", "--output", str(report)],
        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert in_process.returncode == 0 and "graph freed" in in_process.stderr, in_process.stderr
    # A longer command (run, fix) ends through the interpreter's own exit.
    usage = subprocess.run([sys.executable, "-c", EXIT_PROBE, "run"], capture_output=True, text=True, cwd=REPO,
                           timeout=120)
    assert usage.returncode == 2 and usage.stdout == "buffered atexit ran", usage.stdout + usage.stderr


def test_version_reads_the_kernel_table_only():
    """The knowledge package loads a module (and its file) when one of its names is first used: `--version`
    reads kernels.json and no other knowledge file."""
    probe = ("import io, sys\nfrom ortgate.cli import main\nsys.stdout = io.StringIO()\ncode = main(['--version'])\n"
             "sys.stdout = sys.__stdout__\n"
             "print(code, ' '.join(sorted(m for m in sys.modules if m.startswith('ortgate.knowledge'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    code, modules = done.stdout.split(" ", 1)
    assert code == "0", done.stderr
    # op_keys is a leaf of kernels (the one spelling of an op key) and reads no file
    assert set(modules.split()) == {"ortgate.knowledge", "ortgate.knowledge.kernels", "ortgate.knowledge.loader",
                                    "ortgate.knowledge.op_keys"}
