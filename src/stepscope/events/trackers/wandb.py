"""Weights & Biases tracker: one batched ``wandb.log`` row per step, on a declared x-axis.

Facts this follows: W&B's ``_step`` is not the scientific axis, so the
tracker declares its :class:`~stepscope.events.Axis` with ``define_metric(axis)`` and
``define_metric("*", step_metric=axis)`` and puts ``optimizer_step``, ``examples_seen`` and
``epoch`` (where known) in every row. Events are buffered per axis value and sent as ONE row when
the axis value changes (the logging boundary) or on :meth:`flush`/:meth:`close`. It never calls
``wandb.watch`` (no tensor hooks: the collector already reduced everything).

Logged keys come from :class:`~stepscope.events.tags.TagLayout`, the same tags TensorBoard gets
(``act/<site>/rms``, ``grad/<site>/norm``, ``update/<site>/ratio``, user scalars by name, ...;
``detail="full"`` for every quantity):

* a scalar — ``tag: value`` (full float64);
* a histogram ``<stream>/<site>`` — a ``wandb.Histogram`` on the **value** axis built from our
  exact bins (:func:`~stepscope.events.views.value_np_histogram`, <= 512 bins, finite values
  only) and ``<tag>/exponent_view``, the same counts on the signed log2 bin-index axis
  (:func:`~stepscope.events.views.np_histogram`, <= 512 bins);
* a confusion matrix ``<p>/confusion`` — a ``wandb.Table`` with columns ``true, predicted,
  count`` (one row per non-zero cell);
* verdicts — ``tag: "[action] message"``;
* ``optimizer_step``, ``examples_seen``, ``epoch`` — the axes, where known, in every row.

The run's ``config`` holds ``stepscope_x_axis`` and, when given (``stepscope export`` and live
streaming do), ``stepscope_run_record``.

A failing ``wandb.log`` is caught, counted in :attr:`WandbTracker.failed_rows`, warned about once
(:class:`WandbLogWarning`) and never raised: training goes on and the local history artifact,
written before events are published, holds everything.

Example
-------
>>> import os
>>> os.environ["WANDB_MODE"] = "offline"  # needs wandb; writes an offline run  # doctest: +SKIP
>>> tracker = WandbTracker(project="demo", dir="runs/wandb")  # needs wandb; writes an offline run  # doctest: +SKIP
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from stepscope.errors import require_extra
from stepscope.events.coordinates import Axes, Axis
from stepscope.events.tags import Detail, HistogramRecord, MatrixRecord, ScalarRecord, TextRecord
from stepscope.events.trackers.base import Tracker
from stepscope.events.views import np_histogram, value_np_histogram

__all__ = ["WandbLogWarning", "WandbTracker"]


class WandbLogWarning(RuntimeWarning):
    """``wandb.log`` failed; the row was not sent (the local artifact is unaffected)."""


class WandbTracker(Tracker):
    """Send events to a W&B run, one row per axis value.

    Parameters
    ----------
    run
        An existing run (from ``wandb.init``); not finished by :meth:`close`. When ``None`` a run
        is started with ``project``, ``dir``, ``mode`` (e.g. ``"offline"``), ``name``, ``config``.
    axis
        The x-axis declared with ``define_metric``.
    detail
        ``"default"`` (the readable set) or ``"full"`` (every quantity).
    histograms
        Send histogram events as ``wandb.Histogram`` (value axis and index axis).
    wandb_module
        The ``wandb`` module to use (default: import it, refusing ``extra_missing`` if absent).
    """

    def __init__(
        self,
        run: Any = None,
        *,
        axis: Axis | str = Axis.OPTIMIZER_STEP,
        detail: Detail | str = Detail.DEFAULT,
        histograms: bool = True,
        project: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        mode: str | None = None,
        name: str | None = None,
        config: dict[str, Any] | None = None,
        wandb_module: Any = None,
    ) -> None:
        super().__init__(axis, detail)
        self._wandb = wandb_module or require_extra("wandb", "wandb", "the W&B tracker")
        self._owns = run is None
        if run is None:
            if dir is not None:
                os.makedirs(dir, exist_ok=True)
            run = self._wandb.init(
                project=project,
                dir=None if dir is None else str(dir),
                mode=mode,
                name=name,
                config={**(config or {}), "stepscope_x_axis": self.axis.value},
            )
        self.run = run
        self.histograms = histograms
        self.run.define_metric(self.axis.value)
        self.run.define_metric("*", step_metric=self.axis.value)
        self._row: dict[str, Any] = {}
        self._row_x: int | None = None
        self.rows_sent = 0
        self.failed_rows = 0
        self.last_error: str | None = None
        self._warned = False

    def _row_for(self, axes: Axes, x: int) -> dict[str, Any]:
        if self._row_x is not None and x != self._row_x:
            self.flush()
        if not self._row:
            self._row_x = x
            for a in Axis:
                v = axes.of(a)
                if v is not None:
                    self._row[a.value] = v
        return self._row

    def write_scalar(self, record: ScalarRecord, x: int) -> None:
        """Add ``tag: value`` to the row of axis value ``x``."""
        self._row_for(record.axes, x)[record.tag] = record.value

    def write_histogram(self, record: HistogramRecord, x: int) -> None:
        """Add ``tag`` (value axis) and ``tag/exponent_view`` (index axis) ``wandb.Histogram`` s."""
        if not self.histograms:
            return
        for key, h in (
            (record.tag, value_np_histogram(record.histogram)),
            (record.tag + "/exponent_view", np_histogram(record.histogram)),
        ):
            if h is not None:
                counts, edges = h
                hist = self._wandb.Histogram(np_histogram=(counts.tolist(), edges.tolist()))
                self._row_for(record.axes, x)[key] = hist

    def write_matrix(self, record: MatrixRecord, x: int) -> None:
        """Add the confusion matrix as a ``wandb.Table`` (``true, predicted, count``)."""
        c = record.counts
        data = [[int(t), int(p), int(c[t, p])] for t, p in zip(*c.nonzero())]
        table = self._wandb.Table(columns=["true", "predicted", "count"], data=data)
        self._row_for(record.axes, x)[record.tag] = table

    def write_text(self, record: TextRecord, x: int) -> None:
        """Add the verdict message (a string) to the row."""
        self._row_for(record.axes, x)[record.tag] = record.text

    def flush(self) -> None:
        """Send the buffered row with one ``wandb.log`` call; failures are caught and counted."""
        if not self._row:
            return
        row, self._row, self._row_x = self._row, {}, None
        try:
            self.run.log(row)
            self.rows_sent += 1
        except Exception as exc:  # never block training; the artifact keeps the history
            self.failed_rows += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"stepscope: wandb.log failed ({self.last_error}); rows are dropped from W&B "
                    "but kept in the local history artifact (re-send with `stepscope export "
                    "RUN --wandb DIR`).",
                    WandbLogWarning,
                    stacklevel=2,
                )

    def close(self) -> None:
        """Send the last row; finish the run if this tracker started it."""
        self.flush()
        if self._owns:
            self.run.finish()
            self._owns = False
