"""Plots and a self-contained HTML report, drawn from the on-disk artifact (old runs re-plot).

Example
-------
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
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
