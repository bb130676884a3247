"""The progress bar of long commands: a few whole lines in a log, one redrawn line on a terminal."""

from __future__ import annotations

import io
import re

from stepscope.progress import Progress, progress_bar


def counts(text: str) -> list[str]:
    """The ``done/total`` of each drawn bar."""
    return re.findall(r"\] (\d+/\d+) ", text)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_per_quarter_and_the_last_step():
    out = io.StringIO()
    bar = Progress(10, "export", out)
    for _ in range(10):
        bar.advance()
    lines = out.getvalue().splitlines()
    # total // 4 = 2: every second step is printed, and the tenth (the end) in any case
    assert [counts(line)[0] for line in lines] == ["2/10", "4/10", "6/10", "8/10", "10/10"]
    assert lines[-1].startswith("export [" + "#" * 30 + "]")
    assert "\r" not in out.getvalue()


def test_a_terminal_redraws_one_line_per_step_and_ends_it():
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
