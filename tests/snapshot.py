"""Snapshots are reviewed, not rewritten: a test whose output differs from its committed snapshot writes what it got
beside it as a pending `<snapshot>.new` file and fails; `python scripts/review_snapshots.py` shows each pending file's
diff and `--accept` moves the reviewed ones over their snapshots. A test whose output matches removes a pending file
it left before. (Pending files are ignored by git: they are never committed by accident.)"""

from __future__ import annotations

from pathlib import Path

PENDING = ".new"
REVIEW = "python scripts/review_snapshots.py shows the diff; --accept takes it"


def pending_path(path: Path) -> Path:
    return path.with_name(path.name + PENDING)


def check_snapshot(path: Path, actual: str, what: str | None = None) -> None:
    """Assert that `path` holds `actual`; otherwise write `actual` to `path`.new for review and fail."""
    pending = pending_path(path)
    expected = path.read_text(encoding="utf-8") if path.is_file() else None
    if actual == expected:
        pending.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(actual, encoding="utf-8")
    said = what or path.name
    if expected is None:
        raise AssertionError(f"no snapshot {path}: {said} written to {pending.name} for review ({REVIEW})")
    raise AssertionError(f"{said} differs from {path.name}: what it is now is in {pending.name} ({REVIEW})")
