"""Table formatting: dates instead of Unix seconds, numbers rounded, captions printed once."""

from __future__ import annotations

import re
import time

from stepscope import open_run
from stepscope.report.html import to_html
from stepscope.report.model import Section
from stepscope.report.plots import Plot
from stepscope.report.record import record_section


def test_record_shows_the_creation_date_and_rounded_numbers(runs):
    view = open_run(runs["seed0"])
    sec = record_section([view])
    table = sec.all_items[0]
    rows = dict((r[0], r[1]) for r in table.rows)
    assert "created_unix" not in rows
    want = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.run.created_unix))
    assert rows["created"] == want
    for item in sec.all_items:  # no float anywhere with more than 4 significant digits
        for row in getattr(item, "rows", []):
            for cell in row[1:]:
                for number in re.findall(r"-?\d+\.\d+(?:e[+-]\d+)?", cell):
                    mantissa = number.split("e")[0].lstrip("-").replace(".", "").lstrip("0")
                    assert len(mantissa) <= 4, (row, number)


def _plot(title: str, caption: str) -> Plot:
    png = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + bytes([0, 0, 2, 0, 0, 0, 1, 0])
    return Plot(title, "optimizer step", png, {}, caption)


def test_a_caption_shared_by_several_plots_is_printed_once(runs):
    shared = "Thin traces: seeds; thick: their mean."
    sec = Section("curves", "Curves")
    sec.items.extend([_plot(f"p{i}", shared) for i in range(4)] + [_plot("own", "Only mine.")])
    html = to_html([sec], [open_run(runs["seed0"])])
    assert html.count(shared) == 1 and html.count("Only mine.") == 1
    assert html.count("<figcaption>x-axis: optimizer step.") == 5  # each still names its axis
    assert 'width="256" height="128"' in html  # shown at half its pixels: sharp on HiDPI


def test_report_reports_progress_per_section(runs, tmp_path, capsys):
    from stepscope.cli import main
    from stepscope.report import SECTION_KEYS, render_report

    calls = []
    render_report([runs["bare"]], tmp_path / "r.html", progress=lambda d, t: calls.append((d, t)))
    n = len(SECTION_KEYS)
    assert calls == [(i, n) for i in range(1, n + 1)]
    assert main(["report", str(runs["bare"]), "--out", str(tmp_path / "c.html")]) == 0
    err = capsys.readouterr().err
    assert "report [" in err and f"{n}/{n}" in err
