"""`ortgate lint` shows a spinner on an interactive terminal while it loads and analyses, and never writes
progress (text or ANSI codes) when stderr is not a terminal: a pipe, a file, a CI log."""

from __future__ import annotations

import io
import os
import pty
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest

from ortgate import cli
from ortgate.cli import output


def _lint(model, tmp_path) -> int:
    return cli.main(["lint", str(model), "--format", "json", "--output", str(tmp_path / "report.json")])


class _Terminal:
    """A pseudo-terminal standing in for sys.stderr; everything written to it is collected."""

    def __init__(self) -> None:
        master, slave = pty.openpty()
        self._master = master
        self.stream = open(slave, "w", encoding="utf-8", buffering=1)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # the slave side was closed
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    def close(self) -> str:
        self.stream.close()
        self._reader.join(timeout=5)
        os.close(self._master)
        return b"".join(self._chunks).decode("utf-8", errors="replace")


@pytest.fixture
def terminal_env(monkeypatch):
    monkeypatch.setenv("TERM", "xterm-256color")
    monkeypatch.delenv("NO_COLOR", raising=False)


def test_lint_on_a_terminal_shows_a_spinner_naming_the_work(make_model, tmp_path, monkeypatch, terminal_env):
    model = make_model(layers=2, moe="dense_loop", experts=8)
    monkeypatch.setattr(output, "PROGRESS_DELAY_S", 0.0)  # as if the model took long to load
    terminal = _Terminal()
    with redirect_stderr(terminal.stream), redirect_stdout(io.StringIO()):
        code = _lint(model, tmp_path)
    shown = terminal.close()
    assert code in (0, 1)
    assert "\x1b[" in shown  # the spinner redraws in place
    assert "ortgate: " in shown


def test_quick_lint_on_a_terminal_shows_nothing(make_model, tmp_path, terminal_env):
    model = make_model(layers=1)
    _lint(model, tmp_path)  # first run pays the imports
    terminal = _Terminal()
    start = time.perf_counter()
    with redirect_stderr(terminal.stream), redirect_stdout(io.StringIO()):
        code = _lint(model, tmp_path)
    took = time.perf_counter() - start
    shown = terminal.close()
    assert code in (0, 1)
    if took < output.PROGRESS_DELAY_S:  # a lint this small ends before the spinner is due
        assert shown == ""


def test_lint_into_a_pipe_writes_no_progress_even_when_colour_is_forced(make_model, tmp_path, monkeypatch):
    model = make_model(layers=2, moe="dense_loop", experts=8)
    monkeypatch.setattr(output, "PROGRESS_DELAY_S", 0.0)
    monkeypatch.setenv("FORCE_COLOR", "1")  # CI workflows set it; rich then treats any stream as a terminal
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)

    def drain() -> str:
        chunks = []
        while True:
            try:
                chunk = os.read(read_fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode("utf-8", errors="replace")

    with open(write_fd, "w", encoding="utf-8") as pipe:
        # Control: in this environment an enabled spinner does reach the pipe.
        with redirect_stderr(pipe), output.progress(True, delay=0.0) as note:
            note("loading")
            time.sleep(0.1)
        pipe.flush()
        control = drain()
        with redirect_stderr(pipe), redirect_stdout(io.StringIO()):
            code = _lint(model, tmp_path)
        pipe.flush()
        written = drain()
    os.close(read_fd)
    assert "ortgate: loading" in control and "\x1b[" in control
    assert code in (0, 1)
    assert written == ""


def test_dumb_terminal_gets_no_spinner(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setattr(sys, "stderr", terminal.stream)
    wanted = output.progress_wanted()
    monkeypatch.setenv("TERM", "xterm-256color")
    wanted_on_xterm = output.progress_wanted()
    monkeypatch.undo()
    terminal.close()
    assert (wanted, wanted_on_xterm) == (False, True)
