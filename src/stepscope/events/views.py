"""Pure functions from a histogram payload to what a tracker writes (no I/O, no optional deps).

* :func:`tensorboard_raw` — ``add_histogram_raw`` keyword arguments on the real axis: exact
  bucket counts of our signed log2 grid and the spine's exact ``num, min, max, sum, sum_squares``.
* :func:`exponent_view` — the same counts against the **signed log2 bin index** ``i``:
  ``0`` exact zero; ``+-1`` positive/negative underflow (``0 < |x| < 2**lo_exp``);
  ``+-(k + 2)`` bin ``k`` of that sign, i.e. ``2**(lo_exp + k/bpo) <= |x| < 2**(lo_exp + (k+1)/bpo)``;
  ``+-(n_bins + 2)`` overflow. TensorBoard's UI re-bins linearly into 30 bins, which collapses
  every small magnitude into the bin around zero; on the index axis each octave keeps its width.
* :func:`exponent_view_raw` — :func:`exponent_view` as ``add_histogram_raw`` arguments.
* :func:`np_histogram` — ``(counts, edges)`` on the index axis for ``wandb.Histogram``
  (at most ``max_bins`` bins: adjacent index bins are summed pairwise, exactly, until it fits).
* :func:`value_np_histogram` — ``(counts, edges)`` on the **value** axis (our exact bins, the
  same ones :func:`tensorboard_raw` writes), coarsened the same way, for ``wandb.Histogram``.
* :func:`log2_abs_view_raw` — TensorBoard's exponent view, one per sign: the x axis is
  ``log2|x|`` in octaves (bin ``k`` spans ``[lo_exp + k/bpo, lo_exp + (k+1)/bpo)``), underflow
  is drawn as the octave ``[lo_exp - 1, lo_exp)`` and overflow as ``[hi_exp, hi_exp + 1)``.
  Exact zeros are not on a log axis (they are the ``zero_fraction`` scalar).
* :func:`nonfinite_counts` / :func:`nonfinite_raw` — the exact NaN, +inf and -inf counts, as
  scalars and as a three-band histogram (``-1`` = -inf, ``0`` = NaN, ``+1`` = +inf).
* :func:`confusion_image` — a confusion matrix as an RGB image (rows: true class, columns:
  predicted class, shade: the row's fraction, white 0 to dark blue 1).

NaN and +-inf have no place on a value or exponent axis; they have their own counts and bands.

Example
-------
>>> import torch
>>> from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines
>>> from stepscope.events.payload import HistogramPayload
>>> x = torch.tensor([0.0, 1.0, 1.0, -2.0])
>>> d = HistogramDescriptor()
>>> p = HistogramPayload(reduce_histograms([x], d)[0].numpy(), reduce_spines([x])[0].numpy(), d)
>>> idx, counts = exponent_view(p)
>>> [(int(i), int(c)) for i, c in zip(idx, counts) if c]
[(-198, 1), (0, 1), (194, 2)]
>>> raw = tensorboard_raw(p)
>>> sum(raw["bucket_counts"]), raw["num"], raw["min"], raw["sum_squares"]
(4, 4, -2.0, 6.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.events.payload import HistogramPayload
from stepscope.stats import SPECIAL_FIELDS

__all__ = [
    "NONFINITE_FIELDS",
    "confusion_image",
    "exponent_view",
    "exponent_view_raw",
    "log2_abs_view_raw",
    "nonfinite_counts",
    "nonfinite_raw",
    "np_histogram",
    "tensorboard_raw",
    "value_np_histogram",
]

#: The non-finite special counts, in band order (-inf, NaN, +inf).
NONFINITE_FIELDS: tuple[str, ...] = ("neginf", "nan", "posinf")


def tensorboard_raw(payload: HistogramPayload) -> dict[str, Any]:
    """``add_histogram_raw`` keyword arguments with exact counts and the spine's exact moments."""
    return payload.histogram().to_tensorboard(payload.stats())


def _special(payload: HistogramPayload, name: str) -> int:
    nb = payload.descriptor.n_bins
    return int(payload.counts[2 * nb + SPECIAL_FIELDS.index(name)])


