"""Exact merges: rank segments, micro-batch folds, time coarsening.

Integer counts (the seven spine counts and every histogram bin) add exactly. ``min``/``max``/
``absmax`` merge by ``fmin``/``fmax`` (exact). ``sum``/``sum_squares``/``sum_abs`` add in float64,
and ``mean``/``m2`` merge with Chan's pairwise formulas

.. math::
    n = n_a + n_b,\\quad \\delta = \\bar x_b - \\bar x_a,\\quad
    \\bar x = \\bar x_a + \\delta n_b / n,\\quad M_2 = M_{2,a} + M_{2,b} + \\delta^2 n_a n_b / n

over the finite counts; floating fields are never called exact. Several inputs reduce as a
balanced pairwise tree.

Example
-------
>>> import torch
>>> from stepscope.stats import RunningStats
>>> a, b = RunningStats(), RunningStats()
>>> a.update(torch.tensor([1.0, 2.0])); b.update(torch.tensor([4.0]))
>>> float(merge_spine_rows(a.to_vector()[None], b.to_vector()[None])[0, 0])  # total count
3.0
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.batch import OBSERVED, ObservationBatch
from stepscope.stats.layout import merge_spine_rows

PARTIAL = "merged_partial_coverage"  # a row observed on one side only
HIST_PARTIAL = "histogram_partial_coverage"  # a histogram covers only part of its spine


def merge_batches(
    a: ObservationBatch, b: ObservationBatch, *, micro_batch: int | str | None = "same"
) -> ObservationBatch:
    """Merge two batches of the same stream and phase over the union of their sites.

    Rows observed on both sides merge; a row observed on one side keeps that side and discloses
    ``merged_partial_coverage``; rows observed on neither keep the first presence. A histogram
    that covers only part of its row's spine discloses ``histogram_partial_coverage``.
    """
    if (a.stream, a.phase, a.scale_grad) != (b.stream, b.phase, b.scale_grad):
        raise Refusal(
            "merge_incompatible",
            f"cannot merge {a.stream.value}/{a.phase.value}/{a.scale_grad} with "
            f"{b.stream.value}/{b.phase.value}/{b.scale_grad}.",
            ["merge only cells of the same stream, phase and scale provenance"],
        )
    if micro_batch == "same":
        if a.micro_batch != b.micro_batch:
            raise Refusal("merge_incompatible", "micro-batches differ; use fold_micro_batches.")
        micro_batch = a.micro_batch
    sites = np.union1d(a.site_ids, b.site_ids)
    k = len(sites)
    pa, sa, ha, hma = _align(a, sites)
    pb, sb, hb, hmb = _align(b, sites)
    oa, ob = pa == OBSERVED, pb == OBSERVED
    spines = np.full((k, sa.shape[1]), np.nan)
    both = oa & ob
    spines[both] = merge_spine_rows(sa[both], sb[both])
    spines[oa & ~ob] = sa[oa & ~ob]
    spines[ob & ~oa] = sb[ob & ~oa]
    presence = np.where(oa | ob, OBSERVED, np.where(pa > 0, pa, pb)).astype(np.uint8)
    rows: list[set[str]] = [set() for _ in range(k)]  # per-row disclosures
    for batch in (a, b):
        pos = np.searchsorted(sites, batch.site_ids)
        for j, p in enumerate(pos):
            rows[p].update(batch.row_disclosure(j))
    for p in np.flatnonzero(oa != ob):
        rows[p].add(PARTIAL)
    hist_rows = histograms = None
    if ha is not None or hb is not None:
        width = (ha if ha is not None else hb).shape[1]  # type: ignore[union-attr]
        if ha is not None and hb is not None and ha.shape[1] != hb.shape[1]:
            raise Refusal("sketch_descriptor_mismatch", "histogram widths differ.", [])
        counts = np.zeros((k, width), np.int64)
        have = np.zeros(k, bool)
        for h, m in ((ha, hma), (hb, hmb)):
            if h is not None:
                counts[m] += h[m]
                have |= m
        # a histogram is complete only if every observed side contributed one
        for p in np.flatnonzero(((oa & ~hma) | (ob & ~hmb)) & have):
            rows[p].add(HIST_PARTIAL)
        hist_rows = np.flatnonzero(have)
        histograms = counts[have]
    return ObservationBatch(
        stream=a.stream,
        phase=a.phase,
        site_ids=sites,
        presence=presence,
        spines=spines,
        hist_rows=hist_rows,
        histograms=histograms,
        scale_grad=a.scale_grad,
        micro_batch=micro_batch,  # type: ignore[arg-type]
        reduction_dtype="float32"
        if "float32" in (a.reduction_dtype, b.reduction_dtype)
        else "float64",
        row_disclosures=tuple(tuple(sorted(r)) for r in rows) if any(rows) else None,
    )


def _align(batch: ObservationBatch, sites: np.ndarray):
    k = len(sites)
    pos = np.searchsorted(sites, batch.site_ids)
    presence = np.zeros(k, np.uint8)
    presence[pos] = batch.presence
    spines = np.full((k, batch.spines.shape[1]), np.nan)
    spines[pos] = batch.spines
    if batch.hist_rows is None:
        return presence, spines, None, np.zeros(k, bool)
    hist = np.zeros((k, batch.histograms.shape[1]), np.int64)  # type: ignore[union-attr]
    mask = np.zeros(k, bool)
    hist[pos[batch.hist_rows]] = batch.histograms
    mask[pos[batch.hist_rows]] = True
    return presence, spines, hist, mask


def _tree(items: list[ObservationBatch], **kw) -> ObservationBatch:
    while len(items) > 1:
        pairs = [merge_batches(items[i], items[i + 1], **kw) for i in range(0, len(items) - 1, 2)]
        items = pairs + (items[-1:] if len(items) % 2 else [])
    return items[0]


def fold_micro_batches(batches: Sequence[ObservationBatch]) -> ObservationBatch:
    """Fold per-micro-batch cells of one stream/phase into one whole-step cell (pairwise tree)."""
    if not batches:
        raise Refusal("merge_incompatible", "no micro-batch cells to fold.", [])
    return _tree(list(batches), micro_batch=None)


def merge_step_batches(
    groups: Sequence[Sequence[ObservationBatch]],
) -> list[ObservationBatch]:
    """Merge several lists of batches (e.g. two steps, or N ranks at one step) cell-wise."""
    by_key: dict[tuple, list[ObservationBatch]] = {}
    for group in groups:
        for b in group:
            by_key.setdefault((b.stream, b.phase, b.micro_batch, b.scale_grad), []).append(b)
    return [_tree(items) for items in by_key.values()]


def merge_ranks(
    paths: Sequence[str | os.PathLike[str]], out: str | os.PathLike[str], *, durable: bool = True
) -> Path:
    """Merge per-rank artifacts of one run into one artifact at ``out``.

    Observations merge cell-wise across ranks (counts exact, Chan moments); step blocks agree or
    their truth becomes unknown; user scalars keep their rank as ``rank{r}/{name}``. The merged
    run record lists its sources in ``extra["merged_ranks"]``.
    """
    from stepscope.history.rankmerge import merge_rank_artifacts  # lazy: import cycle

    return merge_rank_artifacts([Path(p) for p in paths], Path(out), durable=durable)
