"""TensorBoard tracker: float32 scalars with ``add_scalar``, exact histograms with ``add_histogram_raw``.

Logged tags (``{name}`` is the event name, e.g. ``activation.forward/fc1``):

* scalar events — ``{name}`` with ``add_scalar`` as a plain float32 ``simple_value``, the form
  every TensorBoard loader (the default fast one included) shows on the Scalars page. Full
  float64 precision stays in the history artifact and the JSONL export.
* ``{name}`` (histogram) — our signed log2 buckets on the value axis
  (:func:`~stepscope.events.views.tensorboard_raw`): exact counts, and ``num, min, max, sum,
  sum_squares`` straight from the spine (finite values only: ``num`` is the finite count).
* ``{name}/exponent_view/positive`` and ``{name}/exponent_view/negative`` — one histogram per
  sign whose x axis is ``log2|x|`` **in octaves** (:func:`~stepscope.events.views.log2_abs_view_raw`):
  bin ``k`` spans ``[lo_exp + k/bpo, lo_exp + (k+1)/bpo)``, underflow is drawn as the octave
  just below ``lo_exp`` and overflow as the octave just above ``hi_exp``. TensorBoard's UI
  re-bins linearly, which on the value axis collapses every small magnitude into one bin; on
  the octave axis each octave keeps its width. Exact zeros are not on a log axis (they are the
  ``zero_fraction`` scalar).
* ``{name}/nan_count``, ``{name}/posinf_count``, ``{name}/neginf_count`` — exact scalars, every
  histogram step (0 is a real count here, not a missing value).
* ``{name}/nonfinite`` — the same counts drawn as three bands (``-1`` = -inf, ``0`` = NaN,
  ``+1`` = +inf), written on steps that have any.
* ``stepscope/axis`` (text) — the x-axis name; ``stepscope/run_record`` (text) and the
  run record's flat fields as hparams, when :meth:`TensorBoardTracker.write_run_record` is called
  (``stepscope export`` does).

Verdicts become text entries (``add_text``); ``unavailable`` events are counted, never written
as 0. The x-axis (``global_step``) is the tracker's :class:`~stepscope.events.Axis` (default
``optimizer_step``).

Example
-------
>>> import tempfile
>>> from stepscope.events import Axes, ScalarEvent
>>> tb = TensorBoardTracker(tempfile.mkdtemp())
>>> tb.on_events([ScalarEvent("loss", Axes(3), 0.5)])
>>> tb.counts.scalars
1
>>> tb.close()
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from stepscope.errors import require_extra
from stepscope.events.coordinates import Axis
from stepscope.events.event import HistogramEvent, ScalarEvent, VerdictEvent
from stepscope.events.trackers.base import Tracker
from stepscope.events.views import (
    log2_abs_view_raw,
    nonfinite_counts,
    nonfinite_raw,
    tensorboard_raw,
)

__all__ = [
    "EXPONENT_VIEW_SUFFIX",
    "NONFINITE_SUFFIX",
    "TensorBoardTracker",
    "hparams_of",
]

#: Tag suffix of the per-sign exponent views (``/positive``, ``/negative`` follow).
EXPONENT_VIEW_SUFFIX = "/exponent_view"
#: Tag suffix of the non-finite band histogram.
NONFINITE_SUFFIX = "/nonfinite"


def hparams_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """The run record flattened to ``a/b: value`` pairs of the types hparams accepts.

    >>> hparams_of({"run_id": "r", "rank": 0, "packages": {"torch": "2.4"}, "parent": None})
    {'run_id': 'r', 'rank': 0, 'packages/torch': '2.4'}
    """
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(f"{prefix}/{k}" if prefix else str(k), v)
        elif isinstance(value, bool | int | float | str):
            out[prefix] = value

    walk("", record)
    return out


class TensorBoardTracker(Tracker):
    """Write events to a TensorBoard log directory (tags: see the module docstring).

    Parameters
    ----------
    log_dir
        Directory for the event files (created). TensorBoard names the run after this
        directory's path below ``--logdir``. Ignored when ``writer`` is given.
    axis
        The x-axis (``optimizer_step``, ``examples_seen`` or ``epoch``).
    exponent_view
        Also write the per-sign ``{name}/exponent_view/{positive,negative}`` histograms.
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
            writer = tb.SummaryWriter(log_dir=None if log_dir is None else os.fspath(log_dir))
            self._owns = True
        else:
            self._owns = False
        self.writer = writer
        self.exponent_view = exponent_view
        self.flush_every_batch = flush_every_batch
        self.skipped_no_finite = 0
        self.hparams_error: str | None = None  # why the run record's hparams were not written
        self.writer.add_text("stepscope/axis", f"x-axis: {self.axis.value}", 0)

    def write_run_record(self, record: Mapping[str, Any]) -> None:
        """The run record as a JSON text entry and its flat fields as hparams."""
        text = json.dumps(dict(record), indent=2, sort_keys=True, default=str)
        # four-space indent: TensorBoard renders text as markdown, this keeps it a code block
        self.writer.add_text(
            "stepscope/run_record", "\n".join("    " + line for line in text.splitlines()), 0
        )
        try:
            from torch.utils.tensorboard.summary import hparams

            exp, ssi, sei = hparams(hparams_of(record), {})
            fw = self.writer._get_file_writer()
            for summary in (exp, ssi, sei):
                fw.add_summary(summary)
        except Exception as exc:  # hparams are a convenience; the text entry holds the record
            self.hparams_error = f"{type(exc).__name__}: {exc}"

    def write_scalar(self, event: ScalarEvent, x: int) -> None:
        """``add_scalar(name, value, x)`` as a float32 ``simple_value``."""
        self.writer.add_scalar(event.name, event.value, x)

    def write_histogram(self, event: HistogramEvent, x: int) -> None:
        """The exact histogram, the per-sign exponent views and the non-finite counts/bands."""
        payload = event.histogram
        for name, count in nonfinite_counts(payload).items():
            self.writer.add_scalar(f"{event.name}/{name}_count", float(count), x)
        bands = nonfinite_raw(payload)
        if bands is not None:
            self.writer.add_histogram_raw(event.name + NONFINITE_SUFFIX, global_step=x, **bands)
        raw = tensorboard_raw(payload)
        if not raw["bucket_counts"]:
            self.skipped_no_finite += 1  # no finite value: the bands above hold what there is
            return
        self.writer.add_histogram_raw(event.name, global_step=x, **raw)
        if self.exponent_view:
            for sign, label in ((1, "positive"), (-1, "negative")):
                view = log2_abs_view_raw(payload, sign)
                if view is not None:
                    self.writer.add_histogram_raw(
                        f"{event.name}{EXPONENT_VIEW_SUFFIX}/{label}", global_step=x, **view
                    )

    def write_verdict(self, event: VerdictEvent, x: int) -> None:
        """A text entry under ``event.name`` with the verdict message."""
        v = event.verdict
        self.writer.add_text(event.name, f"[{v.action}] {v.message}", x)

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
