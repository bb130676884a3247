"""Assemble the report into one self-contained HTML file (PNG images embedded as base64).

Layout: a ``viewport`` meta so phones lay the page out at their own width, images scaled to
the column (their PNGs are rendered at twice the displayed size for HiDPI screens), tables in
horizontal scrollers, and a caption shared by several plots of a section printed once above
them (each figure keeps its own x-axis line).

Example
-------
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> from stepscope.report import render_report
>>> render_report([run], run + "/report.html").name
'report.html'
"""

from __future__ import annotations

import base64
import html
import os
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

from stepscope.errors import Refusal
from stepscope.report.curvature import curvature_section
from stepscope.report.curves import curves_section
from stepscope.report.endpoints import default_endpoints, endpoints_section
from stepscope.report.figure import PNG_SCALE
from stepscope.report.model import NO_DATA, Item, Note, Section, Table, recipe_of, run_label
from stepscope.report.overlay import Overlay, load_overlay
from stepscope.report.plots import Plot
from stepscope.report.record import record_section
from stepscope.report.sections import (
    branch_section,
    histograms_section,
    layers_section,
    moments_section,
)
from stepscope.report.spikes import spikes_section
from stepscope.run import Run, open_run

#: Section keys in report order (each is an ``id`` in the HTML).
SECTION_KEYS: tuple[str, ...] = (
    "curves",
    "spikes",
    "branch",
    "endpoints",
    "layers",
    "moments",
    "histograms",
    "curvature",
    "record",
)

_CSS = """
*,*::before,*::after{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0 auto;padding:.8em 1.2em;max-width:80em;color:#222;
line-height:1.4}
h1{font-size:1.4em;margin:.3em 0} h2{font-size:1.2em;border-bottom:1px solid #ccc;
padding-bottom:.15em;margin:1.4em 0 .5em} h3{font-size:1em;margin:.8em 0 .3em}
p,li,h1,h2,h3,figcaption,summary{overflow-wrap:anywhere}
nav{font-size:.9em} nav a{margin-right:.9em;display:inline-block}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,400px),1fr));
gap:.4em 1.4em;align-items:start}
figure{margin:0 0 .6em;max-width:100%} figure img{max-width:100%;height:auto;display:block}
figcaption{font-size:.8em;color:#555}
.caption{font-size:.85em;color:#444;max-width:56em;margin:.2em 0 .5em}
.scroll{overflow:auto;max-width:100%;max-height:24em;margin:.3em 0 1em}
table{border-collapse:collapse;font-size:.85em}
td,th{border:1px solid #ddd;padding:.15em .45em;text-align:left;vertical-align:top}
th{background:#f6f6f6;position:sticky;top:0} td{max-width:40em;overflow-wrap:break-word}
.note{font-size:.85em;color:#444;margin:.3em 0}
.missing{font-size:.85em;color:#6b4a00;background:#fff8ec;border-left:3px solid #f0a020;
padding:.3em .7em;margin:.4em 0}
details{margin:.5em 0 1em} summary{cursor:pointer;color:#0b57a4;font-size:.95em;padding:.2em 0}
@media (max-width:40em){body{padding:.5em .4em} .grid{gap:.3em}}
"""


def build_sections(
    runs: Sequence[Run],
    endpoints: Sequence[int] | None = None,
    histogram_limit: int = 8,
    overlays: Sequence[Overlay] = (),
    progress: Callable[[int, int], None] | None = None,
    every_seed: bool = False,
) -> list[Section]:
    """Every section of the report, in :data:`SECTION_KEYS` order.

    Per-run panels (heatmaps, confusion matrices, histograms, curvature) are drawn for the first
    run of each recipe unless ``every_seed`` (the seeds' spread is in the curves' bands; a note
    names the runs left out). ``progress(done, total)`` is called after each section when given.
    """
    runs = list(runs)
    ends = sorted(set(endpoints)) if endpoints else default_endpoints(runs)
    builders: list[Callable[[], Section]] = [
        lambda: curves_section(runs, ends, overlays),
        lambda: spikes_section(runs),
        lambda: branch_section(runs),
        lambda: endpoints_section(runs, ends, every_seed),
        lambda: layers_section(runs, every_seed),
        lambda: moments_section(runs, every_seed),
        lambda: histograms_section(runs, histogram_limit, every_seed),
        lambda: curvature_section(runs, every_seed),
        lambda: record_section(runs),
    ]
    sections = []
    for build in builders:
        sections.append(build())
        if progress is not None:
            progress(len(sections), len(builders))
    return sections


