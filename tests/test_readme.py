"""The README's examples are executed, so the documentation cannot drift from the tool."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

from ortgate.config.policy import load_policy
from tests.conftest import REPO
from tests.helpers import run_cli

README = (REPO / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_policy_example_is_a_valid_policy(tmp_path):
    (example,) = [b for b in _blocks("yaml") if b.startswith("name: qwen3.6-35b-a3b-h100")]
    path = tmp_path / "policy.yaml"
    path.write_text(example)
    policy = load_policy(path)
    assert policy.get("model", "attention_layers") == 10
    assert policy.get("execution_provider", "options", "enable_cuda_graph") == "1"


def test_setup_command_lints_a_shipped_example(monkeypatch):
    setup = _blocks("sh")[0]
    lint = setup[setup.index("ortgate lint"):].strip()
    args = shlex.split(lint)[1:]
    monkeypatch.chdir(REPO)
    code, out, err = run_cli(*args)
    assert code == 1, err  # the unfused example fails its gate, by design
    assert "moe-not-fused" in out


def _update_readme():
    import importlib.util

    spec = importlib.util.spec_from_file_location("update_readme", REPO / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_output_block_is_what_ortgate_prints():
    # Every ```text block that shows a command's output is one of the generated blocks, and each is that command's
    # output now (a measured one with its numbers masked): run, estimate and fix as well as lint.
    update = _update_readme()
    blocks = list(update.MARKER.finditer(README))
    commands = [m.group(2).split()[1] for m in blocks]
    assert {"lint", "run", "estimate", "fix"} <= set(commands), commands
    shown = [b for b in _blocks("text") if b.startswith("$ ortgate ")]
    assert len(shown) == len(blocks), "a command-output block that is not generated"
    for m in blocks:
        fresh = update.example_block(m.group(2), bool(m.group(1)))
        if m.group(1):
            assert update.normalized(fresh) == update.normalized(m.group(0)), m.group(2)
        else:
            assert fresh == m.group(0), m.group(2)


def test_an_example_never_writes_where_its_command_says_nor_reads_what_is_there(tmp_path):
    """The README's fix example names a folder outside the repository; a reader who ran it has that folder. The
    examples are run against a fresh folder shown under the command's name, so their output does not depend on what
    the machine holds there, and nothing is written there."""
    update = _update_readme()
    out = tmp_path / "fixed"
    command = f"ortgate fix examples/qwen3-moe-tiny-unfused -o {out} --dry-run"
    code, text = update.run_example(command)
    out.mkdir()
    (out / "mine.txt").write_text("a reader's own file")
    assert update.run_example(command) == (code, text) and code == 0
    assert f"-> {out} (dry run" in text
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_the_setup_example_is_said_to_fail_by_design():
    update = _update_readme()
    code, _ = update.run_example(update.EXAMPLE_COMMAND)
    assert code == 1
    assert "exits 1" in README[:README.index("<!-- EXAMPLE-OUTPUT")]
    assert f"$ {update.EXAMPLE_COMMAND}\n" in README and "$ echo $?\n1\n" in README


def test_snippets_pin_nothing_that_does_not_exist():
    # No release tag and no package-index release exist yet: snippets install from the repository at a commit.
    code = [line.split(" #")[0] for lang in ("yaml", "sh") for block in _blocks(lang) for line in block.splitlines()]
    assert not [line for line in code if "0.1.0" in line]  # only comments say what changes once it is released
    assert any("uses: ortgate/ortgate@COMMIT" in line for line in code)
    assert any("rev: COMMIT" in line for line in code)
    assert any("git+https://github.com/ortgate/ortgate@" in line for line in code)


def test_the_baseline_the_actions_snippet_passes_is_an_adoption_step(tmp_path, monkeypatch):
    assert "--write-baseline ortgate-baseline.json" in README
    monkeypatch.chdir(REPO)
    missing = tmp_path / "ortgate-baseline.json"
    code, _, err = run_cli("lint", "examples/qwen3-moe-tiny-unfused", "--baseline", missing)
    assert code == 2 and "create the baseline once with" in err and f"--write-baseline {missing}" in err
    assert "Traceback" not in err


def test_the_readme_rules_table_and_example_are_what_update_readme_generates():
    # A rule added, renamed or re-levelled without regenerating README.md fails here.
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "update_readme.py"), "--check"],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_the_readmes_git_lfs_pulls_fetch_every_file_lint_reads(tmp_path):
    """A CI snippet's `git lfs pull --include` brings model.onnx and genai_config.json (never the weights): a file it
    leaves behind as a pointer would be refused as a Git LFS pointer."""
    from fnmatch import fnmatch

    pulls = re.findall(r'git lfs pull --include "([^"]+)" --exclude "([^"]+)"', README)
    assert pulls
    for include, exclude in pulls:
        patterns = include.split(",")
        for wanted in ("models/qwen/model.onnx", "models/qwen/genai_config.json"):
            assert any(fnmatch(wanted, p.replace("**/", "*")) for p in patterns), (include, wanted)
        assert fnmatch("models/qwen/model.onnx.data", exclude.replace("**/", "*"))
    pointer = tmp_path / "genai_config.json"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 1234\n")
    (tmp_path / "model.onnx").write_bytes(pointer.read_bytes())
    code, out, err = run_cli("lint", tmp_path)
    assert code == 2 and "Git LFS pointer" in err and "run git lfs pull" in err
