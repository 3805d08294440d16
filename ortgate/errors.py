"""The one error type users see: bad input, reported as `ortgate: error: FILE: problem` with exit code 2."""

from __future__ import annotations

from pathlib import Path

# A message names what is wrong; it never echoes a whole hostile value into a CI log.
MAX_PROBLEM_CHARS = 1000


# The first line of a Git LFS pointer file: what a checkout without `git lfs pull` holds in place of the file.
LFS_POINTER_HEADER = b"version https://git-lfs.github.com/spec/"
LFS_POINTER_PROBLEM = ("Git LFS pointer, not the file itself (the checkout did not fetch it): run git lfs pull "
                       "(e.g. git lfs pull --include \"models/**/*.onnx,models/**/genai_config.json\")")


def is_lfs_pointer(head: bytes) -> bool:
    """Whether a file that starts with `head` is a Git LFS pointer (a few lines of text, under 1 KiB)."""
    return head.startswith(LFS_POINTER_HEADER)


def printable(text: str) -> str:
    """`text` on one line with control characters (newlines, terminal escapes) shown escaped, never raw."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _shorten(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    if len(text) <= limit:
        return text
    head, tail = limit * 7 // 10, limit * 2 // 10
    return f"{text[:head]} ...[{len(text) - head - tail} characters]... {text[-tail:]}"


class InputError(Exception):
    """Input ortgate cannot use: a missing or unreadable file, invalid YAML, a schema violation, ..."""

    exit_code = 2

    def __init__(self, problem: str, path: str | Path | None = None, *, line: int | None = None):
        self.problem = _shorten(printable(" ".join(str(problem).split())))  # always one line
        self.path = printable(str(path)) if path is not None else None
        self.line = line
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        return f"{where}{self.problem}"
