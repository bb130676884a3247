"""Step rows to events: the one pure function between the collector and every consumer.

:func:`events_from_step` turns what a collector writes for one step (a
:class:`~stepscope.history.StepBlockRecord` and its :class:`~stepscope.history.ObservationBatch`
rows) into :class:`ObserverEvent` s, so checks and trackers never re-scan a tensor.

Published spine scalars (:class:`SpineScalar`), per (site, stream, phase), from one spine row:

* ``l2`` = sqrt(sum_squares) over the finite elements,
* ``mean``, ``min``, ``max``, ``absmax`` over the finite elements,
* ``std`` = sqrt(m2 / finite), the population standard deviation of the finite elements,
* ``zero_fraction`` = zero / total (exact zeros over all elements),
* ``nonfinite_count`` = nan + posinf + neginf.

A row whose disclosures mark it as a sample estimate (``update_sampled:<k>``, see
:func:`stepscope.history.vocab.is_estimate`) gives events with ``estimated=True``.

A field with no defined value (no finite element, or an empty tensor) becomes an ``unavailable``
event with reason ``undefined_no_finite_values`` / ``undefined_empty_tensor`` — never 0 or NaN. A
row whose presence is not ``observed`` becomes one ``unavailable`` event whose reason is the
presence value (``not_scheduled``, ``capture_failed``, ...).

Event names are ``"{stream}.{phase}/{site}/{field}"`` (``.../mb{k}/...`` for micro-batch cells),
histograms ``"{stream}.{phase}/{site}"``; user scalars keep their own names.

Example
-------
>>> import torch
>>> from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
>>> from stepscope.stats import HistogramDescriptor, reduce_spines
>>> rows = reduce_spines([torch.tensor([3.0, 0.0, -4.0])]).numpy()
>>> batch = ObservationBatch.observed("activation", "forward", [0], rows)
>>> site = SiteRecord(0, "fc1", "torch.nn.Linear", "f32[3]")
>>> ev = events_from_step(StepBlockRecord(7, examples_seen=448, epoch=0), [batch], [site],
...                       HistogramDescriptor(), scalars={"loss": 0.5})
>>> {e.name: e.value for e in ev}["activation.forward/fc1/l2"]
5.0
>>> ev[-1].name, ev[-1].examples_seen
('loss', 448)
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.events.coordinates import Axes, GradientStage, Subject
from stepscope.events.event import (
    EventSource,
    HistogramEvent,
    ObserverEvent,
    ScalarEvent,
    UnavailableEvent,
)
from stepscope.events.payload import HistogramPayload
from stepscope.history.batch import OBSERVED, ObservationBatch, member_of
from stepscope.history.schema import SiteRecord, StepBlockRecord
from stepscope.history.vocab import GRADIENT_STREAMS, Presence, ScaleGrad, is_estimate
from stepscope.stats.layout import SPINE_FIELDS

__all__ = ["SpineScalar", "event_prefix", "events_from_step", "spine_scalars"]


class SpineScalar(str, enum.Enum):
    """The spine-derived scalars published per (site, stream, phase) (see module docstring)."""

    L2 = "l2"
    MEAN = "mean"
    STD = "std"
    MIN = "min"
    MAX = "max"
    ABSMAX = "absmax"
    ZERO_FRACTION = "zero_fraction"
    NONFINITE_COUNT = "nonfinite_count"


UNDEFINED_NO_FINITE = "undefined_no_finite_values"
UNDEFINED_EMPTY = "undefined_empty_tensor"


def _col(name: str) -> int:
    return SPINE_FIELDS.index(name)


def spine_scalars(spines: np.ndarray) -> dict[SpineScalar, np.ndarray]:
    """Vectorised published scalars of spine rows ``(n, SPINE_WIDTH)``; NaN marks undefined.

    NaN here is internal bookkeeping only: :func:`events_from_step` turns it into an
    ``unavailable`` event with the reason, it never reaches a consumer as a value.
    """
    s = np.asarray(spines, dtype=np.float64)

    def c(name: str) -> np.ndarray:
        return s[:, _col(name)]

    finite, total = c("finite"), c("total")
    has = finite > 0
    with np.errstate(invalid="ignore", divide="ignore"):
        out = {
            SpineScalar.L2: np.where(has, np.sqrt(c("sum_squares")), np.nan),
            SpineScalar.MEAN: np.where(has, c("mean"), np.nan),
            SpineScalar.STD: np.where(has, np.sqrt(c("m2") / finite), np.nan),
            SpineScalar.MIN: np.where(has, c("min"), np.nan),
            SpineScalar.MAX: np.where(has, c("max"), np.nan),
            SpineScalar.ABSMAX: np.where(has, c("absmax"), np.nan),
            SpineScalar.ZERO_FRACTION: np.where(total > 0, c("zero") / total, np.nan),
            SpineScalar.NONFINITE_COUNT: c("nan") + c("posinf") + c("neginf"),
        }
    return out


def event_prefix(stream: Any, phase: Any, site: str, micro_batch: int | None) -> str:
    """The tag prefix ``"{stream}.{phase}/{site}"`` (plus ``/mb{k}`` for a micro-batch cell)."""
    base = f"{stream.value}.{phase.value}/{site}"
    return base if micro_batch is None else f"{base}/mb{micro_batch}"


def events_from_step(
    block: StepBlockRecord,
    batches: Sequence[ObservationBatch],
    sites: Sequence[SiteRecord],
    descriptor: Any,
    scalars: Mapping[str, float] | None = None,
) -> list[ObserverEvent]:
    """All events of one step, in batch and row order, then user scalars.

    Parameters
    ----------
    block
        The step block: its ``optimizer_step``, ``examples_seen`` and ``epoch`` are the
        :class:`~stepscope.events.Axes` every event shares.
    batches
        The step's observation batches (as written by ``HistoryWriter.write_step``).
    sites
        The writer's/reader's site catalog; ``site_id`` indexes it.
    descriptor
        The run's :class:`~stepscope.stats.HistogramDescriptor`.
    scalars
        User scalars logged at this step (name -> value).

    Returns
    -------
    list[ObserverEvent]
        ``scalar`` events per published spine field, ``histogram_counts`` per histogram row,
        ``unavailable`` for non-observed rows and undefined fields, ``scalar`` per user scalar.
    """
    names = {s.site_id: s.name for s in sites}
    axes = Axes(block.optimizer_step, block.examples_seen, block.epoch)
    out: list[ObserverEvent] = []
    for b in batches:
        out.extend(_batch_events(b, names, descriptor, axes))
    for name, value in (scalars or {}).items():
        out.append(ScalarEvent(name, axes, float(value)))
    return out


def _batch_events(
    b: ObservationBatch, names: Mapping[int, str], descriptor: Any, axes: Axes
) -> list[ObserverEvent]:
    stage: GradientStage | None = None
    scale: ScaleGrad | None = None
    if b.stream in GRADIENT_STREAMS:
        stage, scale = GradientStage.of(b.phase, b.micro_batch), b.scale_grad
    derived = [(f.value, v.tolist()) for f, v in spine_scalars(b.spines).items()]
    totals = b.spines[:, _col("total")].tolist()
    hist_of: dict[int, np.ndarray] = {}
    if b.hist_rows is not None and b.histograms is not None:
        hist_of = {int(r): b.histograms[j] for j, r in enumerate(b.hist_rows)}
    spine, scalar = EventSource.SPINE, ScalarEvent.measured
    out: list[ObserverEvent] = []
    for i, sid in enumerate(b.site_ids.tolist()):
        if sid not in names:
            raise Refusal(
                "history_series_unknown",
                f"{b.stream.value} row names site id {sid}, absent from the site catalog.",
                ["pass the writer's (or reader's) sites"],
            )
        site = names[sid]
        # one validated subject per row, shared by the row's scalars, histogram and absences
        subject = Subject(site, b.stream, b.phase, b.micro_batch, stage, scale)
        prefix = event_prefix(b.stream, b.phase, site, b.micro_batch)
        if b.presence[i] != OBSERVED:
            reason = member_of(Presence, b.presence[i]).value
            out.append(UnavailableEvent(prefix, axes, reason, subject=subject, source=spine))
            continue
        # a sampled row: its values describe the sample (per row, never batch-wide)
        estimated = is_estimate(b.row_disclosure(i))
        for field, values in derived:
            v = values[i]
            name = f"{prefix}/{field}"
            if math.isnan(v):
                reason = UNDEFINED_EMPTY if totals[i] == 0 else UNDEFINED_NO_FINITE
                out.append(
                    UnavailableEvent(name, axes, reason, subject=subject, field=field, source=spine)
                )
            else:
                out.append(scalar(name, axes, v, subject, field, spine, estimated))
        if i in hist_of:
            payload = HistogramPayload(hist_of[i], b.spines[i], descriptor)
            out.append(
                HistogramEvent(
                    prefix,
                    axes,
                    payload,
                    subject=subject,
                    field="histogram",
                    estimated=estimated,
                )
            )
    return out
