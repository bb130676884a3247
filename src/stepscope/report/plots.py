"""Matplotlib drawings for the report: pure functions from arrays to a PNG :class:`Plot`.

Each function receives plain arrays (read from the artifact by :mod:`stepscope.report.data`),
draws them on a private ``Figure`` (no pyplot, no global backend switch) and returns a
:class:`Plot` holding the PNG bytes *and* the arrays it drew, so tests can compare what was
plotted with what was recorded. Missing observations are ``NaN`` and are drawn as gaps: lines
break, heatmap cells are hatched; nothing is ever filled with zero. Every plot names its x-axis.

Style: PNGs are rendered at :data:`PNG_SCALE` times their displayed size (sharp on HiDPI
screens; the HTML sets the display size), lines take the Okabe–Ito colour-blind-safe palette
*and* a line style each (:func:`line_style`), legends sit below the axes (or inside, for heatmaps
and bars) at 8 pt or more.

One module over 400 lines on purpose: every drawing shares the private figure, PNG and
gap-hatching helpers and the style rules above; split by plot kind, each part would import them
back.

Example
-------
>>> import numpy as np
>>> p = line_plot("loss", "optimizer step", "nats", [Trace("run a", np.arange(3.0),
...               np.array([1.0, np.nan, 0.5]))])
>>> p.png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
True
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.errors import require_extra

_DPI = 90
#: PNGs hold this many pixels per displayed pixel (the HTML shows them at 1/PNG_SCALE size).
PNG_SCALE = 2
#: Smallest font size of any legend or annotation (pt).
MIN_FONT = 8
_GAP_NOTE = "hatched = not observed (a gap, never a zero)"

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

    ``band`` = ``(lower, upper)`` arrays draw a shaded interval labelled ``band_label``.
    """

    label: str
    x: np.ndarray
    y: np.ndarray
    kind: str = "line"
    band: tuple[np.ndarray, np.ndarray] | None = None
    band_label: str = ""
    group: str | None = None  # traces of one group (seeds and their mean) share a colour


def _figure(width: float = 6.4, height: float = 3.2, left: float = 1.0, right: float = 1.3) -> Any:
    """A private figure with fixed margins given in inches (``left``/``right``)."""
    mpl_figure = require_extra("matplotlib.figure", "report", "drawing report plots")
    require_extra("matplotlib.backends.backend_agg", "report", "rendering PNG plots")
    fig = mpl_figure.Figure(figsize=(width, height), dpi=_DPI)
    # fixed margins: constrained layout measured at ~1 s per figure here, most of the render
    fig.subplots_adjust(
        left=left / width,
        right=1 - right / width,
        bottom=0.55 / height,
        top=1 - 0.35 / height,
        hspace=0.08,
    )
    return fig


def _png(fig: Any) -> bytes:
    for text in fig.findobj(lambda o: hasattr(o, "set_parse_math")):
        text.set_parse_math(False)  # names are data: "$" is a dollar sign, never math text
    buf = io.BytesIO()
    # keep legends below the axes whole; PNG_SCALE x the pixels for HiDPI screens
    fig.savefig(buf, format="png", dpi=_DPI * PNG_SCALE, bbox_inches="tight")
    return buf.getvalue()


