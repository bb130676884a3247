"""Plain-text renderings of spines and histograms (for terminals and the demo).

Example
-------
>>> import torch
>>> from stepscope.stats import Histogram
>>> h = Histogram(); h.update(torch.tensor([0.5, 0.75, -2.0, 0.0]))
>>> print(render_histogram(h, width=10).splitlines()[0])  # doctest: +SKIP
"""

from __future__ import annotations

import math

from stepscope.stats.histogram import Histogram
from stepscope.stats.spine import RunningStats


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    return f"{x:.3g}"


def render_histogram(hist: Histogram, width: int = 40, max_rows: int = 24) -> str:
    """Non-empty buckets as rows ``[lower, upper)  count  bar``, specials labelled.

    When there are more than ``max_rows`` non-empty buckets, neighbouring rows are summed in
    groups so the picture keeps its shape (counts stay exact; the labels show the merged range).
    """
    rows = [(lo, up, c) for lo, up, c in hist.buckets(include_infinities=True) if c]
    groups = max(1, math.ceil(len(rows) / max_rows))
    merged = []
    for i in range(0, len(rows), groups):
        chunk = rows[i : i + groups]
        merged.append((chunk[0][0], chunk[-1][1], sum(c for _, _, c in chunk)))
    top = max((c for _, _, c in merged), default=1)
    lines = []
    for lo, up, c in merged:
        label = (
            "0 (exact)"
            if lo == up == 0
            else (f"{_fmt(lo)}" if lo == up else f"[{_fmt(lo)}, {_fmt(up)})")
        )
        bar = "#" * max(1, round(width * c / top))
        lines.append(f"{label:>24} {c:>9} {bar}")
    if hist.nan:
        lines.append(f"{'NaN':>24} {hist.nan:>9}")
    if not lines:
        lines.append("(empty)")
    return "\n".join(lines)


def render_spine(stats: RunningStats) -> str:
    """One line: counts, then finite min/mean/max/std (``-`` where undefined)."""

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g}"

    std = None if stats.var is None else math.sqrt(stats.var)
    return (
        f"n={stats.total} finite={stats.finite} zero={stats.zero} neg={stats.negative} "
        f"nan={stats.nan} inf={stats.posinf + stats.neginf} "
        f"min={f(stats.min)} mean={f(stats.mean)} max={f(stats.max)} std={f(std)}"
    )
