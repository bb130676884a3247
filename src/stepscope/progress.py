"""Progress on stderr for long commands (demo, export, report, curvature): no dependencies.

The bottom layer: anything may import it, it imports nothing of stepscope.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO


class Progress:
    """A dependency-free progress bar on stderr."""

    def __init__(self, total: int, label: str, stream: TextIO | None = None) -> None:
        self.total, self.label, self.stream, self.done = total, label, stream or sys.stderr, 0
        self.start = time.perf_counter()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if (
            self.done < self.total
            and not self.stream.isatty()
            and self.done % max(1, self.total // 4)
        ):
            return  # in logs, print a few lines rather than one per step
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac)
        rate = self.done / max(time.perf_counter() - self.start, 1e-9)
        tty = self.stream.isatty()
        line = f"{self.label} [{bar:<30}] {self.done}/{self.total} {rate:.0f}/s {note}"
        # a terminal redraws one line; a log gets whole lines
        self.stream.write(
            ("\r" + line + ("\n" if self.done >= self.total else "")) if tty else line + "\n"
        )
        self.stream.flush()


def progress_bar(label: str, stream: TextIO | None = None) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback that draws the demo's progress bar on stderr.

    >>> import io
    >>> out = io.StringIO()
    >>> tick = progress_bar("export", out)
    >>> for i in range(1, 5):
    ...     tick(i, 4)
    >>> out.getvalue().splitlines()[-1].startswith("export [###")
    True
    """
    bars: list[Progress] = []

    def update(done: int, total: int) -> None:
        if not bars:
            bars.append(Progress(total, label, stream))
        bars[0].advance(done - bars[0].done)

    return update
