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

NaN and +-inf have no place on either axis; they are in the spine's ``nonfinite_count`` scalar.

Example
-------
>>> import torch
>>> from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines
>>> from stepscope.events.event import HistogramPayload
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

from stepscope.events.event import HistogramPayload
from stepscope.stats import SPECIAL_FIELDS

__all__ = ["exponent_view", "exponent_view_raw", "np_histogram", "tensorboard_raw"]


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
    nz = np.flatnonzero(counts)
    if not len(nz):
        return None
    index, counts = index[nz[0] : nz[-1] + 1], counts[nz[0] : nz[-1] + 1]
    return {
        "min": float(index[0]),
        "max": float(index[-1]),
        "num": int(counts.sum()),
        "sum": float((index * counts).sum()),
        "sum_squares": float((index * index * counts).sum()),
        "bucket_limits": [float(i) + 0.5 for i in index],
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
    while len(counts) > max_bins:
        if len(counts) % 2:
            counts = np.append(counts, 0)
            edges = np.append(edges, edges[-1] + (edges[1] - edges[0]))
        counts = counts[0::2] + counts[1::2]
        edges = edges[0::2]
    return counts, edges
