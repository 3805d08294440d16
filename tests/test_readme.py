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


def test_example_output_in_readme_is_what_ortgate_prints(monkeypatch):
    match = re.search(r"<!-- EXAMPLE-OUTPUT: (.*?) -->\n```text\n(.*?)```", README, flags=re.S)
    assert match, "README shows real output of ortgate lint"
    command, shown = match.group(1), match.group(2)
    monkeypatch.chdir(REPO)
    code, out, _ = run_cli(*shlex.split(command)[1:])
    assert out == shown


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
