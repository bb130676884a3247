"""Stored rows back to records and batches (the slow, convenient direction).

Example
-------
>>> import numpy as np
>>> from stepscope.history.layout import observation_dtype, histogram_dtype
>>> from stepscope.stats import SPINE_WIDTH, HistogramDescriptor
>>> d = HistogramDescriptor()
>>> rows = np.zeros(0, observation_dtype(SPINE_WIDTH))
>>> records_from_rows(rows, np.zeros(0, histogram_dtype(d.width)), [], d)
[]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.batch import OBSERVED, ObservationBatch, member_of
from stepscope.history.schema import ObservationRecord
from stepscope.history.vocab import Phase, Presence, ScaleGrad, Stream
from stepscope.stats import Histogram, HistogramDescriptor, RunningStats
from stepscope.stats.layout import REDUCTION_DTYPES

_KEY = ("step", "site", "stream", "phase", "micro_batch")


def _key(row: Any) -> tuple[int, ...]:
    return tuple(int(row[k]) for k in _KEY)


def records_from_rows(
    obs: np.ndarray,
    hist: np.ndarray,
    disclosures: list[tuple[str, ...]],
    descriptor: HistogramDescriptor,
) -> list[ObservationRecord]:
    """Observation rows (with matching histogram rows) as :class:`ObservationRecord` objects."""
    hist_by_key = {_key(h): h["counts"] for h in hist}
    out = []
    for r in obs:
        presence = member_of(Presence, r["presence"])
        spine = histogram = None
        if r["presence"] == OBSERVED:
            try:
                spine = RunningStats.from_vector(r["spine"], REDUCTION_DTYPES[int(r["rdtype"])])
            except (ValueError, OverflowError, Refusal) as exc:  # NaN or impossible counts
                raise Refusal(
                    "history_artifact_corrupt",
                    f"stored spine of site {int(r['site'])} at step {int(r['step'])} is not a "
                    f"valid spine ({str(exc)[:100]}).",
                    ["run `stepscope verify`", "restore the chunk from a copy"],
                ) from None
            counts = hist_by_key.get(_key(r))
            if counts is not None:
                histogram = Histogram.from_vector(counts, descriptor)
        d = int(r["disclosure"])
        out.append(
            ObservationRecord(
                step=int(r["step"]),
                site_id=int(r["site"]),
                stream=member_of(Stream, r["stream"]),
                phase=member_of(Phase, r["phase"]),
                presence=presence,
                spine=spine,
                histogram=histogram,
                scale_grad=None if r["scale_grad"] == 0 else member_of(ScaleGrad, r["scale_grad"]),
                micro_batch=None if r["micro_batch"] < 0 else int(r["micro_batch"]),
                disclosures=disclosures[d] if d >= 0 else (),
            )
        )
    return out


def _groups(rows: np.ndarray, cols: list[str]) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Split rows into runs of equal ``cols`` (sorted, sites ascending inside each run)."""
    if len(rows) == 0:
        return []
    order = np.lexsort((rows["site"], *(rows[c] for c in reversed(cols))))
    rows = rows[order]
    change = np.zeros(len(rows), bool)
    change[0] = True
    for c in cols:
        change[1:] |= rows[c][1:] != rows[c][:-1]
    starts = np.flatnonzero(change)
    ends = np.append(starts[1:], len(rows))
    return [(tuple(int(rows[c][s]) for c in cols), rows[s:e]) for s, e in zip(starts, ends)]


def batches_from_rows(
    obs: np.ndarray, hist: np.ndarray, disclosures: list[tuple[str, ...]]
) -> dict[int, list[ObservationBatch]]:
    """Group stored rows back into columnar batches, per step (vectorised per group)."""
    cols = ["step", "stream", "phase", "micro_batch", "scale_grad", "rdtype", "disclosure"]
    hist_groups = dict(_groups(hist, ["step", "stream", "phase", "micro_batch"]))
    out: dict[int, list[ObservationBatch]] = {}
    for key, rows in _groups(obs, cols):
        step, stream, phase, micro, scale, rdtype, d = key
        hist_rows = histograms = None
        sel = hist_groups.get((step, stream, phase, micro))
        if sel is not None:
            pos = np.searchsorted(rows["site"], sel["site"])  # rows are sorted by site
            pos = np.minimum(pos, len(rows) - 1)
            keep = rows["site"][pos] == sel["site"]
            if keep.any():
                hist_rows, histograms = pos[keep], sel["counts"][keep]
        batch = ObservationBatch(
            stream=member_of(Stream, stream),
            phase=member_of(Phase, phase),
            site_ids=rows["site"],
            presence=rows["presence"],
            spines=rows["spine"],
            hist_rows=hist_rows,
            histograms=histograms,
            scale_grad=None if scale == 0 else member_of(ScaleGrad, scale),
            micro_batch=None if micro < 0 else micro,
            reduction_dtype=REDUCTION_DTYPES[rdtype],
            disclosures=disclosures[d] if d >= 0 else (),
        )
        out.setdefault(step, []).append(batch)
    return out