def exponent_view(payload: HistogramPayload) -> tuple[np.ndarray, np.ndarray]:
    """Signed bin indices ``-(n_bins+2) .. n_bins+2`` and the finite counts at each (int64)."""
    nb = payload.descriptor.n_bins
    c = payload.counts
    neg, pos = c[:nb], c[nb : 2 * nb]
    counts = np.concatenate(
        [
            [_special(payload, "overflow_neg")],
            neg[::-1],  # index -(k+2) for negative bin k, most negative first
            [_special(payload, "underflow_neg"), _special(payload, "zero")],
            [_special(payload, "underflow_pos")],
            pos,
            [_special(payload, "overflow_pos")],
        ]
    ).astype(np.int64)
    index = np.arange(-(nb + 2), nb + 3, dtype=np.int64)
    return index, counts


def exponent_view_raw(payload: HistogramPayload) -> dict[str, Any] | None:
    """:func:`exponent_view` as ``add_histogram_raw`` arguments (``None`` if no finite value).

    Bucket ``i`` spans ``(i - 0.5, i + 0.5]``; ``min``/``max`` are the lowest and highest occupied
    indices and ``sum``/``sum_squares`` are the index moments (exact integers).
    """
    index, counts = exponent_view(payload)
    sl = _occupied(counts)
    if sl is None:
        return None
    index, counts = index[sl].astype(np.float64), counts[sl]
    return _raw_args(index[0], index[-1], index, index + 0.5, counts)


def _occupied(counts: np.ndarray) -> slice | None:
    """The slice from the first to the last non-zero count (``None`` when all are zero)."""
    nz = np.flatnonzero(counts)
    return slice(nz[0], nz[-1] + 1) if len(nz) else None


def _raw_args(
    lo: float, hi: float, centers: np.ndarray, rights: np.ndarray, counts: np.ndarray
) -> dict[str, Any]:
    """``add_histogram_raw`` arguments: buckets ending at ``rights``, moments from ``centers``."""
    return {
        "min": float(lo),
        "max": float(hi),
        "num": int(counts.sum()),
        "sum": float((centers * counts).sum()),
        "sum_squares": float((centers * centers * counts).sum()),
        "bucket_limits": [float(r) for r in rights],
        "bucket_counts": [int(v) for v in counts],
    }


