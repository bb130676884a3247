"""The histogram over time: signed log2 bins on y, steps on x, the exact special counts above.

The special counts (NaN, ±inf, overflow, underflow, exact zero) are one band each. A non-zero
count is coloured by *kind*, never all alike: NaN red, ±inf purple, overflow orange, underflow
sky blue, exact zero blue-grey (a ReLU's zeros are healthy; a NaN is not), and the legend under
the plot says which colour is which. Steps without a histogram are hatched gap columns.

Example
-------
>>> [SPECIAL_KIND[b] for b in ("nan", "zero", "underflow_neg")]
['NaN', 'exact zero', 'underflow']
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stepscope.errors import require_extra
from stepscope.report.figure import FIG_WIDTH, MIN_FONT, encode_png, new_figure, style
from stepscope.report.plots import _GAP_NOTE, Plot, _hatch_gaps, _min_spacing, _spread, _title

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
#: The kind of each special band (its colour and legend entry).
SPECIAL_KIND: dict[str, str] = {
    "nan": "NaN",
    "posinf": "±inf",
    "neginf": "±inf",
    "overflow_pos": "overflow",
    "overflow_neg": "overflow",
    "underflow_pos": "underflow",
    "underflow_neg": "underflow",
    "zero": "exact zero",
}
#: Cell colour of a non-zero count of each kind; an absent count is :data:`NONE_COLOUR`.
KIND_COLOUR: dict[str, str] = {
    "NaN": "#d62728",
    "±inf": "#7b2d8e",
    "overflow": "#E69F00",
    "underflow": "#56B4E9",
    "exact zero": "#6f8fa8",
}
NONE_COLOUR = "#f2f2f2"
_KINDS = tuple(KIND_COLOUR)
_LIGHT = ("underflow", "overflow")  # black text on these, white on the others


def _signed_label(lower: float, upper: float) -> str:
    v = upper if lower < 0 else lower
    e = math.log2(abs(v)) if v != 0 else 0.0
    sign = "−" if lower < 0 else ""
    return f"{sign}2^{e:g}"


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
    step = max(1, n // 8)
    for k in range(0, n, step):
        out.append((k + 0.5, _signed_label(float(grid.bin_lower[k]), float(grid.bin_upper[k]))))
    return out


def special_codes(special: np.ndarray) -> np.ndarray:
    """Per band and step: ``-1`` no count there (NaN: no histogram), ``0`` a zero count, else
    ``1 +`` the index of the band's kind in :data:`KIND_COLOUR` (its colour)."""
    kind = np.array([_KINDS.index(SPECIAL_KIND[b]) + 1 for b in SPECIAL_BANDS], dtype=float)
    codes = np.where(special > 0, kind[:, None], 0.0)
    return np.where(np.isnan(special), np.nan, codes)


def histogram_plot(grid: Any, xlabel: str = "optimizer step") -> Plot:
    """Histogram over time: signed log2 bins on y, steps on x, specials as annotated bands.

    Cell colour is the bin's fraction of all elements counted at that step; empty bins are the
    light 'under' colour, steps without a histogram are hatched gaps. Special counts are coloured
    by kind (:data:`KIND_COLOUR`), with a legend.
    """
    with style():
        return _histogram(grid, xlabel)


def _histogram(grid: Any, xlabel: str) -> Plot:
    mpl = require_extra("matplotlib", "report", "drawing report plots")
    mcolors = require_extra("matplotlib.colors", "report", "drawing report plots")
    patches = require_extra("matplotlib.patches", "report", "drawing report plots")
    fig = new_figure(height=4.6, left=1.45, right=0.1, bottom=1.0)
    top, ax = fig.subplots(2, 1, sharex=True, height_ratios=[1.6, 3])
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
        codes = special_codes(sgrid)
        drawn["special_codes"] = codes
        top.pcolormesh(
            edges,
            np.arange(len(SPECIAL_BANDS) + 1),
            np.ma.masked_invalid(codes),
            cmap=mcolors.ListedColormap([NONE_COLOUR, *KIND_COLOUR.values()]),
            vmin=-0.5,
            vmax=len(_KINDS) + 0.5,
        )
        if len(grid.steps) <= 8:  # counts in the cells only while the columns are wide enough
            for b, band in enumerate(SPECIAL_BANDS):
                ink = "black" if SPECIAL_KIND[band] in _LIGHT else "white"
                for j, s in enumerate(grid.steps):
                    if special[b, j] > 0:
                        top.text(s, b + 0.5, _count(special[b, j]), ha="center", va="center",
                                 fontsize=MIN_FONT - 1, color=ink, clip_on=True)  # fmt: skip
        if len(grid.bins):
            edges, fgrid = _spread(fraction, grid.steps, width)
            drawn.update({"drawn_x_edges": edges, "drawn_fraction": fgrid})
            pos = fraction[fraction > 0]
            cmap = mpl.colormaps["magma_r"].with_extremes(under="#f7f7f7")
            norm = mcolors.LogNorm(vmin=pos.min(), vmax=max(pos.max(), pos.min() * 1.0001))
            shown = np.where(fgrid > 0, fgrid, np.where(np.isnan(fgrid), np.nan, pos.min() / 10))
            mesh = ax.pcolormesh(
                edges, np.arange(len(grid.bins) + 1), np.ma.masked_invalid(shown),
                norm=norm, cmap=cmap,
            )  # fmt: skip
            fig.colorbar(mesh, ax=[top, ax], label="fraction of elements", pad=0.02, fraction=0.05)
            n_neg = int((grid.bins < 0).sum())
            if 0 < n_neg < len(grid.bins):  # the two sign blocks meet here, not at a real edge
                ax.axhline(n_neg, color="#1f77b4", lw=1.2)
            ticks = _octave_ticks(grid)
            ax.set_yticks([t for t, _ in ticks], labels=[lab for _, lab in ticks])
    sums = [f"{name} (Σ {_count(special[i].sum())})" for i, name in enumerate(SPECIAL_BANDS)]
    top.set_yticks(np.arange(len(SPECIAL_BANDS)) + 0.5, labels=sums, fontsize=MIN_FONT - 1)
    top.set_ylim(len(SPECIAL_BANDS), 0)
    _title(top, title, FIG_WIDTH)
    ax.set_ylabel("value (signed log2 bins)")
    ax.set_xlabel(xlabel)
    handles = [patches.Patch(color=c, label=k) for k, c in KIND_COLOUR.items()]
    handles.append(patches.Patch(facecolor=NONE_COLOUR, edgecolor="#999999", label="count 0"))
    ax.legend(handles=handles, fontsize=MIN_FONT, ncol=3, loc="upper center",
              bbox_to_anchor=(0.5, -0.28), frameon=False, title="special counts")  # fmt: skip
    data = {
        "steps": grid.steps,
        "bins": grid.bins,
        "counts": grid.counts,
        "fraction": fraction,
        "specials": {name: grid.specials[name] for name in SPECIAL_BANDS},
        "legend": [h.get_label() for h in handles],
        **drawn,
    }
    caption = (
        "Top bands: exact special counts, coloured by kind (legend; numbers: the count). "
        "Light cells: an empty bin; the line marks where negative bins meet positive ones; "
        + _GAP_NOTE
        + "."
    )
    return Plot(title, xlabel, encode_png(fig), data, caption)
