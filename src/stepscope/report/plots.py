"""Matplotlib drawings for the report: pure functions from arrays to a PNG :class:`Plot`.

Each function receives plain arrays (read from the artifact by :mod:`stepscope.report.data`),
draws them on a private ``Figure`` (:mod:`stepscope.report.figure`: sizes, fonts, plain-text log
ticks, palette PNG) and returns a :class:`Plot` holding the PNG bytes *and* the arrays it drew, so
tests can compare what was plotted with what was recorded. Missing observations are ``NaN`` and are
drawn as gaps: lines break, heatmap cells are hatched; nothing is ever filled with zero. Every plot
names its x-axis. The histogram-over-time drawing is :mod:`stepscope.report.histplot`.

Legends summarise: seeds of one recipe are one mean line inside one shaded min–max band (the
seeds themselves thin and unlabelled, one legend entry says so); traces that cross two
vocabularies (e.g. source x recipe, layer x factor) take a colour per ``group`` and a line style
per ``family``, so the legend lists each once instead of every combination. Lines take the
Okabe–Ito colour-blind-safe palette *and* a line style (:func:`line_style`). On a log axis the
range is clipped to :data:`LOG_DECADES` decades below the largest value: the values under it are
numerically zero next to it, and the caption counts them.

Example
-------
>>> import numpy as np
>>> p = line_plot("loss", "optimizer step", "nats", [Trace("run a", np.arange(3.0),
...               np.array([1.0, np.nan, 0.5]))])
>>> p.png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
True
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.errors import require_extra
from stepscope.report.figure import (
    FIG_WIDTH,
    FONT,
    MIN_FONT,
    encode_png,
    new_figure,
    style,
)

__all__ = ["LOG_DECADES", "Plot", "Trace", "line_plot"]

_GAP_NOTE = "hatched = not observed (a gap, never a zero)"
#: A log axis shows at most this many decades below its largest value.
LOG_DECADES = 10

#: Okabe & Ito (2008) colour-blind-safe palette (yellow left out: too faint on white).
PALETTE: tuple[str, ...] = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#D55E00",  # vermillion
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#000000",  # black
)
#: Line styles cycled with the palette, so lines differ in more than colour.
LINE_STYLES: tuple[object, ...] = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))


def line_style(i: int) -> tuple[str, object]:
    """Colour and line style of the ``i``-th line: no two of the first 35 share both.

    >>> [line_style(i) for i in (0, 1, 7)]
    [('#0072B2', '-'), ('#E69F00', '--'), ('#0072B2', '--')]
    """
    n = len(PALETTE)
    return PALETTE[i % n], LINE_STYLES[(i % n + i // n) % len(LINE_STYLES)]


@dataclass(frozen=True)
class Plot:
    """One rendered figure: its title, x-axis label, PNG bytes and the arrays it drew."""

    title: str
    xlabel: str
    png: bytes
    data: dict[str, Any] = field(default_factory=dict)
    caption: str = ""


@dataclass(frozen=True)
class Trace:
    """One line. ``kind``: ``"line"``, ``"seed"`` (thin, behind a mean), ``"mean"`` or
    ``"overlay"`` (isolated sparse points of another regime: large hollow markers, no line).

    ``band`` = ``(lower, upper)`` arrays draw a shaded interval labelled ``band_label``. Traces of
    one ``group`` share a colour; when any trace names a ``family``, traces of one family share a
    line style and the legend lists groups (colours) and families (styles) once each.
    """

    label: str
    x: np.ndarray
    y: np.ndarray
    kind: str = "line"
    band: tuple[np.ndarray, np.ndarray] | None = None
    band_label: str = ""
    group: str | None = None  # traces of one group (seeds and their mean) share a colour
    family: str | None = None  # traces of one family share a line style (legend: once each)


def _hatch_gaps(ax: Any) -> None:
    ax.patch.set_facecolor("white")
    ax.patch.set_hatch("///")
    ax.patch.set_edgecolor("#bbbbbb")


def _wrap(text: str, width_in: float, points: float = FONT) -> str:
    """``text`` wrapped to fit ``width_in`` inches at ``points`` (DejaVu Sans ~0.55 em/char)."""
    chars = max(12, int(width_in * 72 / (points * 0.58)))
    return "\n".join(textwrap.wrap(text, chars)) or text


def _title(ax: Any, title: str, width_in: float = FIG_WIDTH) -> None:
    ax.set_title(_wrap(title, width_in - 0.2), fontsize=FONT)


def _legend(ax: Any, handles: list[Any], labels: list[str], width_in: float = FIG_WIDTH) -> None:
    """A legend below the axes that fits the figure's width (labels wrapped, 1 or 2 columns)."""
    if not handles:
        return
    two = len(labels) > 3
    chars_w = (width_in / (2 if two else 1)) - 0.5
    labels = [_wrap(lab, chars_w, MIN_FONT) for lab in labels]
    ax.legend(
        handles,
        labels,
        fontsize=MIN_FONT,
        ncol=2 if two else 1,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        frameon=False,
        handlelength=2.6,
    )


