"""Review the snapshots the tests left pending: each `<snapshot>.new` a test wrote because its output differed from
the committed snapshot (tests/snapshot.py).

    python scripts/review_snapshots.py                  # list every pending snapshot with its diff
    python scripts/review_snapshots.py --accept         # after review: move every pending file over its snapshot
    python scripts/review_snapshots.py --accept PATH..  # ... only these (a snapshot's path or its .new file's)
    python scripts/review_snapshots.py --reject         # delete every pending file
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PENDING = ".new"
ROOTS = ("tests",)


def pending_files() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob(f"*{PENDING}") if p.is_file())


def snapshot_of(pending: Path) -> Path:
    return pending.with_name(pending.name[: -len(PENDING)])


def diff(pending: Path) -> str:
    snapshot = snapshot_of(pending)
    old = snapshot.read_text(encoding="utf-8").splitlines(keepends=True) if snapshot.is_file() else []
    new = pending.read_text(encoding="utf-8").splitlines(keepends=True)
    name = str(snapshot.relative_to(REPO))
    return "".join(difflib.unified_diff(old, new, f"a/{name}", f"b/{name}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="with --accept or --reject: only these snapshots")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--accept", action="store_true", help="move the pending files over their snapshots")
    action.add_argument("--reject", action="store_true", help="delete the pending files")
    args = parser.parse_args(argv)
    found = pending_files()
    if args.paths:
        wanted = {Path(p).resolve() for p in args.paths}
        found = [p for p in found if p.resolve() in wanted or snapshot_of(p).resolve() in wanted]
    if not found:
        print("no pending snapshots")
        return 0
    for pending in found:
        snapshot = snapshot_of(pending)
        if args.accept:
            pending.replace(snapshot)
            print(f"accepted {snapshot.relative_to(REPO)}")
        elif args.reject:
            pending.unlink()
            print(f"rejected {snapshot.relative_to(REPO)}")
        else:
            print(diff(pending) or f"{snapshot.relative_to(REPO)}: new snapshot\n{pending.read_text(encoding='utf-8')}")
    if not (args.accept or args.reject):
        print(f"{len(found)} pending snapshot(s): review, then --accept (or --reject)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
