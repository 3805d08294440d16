"""What every subcommand shares: exit codes, the one-line error, writing outputs, the progress spinner."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from ortgate.errors import InputError

EXIT_PASS, EXIT_FAIL, EXIT_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


class Terminated(BaseException):
    """SIGTERM arrived: unwinds like KeyboardInterrupt, so every `finally` and cleanup on the way runs; exit 143."""


@contextmanager
def terminate_cleanly() -> Iterator[None]:
    """While inside, SIGTERM raises Terminated (in the main thread) instead of killing the process outright, so a
    command that stages files (fix) removes them before it exits."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(_signum, _frame):
        raise Terminated

    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def error(message: str) -> None:
    """The one error line on stderr; nothing when stderr is closed (`2>&-`: the line must not land in stdout's
    report)."""
    if sys.stderr is None:
        return
    print(f"ortgate: error: {message}", file=sys.stderr)


def split_list(value: str | None) -> list[str] | None:
    """'a, b,,c' -> ['a', 'b', 'c']; None stays None."""
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


class Output(NamedTuple):
    """A path ortgate is about to write: a report, a side report, a baseline, a dump, a trace, a folder.

    (A NamedTuple, not a dataclass: every command imports this module, and `ortgate --help` must not pay for
    importing dataclasses.)"""

    path: str
    what: str  # said in the error: "report", "SARIF report", "baseline", "optimized dump", ...
    folder: bool = False  # an output folder: it may neither be nor contain a file ortgate reads
    may_replace: str | None = None  # the one input it may rewrite: --baseline F --write-baseline F


def check_outputs(outputs: Iterable[Output | None], reads: Iterable[str | Path | None]) -> None:
    """Refuse (InputError, exit 2) any output that is, replaces or (a folder) contains a file ortgate reads, two
    outputs on one file, and outputs that cannot be written. Symlinks are resolved and hard links compared by
    inode, so no spelling of a path reaches an input. Call it once every input is known, before writing."""
    read = [_Target(r) for r in dict.fromkeys(str(r) for r in reads if r)]
    seen: dict[Path, Output] = {}
    for out in outputs:
        if out is None:
            continue
        target = _Target(out.path)
        allowed = _Target(out.may_replace) if out.may_replace else None
        for source in read:
            if allowed is not None and source.same(allowed):
                continue
            if target.same(source):
                raise InputError(f"refusing to write the {out.what} over an input file{_input_name(source, out)}",
                                 out.path)
            if out.folder and source.inside(target):
                raise InputError(f"refusing to write the {out.what} into a folder that holds an input file "
                                 f"({source.given})", out.path)
        if target.resolved in seen:
            raise InputError(f"two outputs would be written to the same file (the {seen[target.resolved].what} "
                             f"and the {out.what})", out.path)
        seen[target.resolved] = out
        if out.folder:
            if target.exists and not target.path.is_dir():
                raise InputError("exists and is not a folder", out.path)
            continue
        if target.path.is_dir():
            raise InputError("is a directory", out.path)
        if not target.resolved.parent.is_dir():
            raise InputError("its folder does not exist", out.path)


class _Target:
    def __init__(self, path: str | Path):
        self.given = str(path)
        self.path = Path(path)
        try:
            self.resolved = self.path.resolve()
        except (OSError, RuntimeError):  # a symlink loop: compared as written
            self.resolved = Path(os.path.abspath(self.path))
        try:
            st = os.stat(self.path)
            self.inode: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except (OSError, ValueError):
            self.inode = None

    @property
    def exists(self) -> bool:
        return self.inode is not None

    def same(self, other: _Target) -> bool:
        return self.resolved == other.resolved or (self.inode is not None and self.inode == other.inode)

    def inside(self, folder: _Target) -> bool:
        return self.resolved.is_relative_to(folder.resolved)


def _input_name(source: _Target, out: Output) -> str:
    """Which input, when the output path does not say it already (a symlink, a hard link, a file in MODEL's
    folder, a policy's base)."""
    return "" if source.given == out.path else f" ({source.given})"