def _log_floor(traces: list[Trace]) -> tuple[float, float, int] | None:
    """``(low, high, n_below)`` of a log axis: at most :data:`LOG_DECADES` decades under the
    largest positive value; ``n_below`` positive values fall under ``low``."""
    vals = [np.asarray(t.y, float) for t in traces]
    vals += [np.asarray(b, float) for t in traces if t.band is not None for b in t.band]
    flat = np.concatenate([v.ravel() for v in vals]) if vals else np.empty(0)
    pos = flat[np.isfinite(flat) & (flat > 0)]
    if not len(pos):
        return None
    hi = float(pos.max())
    low = max(float(pos.min()), hi * 10.0**-LOG_DECADES)
    return low, hi, int((pos < low).sum())


def line_plot(
    title: str,
    xlabel: str,
    ylabel: str,
    traces: list[Trace],
    caption: str = "",
    logy: bool = False,
    markers: list[tuple[float, str]] | None = None,
) -> Plot:
    """Lines with NaN breaks (``ax.plot`` does not bridge NaN), optional bands and markers.

    ``markers`` are ``(x, label)`` vertical lines (e.g. endpoints).
    """
    with style():
        return _line_plot(title, xlabel, ylabel, traces, caption, logy, markers)


def _line_plot(
    title: str,
    xlabel: str,
    ylabel: str,
    traces: list[Trace],
    caption: str,
    logy: bool,
    markers: list[tuple[float, str]] | None,
) -> Plot:
    lines = require_extra("matplotlib.lines", "report", "drawing report plots")
    patches = require_extra("matplotlib.patches", "report", "drawing report plots")
    fig = new_figure(height=2.7)
    ax = fig.add_subplot()
    data: dict[str, Any] = {}
    by_family = any(t.family is not None for t in traces)
    colours: dict[Any, str] = {}
    dashes: dict[Any, Any] = {}
    handles: dict[str, Any] = {}  # legend label -> handle, in first-drawn order
    seeds = banded = 0
    for i, t in enumerate(traces):
        x, y = np.asarray(t.x, float), np.asarray(t.y, float)
        key = t.group if t.group is not None else ("trace", i)
        if by_family:
            colour = colours.setdefault(key, PALETTE[len(colours) % len(PALETTE)])
            dash = dashes.setdefault(t.family, LINE_STYLES[len(dashes) % len(LINE_STYLES)])
        else:
            colour, dash = (
                line_style(len(colours)) if key not in colours else (colours[key], dashes[key])
            )
            colours.setdefault(key, colour)
            dashes.setdefault(key, dash)
        # matplotlib Line2D keyword arguments (floats and strings mixed)
        kw: dict[str, Any] = {"seed": {"lw": 0.7, "alpha": 0.45}, "mean": {"lw": 2.0}}.get(
            t.kind, {"lw": 1.4}
        )
        if t.kind == "seed":
            dash = "-"  # thin seeds behind their mean: the mean carries the group's style
            seeds += 1
        if t.kind == "overlay":  # sparse historical points: never joined into a curve
            kw = dict(ls="none", marker="D", ms=6, mfc="none", mew=1.4)
        else:
            dots = "." if len(x) <= 60 else ""  # dense lines: markers would hide the line
            kw = dict(marker=dots, ms=4, linestyle=dash, **kw)
        ax.plot(x, y, color=colour, **kw)
        data[f"{i}:{t.label}"] = (x, y)
        if t.kind == "overlay":
            data[f"{i}:{t.label}:kind"] = t.kind
            handles.setdefault(t.label, lines.Line2D([], [], color=colour, **kw))
        elif t.kind != "seed" and not by_family:
            handles.setdefault(t.label, lines.Line2D([], [], color=colour, **kw))
        if t.band is not None:
            lo, hi = (np.asarray(b, float) for b in t.band)
            ax.fill_between(x, lo, hi, alpha=0.18, color=colour, lw=0)
            data[f"{i}:{t.label}:band"] = (x, lo, hi)
            banded += 1
    if by_family:
        lined = {t.group for t in traces if t.kind != "overlay"}
        for key, colour in colours.items():
            if isinstance(key, str) and key in lined:
                handles.setdefault(key, lines.Line2D([], [], color=colour, lw=2.2))
        for fam, dash in dashes.items():
            if isinstance(fam, str):
                handles.setdefault(fam, lines.Line2D([], [], color="#444444", ls=dash, lw=1.4))
    if seeds:
        handles["thin lines: each seed"] = lines.Line2D([], [], color="#777777", lw=0.7)
    if banded:
        bands = sorted({t.band_label for t in traces if t.band is not None and t.band_label})
        label = bands[0] if len(bands) == 1 else "shaded: min–max over the seeds"
        handles[label] = patches.Patch(color="#777777", alpha=0.3, lw=0)
    xs = [v for t in traces for v in np.asarray(t.x, float) if np.isfinite(v)]
    middle = (min(xs) + max(xs)) / 2 if xs else 0.0
    for x0, label in markers or []:
        ax.axvline(x0, color="#555555", ls=":", lw=1)
        side = "left" if x0 <= middle else "right"  # the label stays inside the axes
        ax.annotate(f" {label} ", (x0, 0.98), xycoords=("data", "axes fraction"),
                    fontsize=MIN_FONT, va="top", ha=side)  # fmt: skip
    if logy:
        ax.set_yscale("log")
        floor = _log_floor(traces)
        if floor is not None:
            low, high, below = floor
            ax.set_ylim(low / 1.5, high * 1.5)
            data["ylim"] = (low, high)
            if below:
                caption = (
                    f"{caption} {below} values more than {LOG_DECADES} decades below the largest "
                    "(numerically zero beside it) are under the axis."
                ).strip()
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _title(ax, title)
    _legend(ax, list(handles.values()), list(handles))
    data["legend"] = list(handles)
    return Plot(title, xlabel, encode_png(fig), data, caption)