def _hatch_gaps(ax: Any) -> None:
    ax.patch.set_facecolor("white")
    ax.patch.set_hatch("///")
    ax.patch.set_edgecolor("#bbbbbb")


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
    many = len(traces) > 12  # e.g. spectra of every layer and family: a three-column legend
    fig = _figure(8.4, 3.4 if many else 3.0, right=0.3)
    ax = fig.add_subplot()
    data: dict[str, Any] = {}
    styles: dict[object, tuple[str, object]] = {}
    for i, t in enumerate(traces):
        x, y = np.asarray(t.x, float), np.asarray(t.y, float)
        # matplotlib Line2D keyword arguments (floats and strings mixed)
        style: dict[str, Any] = {"seed": {"lw": 0.8, "alpha": 0.4}, "mean": {"lw": 2.2}}.get(
            t.kind, {"lw": 1.4}
        )
        key = t.group if t.group is not None else ("trace", i)
        colour, dash = styles.setdefault(key, line_style(len(styles)))
        if t.kind == "seed":
            dash = "-"  # thin seeds behind their mean: the mean carries the group's style
        if t.kind == "overlay":  # sparse historical points: never joined into a curve
            style = dict(ls="none", marker="D", ms=7, mfc="none", mew=1.6)
        else:
            style = dict(marker=".", ms=4, linestyle=dash, **style)
        (line,) = ax.plot(x, y, label=t.label, color=colour, **style)
        data[f"{i}:{t.label}"] = (x, y)
        if t.kind == "overlay":
            data[f"{i}:{t.label}:kind"] = t.kind
        if t.band is not None:
            lo, hi = (np.asarray(b, float) for b in t.band)
            ax.fill_between(x, lo, hi, alpha=0.18, color=line.get_color(), label=t.band_label)
            data[f"{i}:{t.label}:band"] = (x, lo, hi)
    for x0, label in markers or []:
        ax.axvline(x0, color="#555555", ls=":", lw=1)
        ax.annotate(
            label, (x0, 1.0), xycoords=("data", "axes fraction"), fontsize=MIN_FONT, va="top"
        )
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if traces:  # below the axes, full width, readable
        ax.legend(
            fontsize=MIN_FONT,
            ncol=3 if many else 2,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.22),
            frameon=False,
        )
    return Plot(title, xlabel, _png(fig), data, caption)


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
    mcolors = require_extra("matplotlib.colors", "report", "drawing report plots")
    fig = _figure(7.2, 1.2 + 0.28 * max(len(rows), 2), left=1.2, right=1.4)
    ax = fig.add_subplot()
    _hatch_gaps(ax)
    data: dict[str, Any] = {"rows": list(rows), "steps": steps, "values": values}
    if len(steps):
        edges, grid = _spread(values, steps, 1.0)
        data["drawn_x_edges"], data["drawn"] = edges, grid
        masked = np.ma.masked_invalid(grid)
        finite = values[np.isfinite(values)]
        norm = None
        if log and (finite > 0).any():
            pos = finite[finite > 0]
            norm = mcolors.LogNorm(vmin=pos.min(), vmax=max(pos.max(), pos.min() * 1.0001))
            masked = np.ma.masked_where(~(grid > 0), grid)
        mesh = ax.pcolormesh(edges, np.arange(len(rows) + 1), masked, norm=norm, cmap="viridis")
        fig.colorbar(mesh, ax=ax, label=colorbar, pad=0.01)
        if nonfinite is not None and nonfinite.any():
            r, c = np.nonzero(nonfinite)
            ax.scatter(steps[c], r + 0.5, marker="x", color="red", s=12, label="NaN/inf present")
            ax.legend(fontsize=MIN_FONT, loc="upper right")
    ax.set_yticks(np.arange(len(rows)) + 0.5, labels=list(rows), fontsize=7)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    cap = f"{caption} {_GAP_NOTE}.".strip()
    return Plot(title, xlabel, _png(fig), data, cap)


def _signed_label(lower: float, upper: float) -> str:
    v = upper if lower < 0 else lower
    e = math.log2(abs(v)) if v != 0 else 0.0
    sign = "-" if lower < 0 else ""
    return f"{sign}2^{e:g}"


#: Display order of the special bands (top to bottom).
SPECIAL_BANDS: tuple[str, ...] = (
    "nan",
    "posinf",
    "overflow_pos",
    "underflow_pos",
    "zero",
    "underflow_neg",
    "overflow_neg",
    "neginf",
)