def write(text: str, output: str | None) -> None:
    """`text` to stdout, or to the file `output`, replaced whole: written to a temporary file in the same folder
    and renamed over it, so an interrupted write never leaves half a report over a good one."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_file(output, text.encode("utf-8"))


def write_file(output: str | Path, data: bytes) -> None:
    """Replace the file `output` (through a symlink: the file it points to) with `data`, atomically. A path that
    is not a regular file cannot be replaced, and must never be: a character device (/dev/stdout, a terminal) or a
    FIFO with a reader is written in place; a FIFO nobody reads (it would block forever), a block device or a
    socket is refused."""
    target = Path(output)
    try:
        target = target.resolve()  # a symlinked report stays a symlink; its target gets the new text
        if target.exists() and not target.is_file():
            _write_special(target, data, output)
            return
        import secrets

        tmp = target.with_name(_temporary_name(target.name, secrets.token_hex(4)))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if target.is_file():
                os.chmod(tmp, target.stat().st_mode & 0o7777)  # replacing keeps the file's permissions
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    except (OSError, RuntimeError) as exc:
        raise InputError(f"cannot write: {getattr(exc, 'strerror', None) or exc}", output) from None


# Longest file name most filesystems take (bytes): a temporary name beside a long report name stays under it.
NAME_MAX = 255


def _temporary_name(name: str, token: str) -> str:
    """The temporary file's name beside `name`: `.NAME.PID.TOKEN.tmp`, or a short `.ortgate-PID-TOKEN.tmp` where
    that would pass NAME_MAX (a valid 254-byte report name must still be writable)."""
    long = f".{name}.{os.getpid()}.{token}.tmp"
    return long if len(os.fsencode(long)) <= NAME_MAX else f".ortgate-{os.getpid()}-{token}.tmp"


def _write_special(target: Path, data: bytes, output: str | Path) -> None:
    import stat

    mode = os.stat(target).st_mode
    if stat.S_ISFIFO(mode):
        try:  # non-blocking: a FIFO nobody reads fails at once (ENXIO) instead of waiting forever
            fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                raise InputError("is a FIFO with no reader; ortgate does not wait for one", output) from None
            raise
        os.set_blocking(fd, True)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return
    if not stat.S_ISCHR(mode):
        raise InputError("is not a regular file (a block device or a socket); ortgate writes only files, FIFOs "
                         "and terminals", output)
    with open(target, "wb") as fh:
        fh.write(data)


def terminal_options(output: str | None) -> dict:
    """Colour and the terminal's width when the report goes to a terminal; else none (a fixed width)."""
    if output is not None or not sys.stdout.isatty() or os.environ.get("TERM") == "dumb":
        return {"color": False, "width": None}
    import shutil

    return {"color": "NO_COLOR" not in os.environ, "width": shutil.get_terminal_size().columns}


# A lint that ends sooner than this shows no spinner at all (no flicker on small models).
PROGRESS_DELAY_S = 0.4


def progress_wanted() -> bool:
    """Progress goes to stderr only when stderr is an interactive terminal (never in CI logs or pipes)."""
    return sys.stderr is not None and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


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


def require_onnxruntime(command: str) -> None:
    """`ortgate run` and a verified `ortgate fix` build real sessions; the linter alone is installed without ONNX
    Runtime, so their users are told which extra brings it."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise InputError(f"{command} needs ONNX Runtime, which is not installed here ({exc}): install the build "
                         "for this machine, pip install 'ortgate[gpu]' (CUDA) or pip install 'ortgate[cpu]'") from None


def release_notice(inputs) -> None:
    """A release newer than ortgate's knowledge is judged by the newest known release: said on stderr (the report
    itself stays a function of the judged release)."""
    ort = inputs.deployment.ort
    if ort.judged_as != ort.version and sys.stderr is not None:
        print(f"ortgate: note: onnxruntime {ort.version} is newer than ortgate's knowledge covers; judged as "
              f"{ort.judged_as}", file=sys.stderr)
