"""`ortgate fix` against hostile surroundings: outputs that hold inputs, folders that appear while it runs, signals,
stale staging folders, odd modes. Nothing the user has is deleted; every refusal is one line and exit 2."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ortgate.cli import main
from ortgate.engine.fix import run_fix
from ortgate.errors import InputError
from ortgate.fix.pipeline import FixRequest


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