def _step_edges(steps: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray]:
    """Column edges centred on each step (``width`` wide) with NaN filler columns between gaps.

    Returns ``(edges, column_of_step)``; ``column_of_step[j]`` is the drawn column of step j.
    """
    edges: list[float] = []
    cols: list[int] = []
    for s in steps.astype(float):
        lo = s - width / 2
        if edges and lo > edges[-1] + 1e-9:
            edges.append(lo)  # the filler column [previous end, lo) stays NaN: a gap
        elif not edges:
            edges.append(lo)
        cols.append(len(edges) - 1)
        edges.append(s + width / 2)
    return np.array(edges), np.array(cols, dtype=np.int64)


def _spread(values: np.ndarray, steps: np.ndarray, width: float) -> tuple[np.ndarray, np.ndarray]:
    edges, cols = _step_edges(steps, width)
    out = np.full((values.shape[0], len(edges) - 1), np.nan)
    out[:, cols] = values
    return edges, out


def _min_spacing(steps: np.ndarray) -> float:
    d = np.diff(np.unique(steps))
    return float(d.min()) if len(d) else 1.0


def heatmap_plot(
    title: str,
    rows: tuple[str, ...] | list[str],
    steps: np.ndarray,
    values: np.ndarray,
    colorbar: str,
    xlabel: str = "optimizer step",
    log: bool = False,
    nonfinite: np.ndarray | None = None,
    caption: str = "",
) -> Plot:
    """A rows x steps heatmap; NaN cells are hatched gaps, ``nonfinite`` cells get an ``x``."""
    with style():
        return _heatmap(title, rows, steps, values, colorbar, xlabel, log, nonfinite, caption)


