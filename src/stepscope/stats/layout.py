"""The spine row layout and its Chan merge: the bottom of stepscope, numpy only (no torch).

A spine row is ``SPINE_WIDTH`` float64 numbers in :data:`SPINE_FIELDS` order. The first
:data:`N_COUNTS` are exact counts (:data:`COUNT_FIELDS`: ``total, finite, zero, negative, nan,
posinf, neginf``); the rest (:data:`FLOAT_FIELDS`) are over the finite values: ``min, max,
absmax`` (NaN when there is none), the sums ``sum, sum_squares, sum_abs`` (0.0 when there is
none) and ``mean, m2`` (Chan's moments, NaN when there is none). Every spine is accumulated in
:data:`REDUCTION_DTYPE`.

The torch reductions (:mod:`stepscope.stats.reduce`) write rows in this layout; the history
stores, merges and reads them with this module alone, so that reading a run needs no torch.
:func:`merge_spine_rows` is the one implementation of the merge: the torch path runs the same
operations in the same order (:func:`merge_rows_with` with ``torch`` as the array namespace) and a
test checks the two agree bit for bit.

Example
-------
>>> import numpy as np
>>> a = np.array([2, 2, 0, 0, 0, 0, 0, 1.0, 3.0, 3.0, 4.0, 10.0, 4.0, 2.0, 2.0])  # [1, 3]
>>> b = np.array([1, 1, 0, 0, 0, 0, 0, 5.0, 5.0, 5.0, 5.0, 25.0, 5.0, 5.0, 0.0])  # [5]
>>> row = merge_spine_rows(a, b)
>>> [float(row[FIELD_INDEX[k]]) for k in ("total", "min", "max", "mean", "m2")]
[3.0, 1.0, 5.0, 3.0, 8.0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

#: The exact counts that lead every spine row, in storage order.
COUNT_FIELDS: tuple[str, ...] = (
    "total",
    "finite",
    "zero",
    "negative",
    "nan",
    "posinf",
    "neginf",
)
#: The float fields over the finite values that follow the counts.
FLOAT_FIELDS: tuple[str, ...] = (
    "min",
    "max",
    "absmax",
    "sum",
    "sum_squares",
    "sum_abs",
    "mean",
    "m2",
)
#: The float fields that are sums: exactly 0.0 (never undefined) when no finite value was seen.
SUM_FIELDS: tuple[str, ...] = ("sum", "sum_squares", "sum_abs")
#: Every field of a spine row, in storage order.
SPINE_FIELDS: tuple[str, ...] = COUNT_FIELDS + FLOAT_FIELDS
#: Columns of a spine row.
SPINE_WIDTH = len(SPINE_FIELDS)
#: Number of leading exact counts.
N_COUNTS = len(COUNT_FIELDS)
#: Column of each field.
FIELD_INDEX: dict[str, int] = {name: k for k, name in enumerate(SPINE_FIELDS)}
#: Moments and sums are accumulated in this dtype whatever the input dtype.
REDUCTION_DTYPE = "float64"
#: Reduction dtypes a stored spine may name. Append-only: the history stores the position.
REDUCTION_DTYPES: tuple[str, ...] = ("float32", "float64")


def host_array(values: Any) -> np.ndarray:
    """``values`` as a numpy array; a torch tensor is detached and copied to the host first.

    Duck-typed on ``.detach``, so that this module (and every value class that decodes rows)
    never imports torch.

    >>> host_array([1, 2]).tolist()
    [1, 2]
    """
    if hasattr(values, "detach"):  # a torch.Tensor
        values = values.detach().cpu().numpy()
    return np.asarray(values)


def merge_spine_rows(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    """Merge spine rows ``a`` and ``b`` (``[..., SPINE_WIDTH]``, float64) into a new array.

    Counts and sums add exactly (float64 sums), ``min``/``max``/``absmax`` combine with
    ``fmin``/``fmax``, and ``mean``/``m2`` merge with Chan's pairwise formulas over the finite
    counts: with ``n = n_a + n_b`` and ``delta = mean_b - mean_a``,
    ``mean = mean_a + delta * n_b / n`` and ``m2 = m2_a + m2_b + delta**2 * n_a * n_b / n``. A
    side with no finite value contributes nothing to the moments.

    Examples
    --------
    >>> z = np.full(SPINE_WIDTH, np.nan); z[:N_COUNTS] = 0; z[[10, 11, 12]] = 0  # nothing seen
    >>> one = z.copy(); one[:2] = 1; one[7:] = [2.0, 2.0, 2.0, 2.0, 4.0, 2.0, 2.0, 0.0]
    >>> bool((merge_spine_rows(z, one) == one).all())
    True
    """
    a64, b64 = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # 0/0 where a side is empty: masked
        return merge_rows_with(np, a64, b64)


def merge_rows_with(xp: Any, a: Any, b: Any) -> Any:
    """:func:`merge_spine_rows` over the array namespace ``xp`` (``numpy`` or ``torch``).

    ``a`` and ``b`` are float64 arrays of ``xp``; the result is a new one. The same operations
    in the same order for every namespace, so torch rows merge bit for bit like numpy rows (and
    on their device, without a host synchronisation).
    """
    i = FIELD_INDEX
    out = a + b  # counts and the three sums
    out[..., i["min"]] = xp.fmin(a[..., i["min"]], b[..., i["min"]])
    for name in ("max", "absmax"):
        out[..., i[name]] = xp.fmax(a[..., i[name]], b[..., i[name]])
    na, nb = a[..., i["finite"]], b[..., i["finite"]]
    ma, mb = a[..., i["mean"]], b[..., i["mean"]]
    m2a, m2b = a[..., i["m2"]], b[..., i["m2"]]
    n = na + nb
    delta = mb - ma
    mean = ma + delta * (nb / n)
    m2 = m2a + m2b + delta * delta * (na * nb / n)
    out[..., i["mean"]] = xp.where(na == 0, mb, xp.where(nb == 0, ma, mean))
    out[..., i["m2"]] = xp.where(na == 0, m2b, xp.where(nb == 0, m2a, m2))
    return out
