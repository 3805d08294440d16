"""How long does the `ortgate` command take to start? Target: `ortgate --help` and `ortgate rules` within 2x of a
bare `python -c "import yaml"`, each timed as a whole process (interpreter start, imports, output); the small
example's lint is timed beside them.

Runs every command in fresh processes, interleaved round by round so that machine load hits all of them alike,
and prints the median wall time of each and its ratio to the bare-Python reference. It also reports which heavy
modules (onnx, onnxruntime, numpy, jsonschema, rich) each command imported: the answer should be none for the
commands that read no model.

    python benchmarks/cli_startup.py               # 21 rounds
    python benchmarks/cli_startup.py --rounds 51
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET = 2.0
HEAVY = ("onnx", "onnxruntime", "numpy", "jsonschema", "rich")
IMPORTS_PROBE = f"""
import json, sys
from ortgate.cli.main import main  # the command in process: the console script's os._exit would skip the probe
try:
    main(sys.argv[1:])
except SystemExit:
    pass
sys.stderr.write("\\n" + json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))))
"""


def ortgate_command() -> list[str]:
    """The installed console script beside this interpreter (what a user runs), else `python -m ortgate`."""
    script = Path(sys.executable).with_name("ortgate")
    if script.is_file():
        return [str(script)]
    found = shutil.which("ortgate")
    return [found] if found else [sys.executable, "-m", "ortgate"]


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, cwd=REPO)
    return time.perf_counter() - start


def heavy_imports(args: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", IMPORTS_PROBE, *args], capture_output=True, text=True, cwd=REPO,
                          check=False)
    try:
        return json.loads(done.stderr.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return ["<could not tell: " + done.stderr.strip()[-200:] + ">"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="fresh processes per command")
    args = parser.parse_args(argv)

    ortgate = ortgate_command()
    commands = {
        'python -c "import yaml"': [sys.executable, "-c", "import yaml"],
        "ortgate --help": [*ortgate, "--help"],
        "ortgate rules": [*ortgate, "rules"],
        "ortgate explain moe-not-fused": [*ortgate, "explain", "moe-not-fused"],
        "ortgate --version": [*ortgate, "--version"],
        "ortgate policy validate policies/tiny-moe-cpu.yaml": [*ortgate, "policy", "validate",
                                                               "policies/tiny-moe-cpu.yaml"],
        "ortgate lint examples/qwen3-moe-tiny-unfused --policy policies/tiny-moe-cpu.yaml":
            [*ortgate, "lint", "examples/qwen3-moe-tiny-unfused", "--policy", "policies/tiny-moe-cpu.yaml"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for argv_ in commands.values():  # warm the page cache and the bytecode caches
        wall(argv_)
    for _ in range(args.rounds):
        for name, argv_ in commands.items():
            times[name].append(wall(argv_))

    print(f"{os.cpu_count()} CPU cores, Python {platform.python_version()} ({sys.executable}), {args.rounds} rounds, "
          f"command {' '.join(ortgate)}")
    reference = statistics.median(times['python -c "import yaml"'])
    failed = False
    print(f"{'command':<84} {'median':>9} {'ratio':>7}  target  heavy modules imported")
    for name, samples in times.items():
        median = statistics.median(samples)
        ratio = median / reference
        heavy = "" if name.startswith("python") else ", ".join(heavy_imports(commands[name][len(ortgate):])) or "none"
        verdict = ""
        if name in ("ortgate --help", "ortgate rules"):
            verdict = "PASS" if ratio <= TARGET else "FAIL"
            failed |= ratio > TARGET
        print(f"{name:<84} {median * 1000:>7.1f}ms {ratio:>6.2f}x  {verdict:<6}  {heavy}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
