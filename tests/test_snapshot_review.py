"""A snapshot that differs is left pending for review (tests/snapshot.py), never rewritten by the test; the review
script shows its diff and accepts or rejects it."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO
from tests.snapshot import check_snapshot, pending_path


def _review():
    spec = importlib.util.spec_from_file_location("review_snapshots", REPO / "scripts" / "review_snapshots.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_a_differing_snapshot_is_left_pending_and_the_snapshot_kept(tmp_path):
    path = tmp_path / "case.txt"
    path.write_text("old\n")
    with pytest.raises(AssertionError, match=r"case.txt.new"):
        check_snapshot(path, "new\n")
    assert path.read_text() == "old\n" and pending_path(path).read_text() == "new\n"
    check_snapshot(path, "old\n")  # the output is back to the snapshot: nothing left pending
    assert not pending_path(path).exists()


def test_a_missing_snapshot_fails_and_is_left_pending(tmp_path):
    path = tmp_path / "new-case.txt"
    with pytest.raises(AssertionError, match="no snapshot"):
        check_snapshot(path, "first\n")
    assert not path.exists() and pending_path(path).read_text() == "first\n"


def test_review_shows_the_diff_then_accepts_or_rejects(tmp_path, monkeypatch, capsys):
    review = _review()
    monkeypatch.setattr(review, "REPO", tmp_path)
    (tmp_path / "tests").mkdir()
    kept, dropped = tmp_path / "tests" / "a.txt", tmp_path / "tests" / "b.txt"
    for path in (kept, dropped):
        path.write_text("old\n")
        pending_path(path).write_text("new\n")
    assert review.main([]) == 0
    out = capsys.readouterr().out
    assert "-old\n+new\n" in out and "a/tests/a.txt" in out and "a/tests/b.txt" in out
    assert review.main(["--accept", str(kept)]) == 0
    assert kept.read_text() == "new\n" and not pending_path(kept).exists()
    assert review.main(["--reject"]) == 0
    assert dropped.read_text() == "old\n" and not pending_path(dropped).exists()
