"""The one error type users see: bad input, reported as `ortgate: error: FILE: problem` with exit code 2."""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Input ortgate cannot use: a missing or unreadable file, invalid YAML, a schema violation, ..."""

    exit_code = 2

    def __init__(self, problem: str, path: str | Path | None = None, *, line: int | None = None):
        self.problem = " ".join(str(problem).split())  # always one line
        self.path = str(path) if path is not None else None
        self.line = line
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.path:
            where = f"{self.path}:{self.line}: " if self.line else f"{self.path}: "
        return f"{where}{self.problem}"
