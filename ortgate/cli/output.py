"""What every subcommand shares: exit codes, the one-line error, writing outputs, the progress spinner."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ortgate.errors import InputError

EXIT_PASS, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


def error(message: str) -> None:
    print(f"ortgate: error: {message}", file=sys.stderr)


def split_list(value: str | None) -> list[str] | None:
    """'a, b,,c' -> ['a', 'b', 'c']; None stays None."""
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


def check_output_path(output: str | None, inputs: list[str | None]) -> None:
    """Never write over something the user gave us."""
    if output is None:
        return
    out = Path(output)
    for given in inputs:
        if given and out.exists() and Path(given).exists() and out.resolve() == Path(given).resolve():
            raise InputError("refusing to write the report over an input file", output)
    if out.exists() and out.is_dir():
        raise InputError("is a directory", output)
    if not out.parent.exists():
        raise InputError("its folder does not exist", output)


def check_distinct_outputs(paths: list[str | None]) -> None:
    seen: dict[Path, str] = {}
    for p in paths:
        if p is None:
            continue
        key = Path(p).resolve()
        if key in seen:
            raise InputError("two outputs would be written to the same file", p)
        seen[key] = p


def write(text: str, output: str | None) -> None:
    """`text` to stdout, or to the file `output`."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    try:
        Path(output).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", output) from None


# A lint that ends sooner than this shows no spinner at all (no flicker on small models).
PROGRESS_DELAY_S = 0.4


def progress_wanted() -> bool:
    """Progress goes to stderr only when stderr is an interactive terminal (never in CI logs or pipes)."""
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


@contextmanager
def progress(enabled: bool, delay: float | None = None) -> Iterator:
    """A transient spinner on stderr saying what is being loaded or analysed, once the work has taken longer
    than `delay` seconds (default PROGRESS_DELAY_S). Yields `note(message)`; does nothing when not enabled."""
    if not enabled:
        yield lambda _msg: None
        return
    import threading

    from rich.console import Console

    status = Console(stderr=True).status("ortgate: starting")
    lock = threading.Lock()
    state = {"shown": False, "over": False}

    def show() -> None:
        with lock:
            if not state["over"]:
                status.start()
                state["shown"] = True

    delay = PROGRESS_DELAY_S if delay is None else delay
    timer = threading.Timer(delay, show)
    timer.daemon = True
    if delay > 0:
        timer.start()
    else:
        show()
    try:
        yield lambda msg: status.update(f"ortgate: {msg}")
    finally:
        timer.cancel()
        with lock:
            state["over"] = True
            if state["shown"]:
                status.stop()
