"""TensorBoard tracker: the readable tag layout, float32 scalars, exact histograms, images, text.

Tags come from :class:`~stepscope.events.tags.TagLayout` (``act/<site>/rms``,
``grad/<site>/norm``, ``update/<site>/ratio``, ... — the table in :mod:`stepscope.events.tags`;
``detail="full"`` for every quantity). What each record becomes:

* a scalar — ``add_scalar(tag, value, x)``, a plain float32 ``simple_value``, the form every
  TensorBoard loader (the default fast one included) shows on the Scalars page. Full float64
  precision stays in the history artifact and the JSONL export.
* a histogram ``<stream>/<site>`` — our signed log2 buckets on the value axis
  (:func:`~stepscope.events.views.tensorboard_raw`): exact counts, and ``num, min, max, sum,
  sum_squares`` straight from the spine (finite values only: ``num`` is the finite count);
  with ``exponent_view`` also ``<tag>/exponent_view/positive`` and ``.../negative``: one
  histogram per sign whose x axis is ``log2|x|`` **in octaves**
  (:func:`~stepscope.events.views.log2_abs_view_raw`; TensorBoard re-bins linearly, which on
  the value axis collapses every small magnitude into one bin); and ``<tag>/nonfinite_bands`` — the
  NaN/inf counts as three bands (``-1`` = -inf, ``0`` = NaN, ``+1`` = +inf), on steps that have
  any.
* a confusion matrix ``<p>/confusion`` — an image (``add_image``; rows true class, columns
  predicted, shaded by the row's share, :func:`~stepscope.events.views.confusion_image`).
* a verdict — a text entry.
* ``run/record`` (text) — :meth:`TensorBoardTracker.write_run_record`: the run's name, id, x-axis,
  streams and cadences, then the whole run record as JSON (``stepscope export`` and live
  streaming write it). No HParams: the run record holds stepscope's internal settings, not the
  user's hyper-parameters.

``unavailable`` events are counted, never written as 0. The x-axis (``global_step``) is the
tracker's :class:`~stepscope.events.Axis` (default ``optimizer_step``).

TensorBoard's event-file writer checksums every record with a pure-Python CRC-32C (about 2.7 ms
for one 4 KB histogram record, 50 us for a scalar), which made writing — live or exported — cost
more than the statistics themselves. Where the ``crc32c`` package is installed (it comes with the
``tensorboard`` extra) :func:`use_fast_record_checksums` gives that writer its C implementation:
the same masked CRC-32C, byte for byte.

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
from stepscope.events.tags import Detail, HistogramRecord, MatrixRecord, ScalarRecord, TextRecord
from stepscope.events.trackers.base import Tracker
from stepscope.events.views import (
    confusion_image,
    log2_abs_view_raw,
    nonfinite_raw,
    tensorboard_raw,
)

__all__ = [
    "EXPONENT_VIEW_SUFFIX",
    "NONFINITE_SUFFIX",
    "RUN_RECORD_TAG",
    "TensorBoardTracker",
    "run_record_markdown",
    "use_fast_record_checksums",
]

#: Tag suffix of the per-sign exponent views (``/positive``, ``/negative`` follow).
EXPONENT_VIEW_SUFFIX = "/exponent_view"
#: Tag suffix of the non-finite band histogram.
NONFINITE_SUFFIX = "/nonfinite_bands"  # not "/nonfinite": that tag is the scalar count
#: The text tag of the run record.
RUN_RECORD_TAG = "run/record"


def use_fast_record_checksums() -> bool:
    """Give TensorBoard's record writer the ``crc32c`` package's C CRC-32C; ``False`` if absent.

    The masked checksum is TensorBoard's own formula (``tensorflow_stub.masked_crc32c``), so the
    event files are byte-identical; only the time changes. Idempotent.
    """
    try:
        import crc32c  # lazy: optional extra
        from tensorboard.summary.writer import record_writer  # lazy: optional extra
    except ImportError:
        return False
    if getattr(record_writer.masked_crc32c, "stepscope_fast", False):
        return True

    def masked_crc32c(data: bytes) -> int:
        x = crc32c.crc32c(data)
        return (((x >> 15) | (x << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    masked_crc32c.stepscope_fast = True  # type: ignore[attr-defined]
    record_writer.masked_crc32c = masked_crc32c
    return True


def run_record_markdown(record: Mapping[str, Any], name: str, axis: str) -> str:
    """The run record as TensorBoard text (markdown): a short table, then the JSON.

    >>> text = run_record_markdown({"run_id": "9f3c", "extra": {"streams": ["gradient"]}}, "a", "optimizer_step")
    >>> text.splitlines()[:4]
    ['| run | a |', '|---|---|', '| run id | 9f3c |', '| x-axis | optimizer_step |']
    """
    extra = record.get("extra") or {}
    rows = [
        ("run", name),
        ("run id", record.get("run_id")),
        ("x-axis", axis),
        ("streams", ", ".join(extra.get("streams", ()))),
        (
            "cadences (spine steps)",
            ", ".join(f"{k} {v}" for k, v in record.get("cadences", {}).items()),
        ),
        ("device", record.get("device")),
    ]
    table = ["| run | " + str(name) + " |", "|---|---|"]
    table += [f"| {k} | {v} |" for k, v in rows[1:] if v not in (None, "")]
    text = json.dumps(dict(record), indent=2, sort_keys=True, default=str)
    # four-space indent: TensorBoard renders text as markdown, this keeps the JSON a code block
    return "\n".join([*table, "", *("    " + line for line in text.splitlines())])


class TensorBoardTracker(Tracker):
    """Write events to a TensorBoard log directory (tags: see the module docstring).

    Parameters
    ----------
    log_dir
        Directory for the event files (created). TensorBoard names the run after this
        directory's path below ``--logdir``. Ignored when ``writer`` is given.
    axis
        The x-axis (``optimizer_step``, ``examples_seen`` or ``epoch``).
    detail
        ``"default"`` (the readable set) or ``"full"`` (every quantity).
    exponent_view
        Also write the per-sign ``<tag>/exponent_view/{positive,negative}`` histograms.
    writer
        An existing ``torch.utils.tensorboard.SummaryWriter`` (not closed by :meth:`close`).
    flush_every_batch
        Flush after each published batch (default False: the writer flushes every 120 s, on
        :meth:`flush` and on :meth:`close`; live streaming flushes every few seconds).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        *,
        axis: Axis | str = Axis.OPTIMIZER_STEP,
        detail: Detail | str = Detail.DEFAULT,
        exponent_view: bool = True,
        writer: Any = None,
        flush_every_batch: bool = False,
    ) -> None:
        super().__init__(axis, detail)
        use_fast_record_checksums()
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

    def write_run_record(self, record: Mapping[str, Any], name: str | None = None) -> None:
        """The run record as the text entry ``run/record`` (:func:`run_record_markdown`)."""
        label = name if name is not None else str(record.get("run_id"))
        self.writer.add_text(RUN_RECORD_TAG, run_record_markdown(record, label, self.axis.value), 0)

    def write_scalar(self, record: ScalarRecord, x: int) -> None:
        """``add_scalar(tag, value, x)`` as a float32 ``simple_value``."""
        self.writer.add_scalar(record.tag, record.value, x)

    def write_histogram(self, record: HistogramRecord, x: int) -> None:
        """The exact histogram, the per-sign exponent views and the non-finite bands."""
        payload, tag = record.histogram, record.tag
        bands = nonfinite_raw(payload)
        if bands is not None:
            self.writer.add_histogram_raw(tag + NONFINITE_SUFFIX, global_step=x, **bands)
        raw = tensorboard_raw(payload)
        if not raw["bucket_counts"]:
            self.skipped_no_finite += 1  # no finite value: the bands above hold what there is
            return
        self.writer.add_histogram_raw(tag, global_step=x, **raw)
        if self.exponent_view:
            for sign, label in ((1, "positive"), (-1, "negative")):
                view = log2_abs_view_raw(payload, sign)
                if view is not None:
                    self.writer.add_histogram_raw(
                        f"{tag}{EXPONENT_VIEW_SUFFIX}/{label}", global_step=x, **view
                    )

    def write_matrix(self, record: MatrixRecord, x: int) -> None:
        """The confusion matrix as an image (needs Pillow, which TensorBoard's images use)."""
        require_extra("PIL", "tensorboard", "TensorBoard confusion-matrix images")
        img = confusion_image(record.counts)
        self.writer.add_image(record.tag, img, x, dataformats="HWC")

    def write_text(self, record: TextRecord, x: int) -> None:
        """A text entry under the record's tag."""
        self.writer.add_text(record.tag, record.text, x)

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
