"""Progress on stderr for long commands (demo, export, report, curvature).

On a terminal the bar is ``tqdm``'s when it is installed (``pip install tqdm``, in the ``demo``,
``report`` and ``progress`` extras): rate (``it/s``, or ``s/it`` when slower than one a second),
elapsed time and ETA. In a log (stderr not a terminal), or without tqdm, a few whole lines are
printed with the same rate, so that a log file never fills with carriage-return redraws.

The bottom layer: anything may import it, it imports nothing of stepscope.
"""

from __future__ import annotations

import importlib
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def format_rate(done: float, seconds: float, unit: str = "it") -> str:
    """A rate the way tqdm writes it: ``12.3 it/s``, or ``4.20 s/it`` when slower than 1/s.

    >>> format_rate(50, 2.0, "step"), format_rate(2, 8.4), format_rate(0, 3.0)
    ('25.0 step/s', '4.20 s/it', '? it/s')
    """
    if done <= 0 or seconds <= 0:
        return f"? {unit}/s"
    rate = done / seconds
    return f"{rate:.1f} {unit}/s" if rate >= 1 else f"{1 / rate:.2f} s/{unit}"


def _tqdm(total: int, label: str, stream: TextIO, unit: str) -> Any | None:
    """A tqdm bar on ``stream`` when tqdm is installed and ``stream`` is a terminal, else None."""
    if not stream.isatty():
        return None
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:
        return None
    size = shutil.get_terminal_size()  # 80x24 where the terminal reports none (tqdm: no bar)
    return tqdm(
        total=total, desc=label, file=stream, unit=unit, ncols=size.columns, nrows=size.lines
    )


class Progress:
    """A progress bar on stderr: tqdm's on a terminal where installed, else whole lines."""

    def __init__(
        self, total: int, label: str, stream: TextIO | None = None, unit: str = "it"
    ) -> None:
        self.total, self.label, self.stream, self.done = total, label, stream or sys.stderr, 0
        self.unit = unit
        self.start = time.perf_counter()
        self._bar = _tqdm(total, label, self.stream, unit)

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        if self._bar is not None:
            if note:
                self._bar.set_postfix_str(note, refresh=False)
            self._bar.update(n)
            if self.done >= self.total:
                self._bar.close()
            return
        tty = self.stream.isatty()
        if self.done < self.total and not tty and self.done % max(1, self.total // 4):
            return  # in logs, print a few lines rather than one per step
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac)
        rate = format_rate(self.done, time.perf_counter() - self.start, self.unit)
        line = f"{self.label} [{bar:<30}] {self.done}/{self.total} {rate} {note}".rstrip()
        # a terminal redraws one line; a log gets whole lines
        self.stream.write(
            ("\r" + line + ("\n" if self.done >= self.total else "")) if tty else line + "\n"
        )
        self.stream.flush()


def progress_bar(
    label: str, stream: TextIO | None = None, unit: str = "it"
) -> Callable[[int, int], None]:
    """A ``progress(done, total)`` callback that draws a :class:`Progress` bar on stderr.

    >>> import io
    >>> out = io.StringIO()
    >>> tick = progress_bar("export", out, unit="step")
    >>> for i in range(1, 5):
    ...     tick(i, 4)
    >>> out.getvalue().splitlines()[-1].startswith("export [###")
    True
    """
    bars: list[Progress] = []

    def update(done: int, total: int) -> None:
        if not bars:
            bars.append(Progress(total, label, stream, unit))
        bars[0].advance(done - bars[0].done)

    return update