def png_size(png: bytes) -> tuple[int, int]:
    """``(width, height)`` in pixels from a PNG's IHDR chunk.

    >>> png_size(b"\\x89PNG\\r\\n\\x1a\\n" + b"\\0\\0\\0\\rIHDR" + bytes([0, 0, 2, 0, 0, 0, 1, 0]))
    (512, 256)
    """
    width, height = struct.unpack(">II", png[16:24])
    return int(width), int(height)


def _item_html(item: Item, shared: frozenset[str] = frozenset()) -> str:
    if isinstance(item, Plot):
        data = base64.b64encode(item.png).decode("ascii")
        alt = html.escape(f"{item.title} (x-axis: {item.xlabel})")
        own = "" if item.caption in shared else item.caption
        cap = html.escape(f"x-axis: {item.xlabel}. {own}".strip())
        w, h = png_size(item.png)
        return (
            f'<figure><img alt="{alt}" src="data:image/png;base64,{data}" '
            f'width="{w // PNG_SCALE}" height="{h // PNG_SCALE}" decoding="async">'
            f"<figcaption>{cap}</figcaption></figure>"
        )
    if isinstance(item, Table):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in item.header)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in item.rows
        )
        return (
            f'<h3>{html.escape(item.title)}</h3><div class="scroll"><table><thead><tr>{head}'
            f"</tr></thead><tbody>{body}</tbody></table></div>"
        )
    if isinstance(item, Note):
        return f'<p class="note">{html.escape(item.text)}</p>'
    raise TypeError(f"unknown report item {type(item).__name__}")


def _items_html(items: Sequence[Item]) -> str:
    """Plots in a responsive grid (side by side where the page is wide), tables and notes below;
    a caption under several of the plots is printed once, above them."""
    counts = Counter(i.caption for i in items if isinstance(i, Plot) and i.caption)
    shared = frozenset(c for c, n in counts.items() if n > 1)
    lead = "".join(f'<p class="caption">{html.escape(c)}</p>' for c in sorted(shared))
    plots = "".join(_item_html(i, shared) for i in items if isinstance(i, Plot))
    rest = "".join(_item_html(i, shared) for i in items if not isinstance(i, Plot | Note))
    rest += "".join(_item_html(i, shared) for i in items if isinstance(i, Note) and not _absent(i))
    return lead + (f'<div class="grid">{plots}</div>' if plots else "") + rest


def _absent(item: Item) -> bool:
    return isinstance(item, Note) and item.text.startswith(NO_DATA)


def _missing_line(notes: Sequence[Note]) -> str:
    """One line for every ``no data recorded`` note of a section (what, and how to record it)."""
    texts = [n.text[len(NO_DATA) :].rstrip(".") for n in notes]
    return '<p class="missing">Not recorded: ' + html.escape("; ".join(texts)) + ".</p>"


def _summary(items: Sequence[Item]) -> str:
    n_plots = sum(isinstance(i, Plot) for i in items)
    n_tables = sum(isinstance(i, Table) for i in items)
    parts = [f"{n_plots} more plot{'s' * (n_plots != 1)}" if n_plots else ""]
    parts.append(f"{n_tables} table{'s' * (n_tables != 1)}" if n_tables else "")
    what = ", ".join(p for p in parts if p) or "notes"
    return f"Details: {what}"


def _runs_line(runs: Sequence[Run]) -> str:
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(recipe_of(r), []).append(r)
    parts = []
    for g, members in groups.items():
        steps = [len(r.steps) for r in members]
        span = f"{min(steps)}" if min(steps) == max(steps) else f"{min(steps)}–{max(steps)}"
        name = html.escape(g) if g else "runs"
        labels = ", ".join(html.escape(run_label(r)) for r in members)
        parts.append(f"<b>{name}</b>: {len(members)} run{'s' * (len(members) != 1)} "
                     f"({labels}), {span} committed steps")  # fmt: skip
    return "; ".join(parts)


