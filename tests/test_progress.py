"""The progress bar of long commands: a few whole lines in a log, one redrawn line on a terminal.

On a terminal the bar is tqdm's where tqdm is installed; without it (``sys.modules["tqdm"] =
None`` makes it unimportable) the fallback redraws one line. Every form shows a rate that is never
rounded to ``0/s`` (the report's few slow panels read "0/s" before).
"""

from __future__ import annotations

import io
import re
import sys

import pytest

import stepscope.progress
from stepscope.progress import Progress, progress_bar


def counts(text: str) -> list[str]:
    """The ``done/total`` of each drawn bar."""
    return re.findall(r"\] (\d+/\d+) ", text)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_quarter_and_the_last_step():  # tqdm or not
    out = io.StringIO()
    bar = Progress(10, "export", out)
    for _ in range(10):
        bar.advance()
    lines = out.getvalue().splitlines()
    # total // 4 = 2: every second step is printed, and the tenth (the end) in any case
    assert [counts(line)[0] for line in lines] == ["2/10", "4/10", "6/10", "8/10", "10/10"]
    assert lines[-1].startswith("export [" + "#" * 30 + "]")
    assert "\r" not in out.getvalue()


@pytest.fixture
def no_tqdm(monkeypatch):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError


class Clock:
    """A fake ``time.perf_counter``: each call advances by ``tick`` seconds."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_a_slow_bar_says_seconds_per_item_never_zero_per_second(monkeypatch, no_tqdm):
    monkeypatch.setattr(stepscope.progress.time, "perf_counter", Clock(4.0))
    out = io.StringIO()
    bar = Progress(2, "report", out)  # start at 4 s; the items end at 8 s and 12 s
    bar.advance()
    bar.advance()
    lines = out.getvalue().splitlines()
    assert [ln.split("] ", 1)[1] for ln in lines] == ["1/2 4.00 s/it", "2/2 4.00 s/it"]
    assert "0/s" not in out.getvalue()


def test_tqdm_draws_the_terminal_bar_with_its_rate(monkeypatch):
    tqdm = pytest.importorskip("tqdm")
    out = Terminal()
    bar = Progress(4, "export", out, unit="step")
    for _ in range(4):
        bar.advance(note="plain-seed0")
    text = out.getvalue()
    final = text.split("\r")[-1]
    assert isinstance(bar._bar, tqdm.tqdm) and bar._bar.n == 4  # tqdm's own count
    assert final.startswith("export: 100%") and "4/4" in final and "step/s" in final
    assert "plain-seed0" in final


def test_a_terminal_redraws_one_line_per_step_and_ends_it(no_tqdm):
    out = Terminal()
    bar = Progress(3, "report", out)
    for i in range(3):
        bar.advance(note=f"run{i}")
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("run2\n") and text.count("\n") == 1
    assert counts(text) == ["1/3", "2/3", "3/3"]
    assert "[" + "#" * 10 + " " * 20 + "]" in text.split("\r")[1]  # a third of 30 columns


def test_the_callback_draws_from_absolute_counts():
    out = io.StringIO()
    tick = progress_bar("curvature", out)
    for done in (1, 3, 4):  # a caller may skip counts; the bar follows the absolute count
        tick(done, 4)
    assert counts(out.getvalue()) == ["1/4", "3/4", "4/4"]