def histogram_plot(grid: Any, xlabel: str = "optimizer step") -> Plot:
    """Histogram over time: signed log2 bins on y, steps on x, specials as annotated bands.

    Cell colour is the bin's fraction of all elements counted at that step; empty bins are the
    light 'under' colour, steps without a histogram are hatched gaps.
    """
    mcolors = require_extra("matplotlib.colors", "report", "drawing report plots")
    fig = _figure(7.2, 5.4, left=1.9, right=1.4)
    # 8 special bands need ~0.16 in each at 8 pt: the band axis gets 1.5 of 4.5 parts
    top, ax = fig.subplots(2, 1, sharex=True, height_ratios=[1.5, 3])
    width = _min_spacing(grid.steps)
    totals = np.where(grid.totals > 0, grid.totals, np.nan)
    fraction = grid.counts / totals
    special = np.array([grid.specials[name] for name in SPECIAL_BANDS], dtype=float)
    title = f"{grid.site} · {grid.stream}: histogram over time (signed log2 grid)"
    drawn: dict[str, Any] = {}
    for a in (top, ax):
        _hatch_gaps(a)
    if len(grid.steps):
        edges, sgrid = _spread(special, grid.steps, width)
        top.pcolormesh(
            edges,
            np.arange(len(SPECIAL_BANDS) + 1),
            np.ma.masked_invalid(np.where(sgrid > 0, 1.0, np.where(np.isnan(sgrid), np.nan, 0))),
            cmap=mcolors.ListedColormap(["#f2f2f2", "#d62728"]),
            vmin=0,
            vmax=1,
        )
        if len(grid.steps) <= 16:  # counts in the cells only while the columns are wide enough
            for b in range(len(SPECIAL_BANDS)):
                for j, s in enumerate(grid.steps):
                    if special[b, j] > 0:
                        top.text(s, b + 0.5, _count(special[b, j]), ha="center", va="center",
                                 fontsize=7, clip_on=True)  # fmt: skip
        if len(grid.bins):
            edges, fgrid = _spread(fraction, grid.steps, width)
            drawn = {"drawn_x_edges": edges, "drawn_fraction": fgrid}
            pos = fraction[fraction > 0]
            mpl = require_extra("matplotlib", "report", "drawing report plots")
            cmap = mpl.colormaps["magma_r"].with_extremes(under="#f7f7f7")
            norm = mcolors.LogNorm(vmin=pos.min(), vmax=max(pos.max(), pos.min() * 1.0001))
            shown = np.where(fgrid > 0, fgrid, np.where(np.isnan(fgrid), np.nan, pos.min() / 10))
            mesh = ax.pcolormesh(
                edges, np.arange(len(grid.bins) + 1), np.ma.masked_invalid(shown),
                norm=norm, cmap=cmap,
            )  # fmt: skip
            fig.colorbar(mesh, ax=[top, ax], label="fraction of elements", pad=0.01)
            n_neg = int((grid.bins < 0).sum())
            if 0 < n_neg < len(grid.bins):  # the two sign blocks meet here, not at a real edge
                ax.axhline(n_neg, color="#1f77b4", lw=1.2)
                ax.annotate("sign change (zero, underflow: bands)", (1.0, n_neg), fontsize=7,
                            xycoords=("axes fraction", "data"), ha="right", va="bottom")  # fmt: skip
            ticks = _octave_ticks(grid)
            ax.set_yticks([t for t, _ in ticks], labels=[lab for _, lab in ticks], fontsize=7)
    sums = [f"{name} (Σ {_count(special[i].sum())})" for i, name in enumerate(SPECIAL_BANDS)]
    top.set_yticks(np.arange(len(SPECIAL_BANDS)) + 0.5, labels=sums, fontsize=7)
    top.set_ylim(len(SPECIAL_BANDS), 0)
    top.set_title(title, fontsize=9)
    ax.set_ylabel("value (signed log2 bins)")
    ax.set_xlabel(xlabel)
    data = {
        "steps": grid.steps,
        "bins": grid.bins,
        "counts": grid.counts,
        "fraction": fraction,
        "specials": {name: grid.specials[name] for name in SPECIAL_BANDS},
        **drawn,
    }
    caption = (
        "Red band cells: the special count is non-zero (numbers: the count). "
        "Light cells: an empty bin; " + _GAP_NOTE + "."
    )
    return Plot(title, xlabel, _png(fig), data, caption)


def _count(n: float) -> str:
    """A count in at most 5 characters: ``7``, ``1234``, ``12k``, ``3.4M``.

    >>> [_count(v) for v in (7, 1234, 12_345, 3_400_000)]
    ['7', '1234', '12k', '3.4M']
    """
    n = int(n)
    if n < 10_000:
        return str(n)
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            v = n / scale
            return f"{v:.1f}{unit}" if v < 10 else f"{v:.0f}{unit}"
    return str(n)


def _octave_ticks(grid: Any) -> list[tuple[float, str]]:
    out: list[tuple[float, str]] = []
    n = len(grid.bins)
    step = max(1, n // 12)
    for k in range(0, n, step):
        out.append((k + 0.5, _signed_label(float(grid.bin_lower[k]), float(grid.bin_upper[k]))))
    return out


def matrix_plot(
    title: str, matrix: np.ndarray, xlabel: str, ylabel: str, caption: str = ""
) -> Plot:
    """An annotated integer matrix (e.g. a confusion matrix: true on y, predicted on x)."""
    fig = _figure(4.0, 3.8, left=0.8, right=0.2)
    ax = fig.add_subplot()
    ax.imshow(matrix, cmap="Blues")
    for (i, j), v in np.ndenumerate(matrix):
        ax.text(j, i, f"{int(v)}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(matrix.shape[1]))
    ax.set_yticks(range(matrix.shape[0]))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title.replace(" · ", "\n"), fontsize=8)
    return Plot(title, xlabel, _png(fig), {"matrix": matrix}, caption)


def bar_plot(
    title: str, groups: dict[str, np.ndarray], xlabel: str, ylabel: str, caption: str = ""
) -> Plot:
    """Grouped bars: one group per key (e.g. predicted-class counts at each endpoint)."""
    fig = _figure()
    ax = fig.add_subplot()
    n = max((len(v) for v in groups.values()), default=0)
    w = 0.8 / max(len(groups), 1)
    for i, (label, values) in enumerate(groups.items()):
        colour = line_style(i)[0]
        ax.bar(np.arange(len(values)) + i * w, values, width=w, label=label, color=colour)
    ax.set_xticks(np.arange(n) + 0.4 - w / 2, labels=[str(k) for k in range(n)])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if groups:
        ax.legend(fontsize=MIN_FONT)
    return Plot(title, xlabel, _png(fig), {"groups": groups}, caption)
