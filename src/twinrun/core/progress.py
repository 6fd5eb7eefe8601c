"""Progress reporting: a rich progress bar on a terminal, plain lines otherwise, nothing with
--quiet. Everything goes to stderr so stdout stays for results."""

from __future__ import annotations

import sys
import time
from typing import Any


class Progress:
    def __init__(self, total: int, label: str, quiet: bool = False) -> None:
        self.total = total
        self.label = label
        self.quiet = quiet
        self.start = time.perf_counter()
        self._bar: Any = None
        self._task: Any = None
        self._every = max(1, total // 20)
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._bar.start()
            self._task = self._bar.add_task(label, total=total, info="")

    def update(self, done: int, info: str = "") -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, info=info)
        elif done == self.total or done % self._every == 0 or done == 1:
            line = f"{self.label} {done}/{self.total} {info}".rstrip()
            print(line + self.eta(done), file=sys.stderr, flush=True)

    def eta(self, done: int) -> str:
        """` (eta 42 s)`: the time the remaining steps take at the mean pace so far; "" when
        done or nothing is done yet."""
        if done <= 0 or done >= self.total:
            return ""
        left = (time.perf_counter() - self.start) / done * (self.total - done)
        return f" (eta {left:.0f} s)"

    def note(self, text: str) -> None:
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
