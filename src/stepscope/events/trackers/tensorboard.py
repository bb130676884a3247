"""TensorBoard tracker: spine scalars with ``add_scalar``, exact histograms with ``add_histogram_raw``.

For every ``histogram_counts`` event two histograms are written:

* ``{name}`` — our signed log2 buckets on the real axis (:func:`~stepscope.events.views.tensorboard_raw`):
  exact counts, and ``num, min, max, sum, sum_squares`` straight from the spine (finite values);
* ``{name}/exponent_view`` — the same counts against the signed log2 bin index
  (:func:`~stepscope.events.views.exponent_view_raw`), because TensorBoard's UI re-bins linearly.

Scalars are written as new-style float64 tensor summaries (exact; read them with
``EventAccumulator.Tensors``). Verdicts become text entries (``add_text``); ``unavailable`` events are counted, never written as 0.
The x-axis (``global_step``) is the tracker's :class:`~stepscope.events.Axis` (default
``optimizer_step``); the axis name is recorded once as the text entry ``stepscope/axis``.

Example
-------
>>> from stepscope.events import EventStream
>>> stream = EventStream()
>>> tb = stream.subscribe(TensorBoardTracker("runs/tb"))  # doctest: +SKIP
"""

from __future__ import annotations

import os
from typing import Any

from stepscope.errors import require_extra
from stepscope.events.event import Axis, ObserverEvent
from stepscope.events.trackers.base import Tracker
from stepscope.events.views import exponent_view_raw, tensorboard_raw

__all__ = ["EXPONENT_VIEW_SUFFIX", "TensorBoardTracker"]

#: Tag suffix of the exponent-view histogram.
EXPONENT_VIEW_SUFFIX = "/exponent_view"


class TensorBoardTracker(Tracker):
    """Write events to a TensorBoard log directory.

    Parameters
    ----------
    log_dir
        Directory for the event files (created). Ignored when ``writer`` is given.
    axis
        The x-axis (``optimizer_step``, ``examples_seen`` or ``epoch``).
    exponent_view
        Also write ``{name}/exponent_view`` for each histogram.
    writer
        An existing ``torch.utils.tensorboard.SummaryWriter`` (not closed by :meth:`close`).
    flush_every_batch
        Flush after each published batch (default False: the writer flushes every 120 s and on
        :meth:`close`).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        axis: Axis | str = Axis.OPTIMIZER_STEP,
        exponent_view: bool = True,
        writer: Any = None,
        flush_every_batch: bool = False,
    ) -> None:
        super().__init__(axis)
        if writer is None:
            tb = require_extra("torch.utils.tensorboard", "tensorboard", "the TensorBoard tracker")
            writer = tb.SummaryWriter(log_dir=None if log_dir is None else str(log_dir))
            self._owns = True
        else:
            self._owns = False
        self.writer = writer
        self.exponent_view = exponent_view
        self.flush_every_batch = flush_every_batch
        self.skipped_no_finite = 0
        self.writer.add_text("stepscope/axis", f"x-axis: {self.axis.value}", 0)

    def write_scalar(self, event: ObserverEvent, x: int) -> None:
        """``add_scalar(name, value, x)`` as a float64 tensor summary (no float32 rounding)."""
        self.writer.add_scalar(event.name, event.value, x, new_style=True, double_precision=True)

    def write_histogram(self, event: ObserverEvent, x: int) -> None:
        """The exact histogram, and its exponent view (skipped when nothing is finite)."""
        payload = event.histogram
        raw = tensorboard_raw(payload)  # type: ignore[arg-type]
        if not raw["bucket_counts"]:
            self.skipped_no_finite += 1  # TensorBoard cannot show NaN/inf only; never a fake 0
            return
        self.writer.add_histogram_raw(event.name, global_step=x, **raw)
        if self.exponent_view:
            view = exponent_view_raw(payload)  # type: ignore[arg-type]
            if view is not None:
                self.writer.add_histogram_raw(
                    event.name + EXPONENT_VIEW_SUFFIX, global_step=x, **view
                )

    def write_verdict(self, event: ObserverEvent, x: int) -> None:
        """A text entry under ``event.name`` with the verdict message."""
        v = event.verdict
        self.writer.add_text(event.name, f"[{v.action}] {v.message}", x)  # type: ignore[union-attr]

    def end_batch(self) -> None:
        """Flush if asked to flush every batch."""
        if self.flush_every_batch:
            self.writer.flush()

    def flush(self) -> None:
        """Flush the event file."""
        self.writer.flush()

    def close(self) -> None:
        """Flush, and close the writer if this tracker created it."""
        self.writer.flush()
        if self._owns:
            self.writer.close()
