"""Plots and a self-contained HTML report, drawn from the on-disk artifact (old runs re-plot).

Example
-------
>>> import tempfile
>>> from stepscope.history import HistoryWriter
>>> run = tempfile.mkdtemp() + "/a"
>>> with HistoryWriter(run) as w:  # a tiny run: three training-loss scalars
...     for step in range(3):
...         w.write_scalar("loss", step, 1.0 / (step + 1))
>>> import stepscope.report as rep
>>> rep.render_report([run], run + "/report.html").name
'report.html'
"""

from stepscope.report.histplot import histogram_plot
from stepscope.report.html import (
    SECTION_KEYS,
    build_sections,
    render_report,
    to_html,
    write_report,
)
from stepscope.report.model import Note, Section, Table
from stepscope.report.plots import Plot, Trace, heatmap_plot, line_plot

__all__ = [
    "SECTION_KEYS",
    "Note",
    "Plot",
    "Section",
    "Table",
    "Trace",
    "build_sections",
    "heatmap_plot",
    "histogram_plot",
    "line_plot",
    "render_report",
    "to_html",
    "write_report",
]