def np_histogram(
    payload: HistogramPayload, max_bins: int = 512
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(counts, edges)`` on the signed index axis, trimmed, at most ``max_bins`` bins.

    Returns ``None`` when there is no finite value. Coarsening sums adjacent bins (exact counts);
    the edges then span two (four, ...) index units.
    """
    index, counts = exponent_view(payload)
    nz = np.flatnonzero(counts)
    if not len(nz):
        return None
    counts = counts[nz[0] : nz[-1] + 1]
    edges = np.arange(len(counts) + 1, dtype=np.float64) + index[nz[0]] - 0.5
    return _coarsen(counts, edges, max_bins)


def _coarsen(counts: np.ndarray, edges: np.ndarray, max_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Sum adjacent bins pairwise (exact counts) until at most ``max_bins`` remain."""
    while len(counts) > max_bins:
        n = len(counts) - len(counts) % 2  # an odd last bin is kept as it is
        counts = np.concatenate([counts[0:n:2] + counts[1:n:2], counts[n:]])
        edges = np.concatenate([edges[0 : n + 1 : 2], edges[n + 1 :]])
    return counts, edges


def value_np_histogram(
    payload: HistogramPayload, max_bins: int = 512
) -> tuple[np.ndarray, np.ndarray] | None:
    """``(counts, edges)`` on the value axis: the exact finite bins :func:`tensorboard_raw` writes.

    Edges are ascending real values (``len(edges) == len(counts) + 1``); the first edge is the
    spine's exact finite minimum and the last its exact maximum. Returns ``None`` when there is
    no finite value. At most ``max_bins`` bins (adjacent bins summed exactly).
    """
    raw = tensorboard_raw(payload)
    if not raw["bucket_counts"]:
        return None
    counts = np.asarray(raw["bucket_counts"], dtype=np.int64)
    edges = np.asarray([raw["min"], *raw["bucket_limits"]], dtype=np.float64)
    edges[1:] = np.maximum(edges[1:], edges[0])  # zero-width zero bucket after a clamped edge
    edges = np.maximum.accumulate(edges)
    return _coarsen(counts, edges, max_bins)


def log2_abs_view_raw(payload: HistogramPayload, sign: int) -> dict[str, Any] | None:
    """``add_histogram_raw`` arguments of one sign's counts against ``log2|x|`` (octaves).

    ``sign`` is ``+1`` or ``-1``. Bucket limits are right edges in octaves: underflow
    ``lo_exp``, bin ``k`` ``lo_exp + (k+1)/bpo``, overflow ``hi_exp + 1``. ``min``/``max`` are the
    outer edges of the occupied buckets; ``sum``/``sum_squares`` use bucket midpoints (an
    estimate: TensorBoard draws from the buckets). ``None`` when the sign has no finite non-zero
    value.
    """
    d = payload.descriptor
    nb = d.n_bins
    c = payload.counts
    side = "pos" if sign > 0 else "neg"
    bins = c[nb : 2 * nb] if sign > 0 else c[:nb]
    counts = np.concatenate(
        [[_special(payload, f"underflow_{side}")], bins, [_special(payload, f"overflow_{side}")]]
    ).astype(np.int64)
    inner = d.lo_exp + np.arange(nb + 1, dtype=np.float64) / d.bins_per_octave
    lefts = np.concatenate([[d.lo_exp - 1.0], inner])
    rights = np.concatenate([inner, [d.hi_exp + 1.0]])
    sl = _occupied(counts)
    if sl is None:
        return None
    counts, lefts, rights = counts[sl], lefts[sl], rights[sl]
    return _raw_args(lefts[0], rights[-1], (lefts + rights) / 2, rights, counts)


def nonfinite_counts(payload: HistogramPayload) -> dict[str, int]:
    """The exact ``{"neginf": n, "nan": n, "posinf": n}`` counts of the payload."""
    return {name: _special(payload, name) for name in NONFINITE_FIELDS}


def nonfinite_raw(payload: HistogramPayload) -> dict[str, Any] | None:
    """Three bands for ``add_histogram_raw``: ``-1`` -inf, ``0`` NaN, ``+1`` +inf (``None`` if none).

    Band ``i`` spans ``(i - 0.5, i + 0.5]``; counts are exact.
    """
    found = nonfinite_counts(payload)
    counts = np.array([found[n] for n in NONFINITE_FIELDS], dtype=np.int64)
    sl = _occupied(counts)
    if sl is None:
        return None
    index = np.array([-1.0, 0.0, 1.0])
    return _raw_args(index[sl][0] - 0.5, index[sl][-1] + 0.5, index, index + 0.5, counts)


def confusion_image(counts: np.ndarray, size: int = 256) -> np.ndarray:
    """``counts[true, predicted]`` as an ``(H, W, 3)`` uint8 image, about ``size`` px square.

    Each cell is shaded by its share of its row (``counts[t, p] / counts[t].sum()``, the recall
    of true class ``t`` on the diagonal): white is 0, dark blue is 1; an empty row stays white.
    Cells are square blocks of ``max(4, size // n)`` pixels with a one-pixel grey grid.

    >>> img = confusion_image(np.array([[3, 1], [0, 4]]), size=8)
    >>> img.shape, img.dtype.name, img[1, 1].tolist(), img[1, 5].tolist()
    ((9, 9, 3), 'uint8', [70, 100, 144], [193, 203, 218])
    """
    c = np.asarray(counts, dtype=np.float64)
    n = c.shape[0]
    totals = c.sum(axis=1, keepdims=True)
    share = np.divide(c, totals, out=np.zeros_like(c), where=totals > 0)
    white, blue = np.array([255.0, 255.0, 255.0]), np.array([8.0, 48.0, 107.0])
    cells = white + share[..., None] * (blue - white)  # (n, n, 3)
    k = max(4, size // max(n, 1))
    img = np.repeat(np.repeat(cells, k, axis=0), k, axis=1)
    out = np.full((n * k + 1, n * k + 1, 3), 160.0)  # the grid colour
    out[1:, 1:] = img
    grid = np.arange(0, n * k + 1, k)
    out[grid, :] = 160.0
    out[:, grid] = 160.0
    return np.rint(out).astype(np.uint8)