def to_html(sections: Sequence[Section], runs: Sequence[Run]) -> str:
    """The whole document as a string (no external references).

    Sections with data come in :data:`SECTION_KEYS` order, each with its summary open and its
    details folded (``<details>``); sections with nothing recorded collapse into one line near
    the top (``id="not-recorded"``), which names what was looked for and how to record it.
    """
    names = ", ".join(html.escape(run_label(r)) for r in runs)
    full = [s for s in sections if s.has_data]
    empty = [s for s in sections if not s.has_data]
    toc = "".join(f'<a href="#{s.key}">{html.escape(s.title)}</a>' for s in full)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>stepscope report: {names}</title><style>{_CSS}</style></head><body>",
        f"<h1>stepscope report</h1><p>{_runs_line(runs)}. Generated "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}. Every plot reads the on-disk "
        "artifact; missing observations are gaps, never zeros.</p>",
        f"<nav>{toc}</nav>" if toc else "",
    ]
    if empty:
        anchors = "".join(f'<span id="{s.key}"></span>' for s in empty)
        notes = [n for s in empty for n in s.all_items if isinstance(n, Note)]
        line = _missing_line([n for n in notes if _absent(n)] or notes)
        parts.append(f'<div id="not-recorded">{anchors}{line}</div>')
    for s in full:
        absent = [i for i in s.all_items if isinstance(i, Note) and _absent(i)]
        body = _items_html(s.items)
        if absent:
            body += _missing_line(absent)
        if any(not isinstance(i, Note) or not _absent(i) for i in s.details):
            inner = _items_html(s.details)
            body += f"<details><summary>{_summary(s.details)}</summary>{inner}</details>"
        parts.append(f'<section id="{s.key}"><h2>{html.escape(s.title)}</h2>{body}</section>')
    parts.append("</body></html>")
    return "\n".join(parts)


def render_report(
    runs: Sequence[str | os.PathLike[str]],
    out: str | os.PathLike[str],
    *,
    endpoints: Sequence[int] | None = None,
    histogram_limit: int = 8,
    overlays: Sequence[str | os.PathLike[str]] = (),
    progress: Callable[[int, int], None] | None = None,
    every_seed: bool = False,
) -> Path:
    """Write one self-contained HTML report over one or more run artifacts.

    Parameters
    ----------
    runs
        Run directories (``stepscope.history.v1`` artifacts). Several runs are treated as
        seeds of one recipe: their traces are drawn behind a mean with a min–max interval.
    out
        The HTML file to write (its parent directory is created).
    endpoints
        Optimizer steps for the generalisation gap, class counts and confusion matrices
        (default: the first and last probe step).
    histogram_limit
        At most this many histogram-over-time panels.
    every_seed
        Draw the per-run panels (heatmaps, confusion matrices, histograms, curvature) for every
        run, not only the first run of each recipe.
    overlays
        Historical overlay JSON files (:mod:`stepscope.report.overlay`): sparse evaluation points
        of another regime, drawn as labelled markers on the optimizer-step curves.
    progress
        ``progress(done, total)`` after each section is built.

    Returns
    -------
    Path
        ``out``.

    Raises
    ------
    Refusal
        ``report_input_invalid`` without runs; the reader's codes for a bad artifact;
        ``extra_missing`` without matplotlib.

    Examples
    --------
    >>> from stepscope.history.sample import sample_run
    >>> run = sample_run()  # a tiny run: three training-loss scalars
    >>> render_report([run], run + "/report.html", endpoints=[0, 2]).name
    'report.html'
    """
    if not runs:
        raise Refusal("report_input_invalid", "no runs were given.", ["pass at least one RUN"])
    if endpoints is not None and any(int(e) < 0 for e in endpoints):
        raise Refusal("report_input_invalid", f"endpoints {list(endpoints)} must be >= 0.", [])
    opened = [open_run(p) for p in runs]
    loaded = [load_overlay(p) for p in overlays]
    sections = build_sections(opened, endpoints, histogram_limit, loaded, progress, every_seed)
    return write_report(sections, opened, out)


def write_report(
    sections: Sequence[Section], runs: Sequence[Run], out: str | os.PathLike[str]
) -> Path:
    """Write built sections as the HTML file ``out`` (atomically: temp file, then rename)."""
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    tmp.write_text(to_html(sections, runs), encoding="utf-8")
    os.replace(tmp, target)
    return target