def _heatmap(
    title: str,
    rows: tuple[str, ...] | list[str],
    steps: np.ndarray,
    values: np.ndarray,
    colorbar: str,
    xlabel: str,
    log: bool,
    nonfinite: np.ndarray | None,
    caption: str,
) -> Plot:
    mcolors = require_extra("matplotlib.colors", "report", "drawing report plots")
    longest = max((len(r) for r in rows), default=4)
    left = min(1.4, 0.25 + 0.075 * longest)  # row names at MIN_FONT
    fig = new_figure(height=1.3 + 0.2 * max(len(rows), 2), left=left, right=0.1)
    ax = fig.add_subplot()
    _hatch_gaps(ax)
    data: dict[str, Any] = {"rows": list(rows), "steps": steps, "values": values}
    if len(steps):
        edges, grid = _spread(values, steps, _min_spacing(steps))  # probe steps: wide cells
        data["drawn_x_edges"], data["drawn"] = edges, grid
        masked = np.ma.masked_invalid(grid)
        finite = values[np.isfinite(values)]
        norm = None
        if log and (finite > 0).any():
            pos = finite[finite > 0]
            low = max(pos.min(), pos.max() * 10.0**-LOG_DECADES)  # numerically zero below
            norm = mcolors.LogNorm(vmin=low, vmax=max(pos.max(), low * 1.0001))
            masked = np.ma.masked_where(~(grid > 0), grid)
        mesh = ax.pcolormesh(edges, np.arange(len(rows) + 1), masked, norm=norm, cmap="viridis")
        fig.colorbar(mesh, ax=ax, label=_wrap(colorbar, 1.4), pad=0.02, fraction=0.06)
        if nonfinite is not None and nonfinite.any():
            r, c = np.nonzero(nonfinite)
            ax.scatter(steps[c], r + 0.5, marker="x", color="red", s=12, label="NaN/inf present")
            ax.legend(fontsize=MIN_FONT, loc="upper right")
    ax.set_yticks(np.arange(len(rows)) + 0.5, labels=list(rows), fontsize=MIN_FONT)
    ax.set_xlabel(xlabel)
    _title(ax, title)
    cap = f"{caption} {_GAP_NOTE}.".strip()
    return Plot(title, xlabel, encode_png(fig), data, cap)


def matrix_plot(
    title: str, matrix: np.ndarray, xlabel: str, ylabel: str, caption: str = ""
) -> Plot:
    """An annotated integer matrix (e.g. a confusion matrix: true on y, predicted on x)."""
    with style():
        n = max(matrix.shape)
        fig = new_figure(3.4, 3.4, left=0.6, right=0.1, bottom=0.5, top=0.55)
        ax = fig.add_subplot()
        ax.imshow(matrix, cmap="Blues")
        small = MIN_FONT if n <= 10 else 7  # a number per cell: they must fit the cell
        top = matrix.max() if matrix.size else 0
        for (i, j), v in np.ndenumerate(matrix):
            colour = "white" if top and v > 0.6 * top else "black"
            ax.text(j, i, f"{int(v)}", ha="center", va="center", fontsize=small, color=colour)
        ax.set_xticks(range(matrix.shape[1]))
        ax.set_yticks(range(matrix.shape[0]))
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _title(ax, title, 3.4)
        return Plot(title, xlabel, encode_png(fig), {"matrix": matrix}, caption)


def bar_plot(
    title: str, groups: dict[str, np.ndarray], xlabel: str, ylabel: str, caption: str = ""
) -> Plot:
    """Grouped bars: one group per key (e.g. predicted-class counts at each endpoint)."""
    with style():
        fig = new_figure(height=2.6)
        ax = fig.add_subplot()
        n = max((len(v) for v in groups.values()), default=0)
        w = 0.8 / max(len(groups), 1)
        for i, (label, values) in enumerate(groups.items()):
            colour = line_style(i)[0]
            ax.bar(np.arange(len(values)) + i * w, values, width=w, label=label, color=colour)
        ax.set_xticks(np.arange(n) + 0.4 - w / 2, labels=[str(k) for k in range(n)])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        _title(ax, title)
        if groups:
            ax.legend(fontsize=MIN_FONT)
        return Plot(title, xlabel, encode_png(fig), {"groups": groups}, caption)
