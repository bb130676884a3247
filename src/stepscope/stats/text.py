"""Plain-text renderings of spines and histograms (for terminals and the demo).

Example
-------
>>> import torch
>>> from stepscope.stats import Histogram
>>> h = Histogram(); h.update(torch.tensor([0.5, 0.75, -2.0, 0.0]))
>>> print(render_histogram(h, width=10).splitlines()[0])
               (-2.38, -2]         1 ##########
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
    """Non-empty buckets as rows ``interval  count  bar``, specials on their own rows.

    An interval is ``[lower, upper)`` for positive values and ``(lower, upper]`` for negative ones
    (a bin holds the magnitudes ``[|upper|, |lower|)``); underflow beside zero is ``(lower, upper)``.

    When there are more than ``max_rows`` non-empty log2 bins, neighbouring bins are summed in
    groups so the picture keeps its shape (counts stay exact; labels show the merged range).
    Exact zero, under/overflow and infinities are never merged into bins; NaN is listed last.
    """
    buckets = hist.buckets(include_infinities=True)
    d = hist.descriptor
    n_regular = 2 * d.n_bins
    # positions of the regular bins in ``buckets``: after (-inf, overflow_neg) and around zero
    regular = set(range(2, 2 + d.n_bins)) | set(range(5 + d.n_bins, 5 + d.n_bins + d.n_bins))
    n_nonempty = sum(1 for i in regular if buckets[i][2])
    group = max(1, math.ceil(n_nonempty / max_rows)) if n_regular else 1
    merged: list[tuple[float, float, int, bool]] = []
    pending: list[tuple[float, float, int]] = []

    def flush() -> None:
        if pending:
            merged.append((pending[0][0], pending[-1][1], sum(c for _, _, c in pending), False))
            pending.clear()

    for i, (lo, up, c) in enumerate(buckets):
        if i in regular:
            if c:
                pending.append((lo, up, c))
                if len(pending) == group:
                    flush()
        else:
            flush()
            if c:
                merged.append((lo, up, c, True))
    flush()
    top = max((c for *_, c, _ in merged), default=1)
    lines = []
    for lo, up, c, special in merged:
        if lo == up:
            label = "0 (exact)" if lo == 0 else _fmt(lo)
        else:
            # positive buckets hold [lo, up), negative ones (lo, up] (magnitudes [|up|, |lo|)),
            # the underflow buckets beside zero are open at both ends
            left, right = ("[" if lo > 0 else "("), ("]" if up < 0 else ")")
            label = f"{left}{_fmt(lo)}, {_fmt(up)}{right}" + (" *" if special else "")
        bar = "#" * max(1, round(width * c / top))
        lines.append(f"{label:>26} {c:>9} {bar}")
    if hist.nan:
        lines.append(f"{'NaN':>26} {hist.nan:>9}")
    if not lines:
        return "(empty)"
    if any(special and lo != up for lo, up, _, special in merged):
        lines.append("  * underflow/overflow beyond the grid window")
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
