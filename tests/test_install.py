"""The dependency split: the linter installs and runs without ONNX Runtime, and the commands that read no model
import neither onnx nor onnxruntime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, POLICIES, REPO

UNFUSED = EXAMPLES / "qwen3-moe-tiny-unfused"
CPU_POLICY = POLICIES / "tiny-moe-cpu.yaml"

# Runs the console entry point in a fresh interpreter and prints (on stderr, last line) the modules it imported:
# what a user's `ortgate ...` process loads.
PROBE = """
import json, sys
from ortgate.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:  # argparse's --help
    code = exc.code
sys.stdout.flush()
sys.stderr.write("\\n" + json.dumps(sorted(sys.modules)) + "\\n")
raise SystemExit(code)
"""


def _imported(python: str | Path, *args: str, packages: bool = True) -> tuple[int, str, set[str]]:
    """The exit code, stdout, and the top-level packages imported (every module, with packages=False)."""
    done = subprocess.run([str(python), "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO, timeout=120)
    modules = json.loads(done.stderr.strip().splitlines()[-1])
    return done.returncode, done.stdout, {m.split(".")[0] for m in modules} if packages else set(modules)


@pytest.mark.parametrize("args", [
    ["--help"],
    ["--version"],
    ["rules"],
    ["rules", "--format", "json"],
    ["explain", "moe-not-fused"],
    ["policy", "validate", str(CPU_POLICY)],
    ["lint", "--help"],
    ["run", "--help"],
], ids=" ".join)
def test_commands_that_read_no_model_import_neither_onnx_nor_onnxruntime(args):
    code, out, modules = _imported(sys.executable, *args)
    assert code == 0 and out
    assert "onnx" not in modules and "onnxruntime" not in modules, sorted(modules)


def test_help_and_rules_import_no_heavy_library():
    for args in (["--help"], ["rules"]):
        _code, _out, modules = _imported(sys.executable, *args)
        assert not modules & {"onnx", "onnxruntime", "numpy", "jsonschema", "rich", "google"}, (args, sorted(modules))


EXPORT = REPO / "tests" / "fixtures" / "exported" / "dynamo-qwen3_moe"


@pytest.mark.parametrize("args", [
    ["lint", str(UNFUSED), "--policy", str(CPU_POLICY)],
    ["lint", str(EXPORT / "model.onnx"), "--policy", str(CPU_POLICY), "--optimized",
     str(EXPORT / "model.optimized.onnx"), "--format", "json"],
    ["estimate", str(EXPORT / "model.onnx"), "--device", "h100-sxm"],
], ids=lambda args: f"{args[0]}-{Path(args[1]).parent.name}")
def test_lint_and_estimate_of_a_real_export_import_neither_onnx_nor_onnxruntime(args):
    """The model is parsed with ortgate.proto's classes of onnx's schema and its small constants decoded without
    numpy: `import onnx` (about a second, numpy and ml_dtypes with it) is never paid by a lint."""
    code, out, modules = _imported(sys.executable, *args)
    assert code in (0, 1) and ("moe-not-fused" in out or args[0] == "estimate"), out[-2000:]
    assert not modules & {"onnx", "onnxruntime", "numpy", "ml_dtypes"}, sorted(modules)
    # A valid policy is decided by ortgate.config.schema_check: jsonschema is imported only to explain a bad one.
    assert "jsonschema" not in modules, sorted(modules)
    if args[0] == "lint":  # a text report that fits in plain lines is written without rich
        assert "rich" not in modules, sorted(modules)


@pytest.fixture(scope="module")
def without_onnxruntime(tmp_path_factory) -> Path:
    """A real virtual environment that sees every installed package (ortgate included) except onnxruntime."""
    root = tmp_path_factory.mktemp("no-ort") / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    python = root / "bin" / "python"
    target = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                          text=True).strip())
    source = Path(sysconfig.get_paths()["purelib"])  # where pip installed ortgate and its dependencies
    for entry in source.iterdir():
        name = entry.name.lower()
        if name.startswith("onnxruntime") or name == "__pycache__" or (target / entry.name).exists():
            continue
        os.symlink(entry, target / entry.name)
    return python


def test_lint_runs_in_an_environment_without_onnxruntime(without_onnxruntime):
    python = str(without_onnxruntime)
    missing = subprocess.run([python, "-c", "import onnxruntime"], capture_output=True, text=True)
    assert missing.returncode != 0 and "No module named 'onnxruntime'" in missing.stderr
    done = subprocess.run([python, "-m", "ortgate", "lint", str(UNFUSED), "--policy", str(CPU_POLICY), "--format",
                           "json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert "moe-not-fused" in {f["rule"] for f in report["findings"]} and done.stderr == ""


def test_run_without_onnxruntime_names_the_extra_to_install(without_onnxruntime):
    done = subprocess.run([str(without_onnxruntime), "-m", "ortgate", "run", str(UNFUSED), "--policy",
                           str(CPU_POLICY)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("ortgate: error: `ortgate run` needs ONNX Runtime") and done.stderr.count("\n") == 1
    assert "ortgate[gpu]" in done.stderr and "ortgate[cpu]" in done.stderr and "Traceback" not in done.stderr


def test_version_without_onnxruntime_says_so(without_onnxruntime):
    done = subprocess.run([str(without_onnxruntime), "-m", "ortgate", "--version"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0
    assert "onnxruntime not installed" in done.stdout and "ortgate[cpu]" in done.stdout


def test_fix_without_onnxruntime_names_the_extra_and_writes_nothing(without_onnxruntime, tmp_path):
    out = tmp_path / "fixed"
    done = subprocess.run([str(without_onnxruntime), "-m", "ortgate", "fix", str(UNFUSED), "-o", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and not out.exists()
    assert done.stderr.startswith("ortgate: error: `ortgate fix` (it verifies the rewrite on ONNX Runtime")
    assert done.stderr.count("\n") == 1 and "ortgate[cpu]" in done.stderr and "Traceback" not in done.stderr


def test_no_command_ends_in_an_internal_error_without_onnxruntime(without_onnxruntime, tmp_path):
    """The linter-only install (what action.yml installs) answers every command with a report, or with one exit-2
    line naming what to add; never exit 3, never a traceback."""
    cpu = tmp_path / "cpu.yaml"  # the cpu device without a calibration: nothing to measure with
    cpu.write_text("name: p\nextends: builtin:cpu\nthroughput: {device: cpu, min_tokens_per_s: 5}\n")
    model = str(UNFUSED)
    commands = [
        *(["lint", model, "--policy", str(policy), "--format", fmt] for policy in (cpu, CPU_POLICY)
          for fmt in ("text", "json", "sarif", "github", "markdown", "junit", "codequality")),
        ["lint", model], ["lint", model, "--policy", str(cpu), "--write-baseline", str(tmp_path / "b.json")],
        ["estimate", model, "--device", "cpu"], ["estimate", model, "--device", "cpu", "--probe"],
        ["estimate", model, "--policy", str(cpu)], ["estimate", model, "--policy", str(CPU_POLICY)],
        ["estimate", model, "--device", "h100-sxm", "--format", "json"], ["estimate", "--list-devices"],
        ["policy", "validate", str(cpu)], ["policy", "show", str(cpu), "--format", "json"],
        ["rules"], ["explain", "throughput-not-judged"], ["--version"],
        ["run", model, "--policy", str(cpu)], ["fix", model, "-o", str(tmp_path / "out")],
        ["fix", model, "-o", str(tmp_path / "out"), "--dry-run"],
    ]
    answers = {}
    for args in commands:
        done = subprocess.run([str(without_onnxruntime), "-m", "ortgate", *args], capture_output=True, text=True,
                              cwd=REPO, timeout=180)
        answers[" ".join(args)] = done.returncode
        assert done.returncode in (0, 1, 2) and "Traceback" not in done.stderr, (args, done.stderr)
        if done.returncode == 2:
            assert done.stderr.count("\n") == 1 and "ortgate[cpu]" in done.stderr, (args, done.stderr)
    assert answers[f"estimate {model} --device cpu --probe"] == 2
    assert answers[f"estimate {model} --device h100-sxm --format json"] == 0
    validate = subprocess.run([str(without_onnxruntime), "-m", "ortgate", "policy", "validate", str(cpu)],
                              capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "throughput.device cpu: lint judges no throughput target" in validate.stdout
    lint = subprocess.run([str(without_onnxruntime), "-m", "ortgate", "lint", model, "--policy", str(cpu), "--format",
                           "json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "throughput-not-judged" in {f["rule"] for f in json.loads(lint.stdout)["findings"]}


REPORTER_MODULES = {"text": "text", "json": "json_report", "sarif": "sarif", "github": "github",
                    "markdown": "markdown", "junit": "junit", "codequality": "codequality"}


@pytest.mark.parametrize("fmt", sorted(REPORTER_MODULES))
def test_a_lint_loads_the_one_reporter_it_writes_and_nothing_of_run_or_fix(fmt):
    """Each reporter module is imported when its format is asked for; the runner's evidence, the runner and the
    repairs are `ortgate run`'s and `ortgate fix`'s alone."""
    code, out, modules = _imported(sys.executable, "lint", str(UNFUSED), "--policy", str(CPU_POLICY), "--format", fmt,
                                   packages=False)
    assert code == 1 and out, out[-2000:]
    loaded = {name for name, module in REPORTER_MODULES.items() if f"ortgate.report.{module}" in modules}
    assert loaded == {fmt}, sorted(loaded)
    heavy = {m for m in modules if m == "ortgate.evidence" or m.startswith(("ortgate.runner", "ortgate.fix"))}
    assert not heavy, sorted(heavy)


def test_the_reporter_table_above_is_every_lint_format():
    from ortgate.cli.lint import LINT_FORMATS

    assert set(LINT_FORMATS) == set(REPORTER_MODULES)
