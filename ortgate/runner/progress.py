"""A rich progress display on stderr while `ortgate run` works; silent when stderr is not a terminal."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

REFRESH_S = 0.1  # the timed loop calls tick every run; the display is updated at most this often


class RunProgress:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._progress: Any = None  # rich.progress.Progress, imported only when shown
        self._status_task: Any = None

    def __enter__(self) -> RunProgress:
        if self.enabled:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(SpinnerColumn(), TextColumn("[bold]ortgate run[/] {task.description}"),
                                      BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=True)
            self._progress.start()
            self._status_task = self._progress.add_task("starting", total=None)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def note(self, message: str) -> None:
        if self._progress is not None and self._status_task is not None:
            self._progress.update(self._status_task, description=message)

    @contextmanager
    def phase(self, description: str, total: int) -> Iterator[Callable[[int], None] | None]:
        """A bar for `total` runs; yields tick(done), or None when there is no display (the loop stays bare)."""
        if self._progress is None:
            yield None
            return
        progress = self._progress
        task = progress.add_task(description, total=total)
        last = [0.0]

        def tick(done: int) -> None:
            now = time.monotonic()
            if now - last[0] >= REFRESH_S or done >= total:
                last[0] = now
                progress.update(task, completed=done)

        try:
            yield tick
        finally:
            progress.remove_task(task)
