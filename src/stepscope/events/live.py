"""Live streaming: each written step reaches TensorBoard and W&B while training runs.

The collector hands every written step's rows to :meth:`LiveStream.submit`, which puts a
reference to them on a bounded queue and returns: it never waits. One background thread (a
daemon) takes the steps off the queue in order, converts them with
:func:`~stepscope.events.events_from_step` — the converter ``stepscope export`` replays through —
and publishes them on a private :class:`~stepscope.events.EventBus` to the trackers, which
lay them out with the same :class:`~stepscope.events.tags.TagLayout`. So live and exported
TensorBoard/W&B runs hold the same tags and values.

Keeping writes off the training thread follows the trackers' own designs (TensorBoard's
``EventFileWriter`` queues events for a writer thread; W&B's ``wandb.log`` hands rows to a
separate service process), one level up: the conversion and the trackers' Python work run on the
streaming thread too.

* **Never blocks.** A full queue (the trackers are slower than training) drops the step and
  counts it (:attr:`LiveCounts.dropped_steps`); the history artifact, written before the step is
  submitted, still holds it (``stepscope export`` sends it later).
* **Never raises into training.** A tracker that raises is isolated by the event bus: warned
  about once (:class:`~stepscope.events.SubscriberFailureWarning`), counted
  (:attr:`LiveCounts.failed_deliveries`, :attr:`LiveCounts.last_error`), disabled after eight
  consecutive failures.
* **Fresh.** Trackers are flushed when the queue runs empty and at least every
  ``flush_seconds`` (TensorBoard's own writer would wait up to 120 s).
* :meth:`LiveStream.close` (the collector's close) sends what is queued (up to ``timeout``
  seconds), then flushes and closes the trackers.

Example
-------
>>> import tempfile
>>> from stepscope.events import Axes, ScalarEvent
>>> from stepscope.history import StepBlockRecord
>>> from stepscope.stats import HistogramDescriptor
>>> from stepscope.events.trackers.base import Tracker
>>> class Seen(Tracker):
...     tags = []
...     def write_scalar(self, record, x):
...         self.tags.append((record.tag, x, record.value))
>>> live = LiveStream([Seen()])
>>> live.submit(StepBlockRecord(0), [], [], HistogramDescriptor(), {"loss": 0.5})
True
>>> live.close()
>>> live.counts.sent_steps, Seen.tags
(1, [('loss', 0, 0.5)])
"""

from __future__ import annotations

import os
import queue
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.events.bus import EventBus
from stepscope.events.convert import events_from_step
from stepscope.events.tags import run_name
from stepscope.events.trackers.tensorboard import TensorBoardTracker
from stepscope.events.trackers.wandb import WandbTracker

__all__ = ["LIVE_QUEUE_STEPS", "LiveCounts", "LiveStream", "LiveStreamWarning", "open_live"]

#: Steps the queue holds before a step is dropped (the trackers fell that far behind).
LIVE_QUEUE_STEPS = 256
_STOP = object()


class LiveStreamWarning(RuntimeWarning):
    """The live stream fell behind (steps dropped) or did not finish sending at close."""


@dataclass
class LiveCounts:
    """What the live stream did (read it any time; the streaming thread updates it)."""

    submitted_steps: int = 0
    sent_steps: int = 0
    dropped_steps: int = 0  # the queue was full: not sent live (the artifact has them)
    failed_deliveries: int = 0  # a tracker raised on a step (isolated, warned once)
    last_error: str | None = None


class LiveStream:
    """Send written steps to trackers from a background thread (see the module docstring).

    Parameters
    ----------
    trackers
        Subscribers (trackers) to deliver each step's events to; closed by :meth:`close`.
    queue_steps
        Steps the queue holds (:data:`LIVE_QUEUE_STEPS`); a step that finds it full is dropped.
    flush_seconds
        Flush the trackers at least this often while steps arrive (and whenever the queue is
        empty), so a running TensorBoard shows the latest step within a few seconds.
    destinations
        Where each output goes (``{"tensorboard": DIR, ...}``), for the user to read.
    """

    def __init__(
        self,
        trackers: Sequence[Any],
        queue_steps: int = LIVE_QUEUE_STEPS,
        flush_seconds: float = 2.0,
        destinations: Mapping[str, str] | None = None,
    ) -> None:
        self.trackers = tuple(trackers)
        self.destinations = dict(destinations or {})
        self.counts = LiveCounts()
        self.flush_seconds = float(flush_seconds)
        self._bus = EventBus(capacity=1)
        for t in self.trackers:
            self._bus.subscribe(t)
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_steps)
        self._closed = False
        self._warned_drop = False
        self._own_failures = 0  # malformed steps and failing flushes (the bus counts the rest)
        self._thread = threading.Thread(target=self._run, name="stepscope-live", daemon=True)
        self._thread.start()

    # -- the training thread ---------------------------------------------------------------
    def submit(
        self,
        block: Any,
        batches: Sequence[Any],
        sites: Sequence[Any],
        descriptor: Any,
        scalars: Mapping[str, float] | None,
    ) -> bool:
        """Queue one written step (references, no copy); ``False`` when it was dropped.

        The rows are never modified after they are written, so the streaming thread reads them
        as they are. Never blocks and never raises.
        """
        if self._closed:
            return False
        self.counts.submitted_steps += 1
        try:
            self._queue.put_nowait((block, batches, sites, descriptor, scalars))
            return True
        except queue.Full:
            self.counts.dropped_steps += 1
            if not self._warned_drop:
                self._warned_drop = True
                warnings.warn(
                    f"stepscope: live streaming fell {self._queue.maxsize} steps behind; steps "
                    "are dropped from TensorBoard/W&B (counted in collector.live.counts) and kept "
                    "in the history artifact (send them with `stepscope export RUN`).",
                    LiveStreamWarning,
                    stacklevel=2,
                )
            return False

    def close(self, timeout: float = 60.0) -> None:
        """Send what is queued (waiting at most ``timeout`` s), then flush and close the trackers.

        Idempotent; never raises. Steps still queued after ``timeout`` are not sent (warned).
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        try:
            self._queue.put(_STOP, timeout=max(0.0, timeout))
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            warnings.warn(
                f"stepscope: live streaming did not finish within {timeout:g} s; "
                f"{self._queue.qsize()} steps were not sent (the history artifact has them).",
                LiveStreamWarning,
                stacklevel=2,
            )
            return  # the thread still uses the trackers: do not close them under it
        self._bus.close()

    @property
    def alive(self) -> bool:
        """Whether the streaming thread runs."""
        return self._thread.is_alive()

    # -- the streaming thread --------------------------------------------------------------
    def _run(self) -> None:
        dirty, last_flush = False, time.monotonic()
        while True:
            try:
                item = self._queue.get(timeout=self.flush_seconds)
            except queue.Empty:
                item = None
            if item is _STOP:
                break
            if item is not None:
                self._send(item)
                dirty = True
            now = time.monotonic()
            if dirty and (self._queue.empty() or now - last_flush >= self.flush_seconds):
                self._flush()
                dirty, last_flush = False, now

    def _send(self, item: tuple[Any, ...]) -> None:
        try:
            events = events_from_step(*item)
            self._bus.publish(events)
        except Exception as exc:  # a malformed step or a check's raise: counted, never raised
            self._failed(exc)
            return
        self.counts.sent_steps += 1
        self._count()

    def _failed(self, exc: Exception) -> None:
        self._own_failures += 1
        self.counts.last_error = f"{type(exc).__name__}: {exc}"
        self._count()

    def _count(self) -> None:
        failures = self._own_failures
        for t in self.trackers:
            st = self._bus.status(t)
            failures += st.failures
            if st.failures and st.last_error is not None:
                self.counts.last_error = st.last_error
        self.counts.failed_deliveries = failures

    def _flush(self) -> None:
        for t in self.trackers:
            flush = getattr(t, "flush", None)
            if flush is None or not self._bus.status(t).enabled:
                continue
            try:
                flush()
            except Exception as exc:  # a failing flush is a failing delivery
                self._failed(exc)


def _free_dir(root: Path, name: str, resume: bool) -> Path:
    """``root/name``, or ``root/name-1``, ``-2``, ... when it holds an earlier run's events."""
    path = root.joinpath(*name.split("/"))
    if resume or not path.exists() or not any(path.iterdir()):
        return path
    k = 1
    while True:
        candidate = path.with_name(f"{path.name}-{k}")
        if not candidate.exists() or not any(candidate.iterdir()):
            return candidate
        k += 1


def open_live(settings: Any, record: Any, path: str | os.PathLike[str] | None) -> LiveStream | None:
    """The live stream a collector's :class:`~stepscope.WatchSettings` asks for (or ``None``).

    ``settings.tensorboard``: a log directory (the run goes to ``DIR/<run name>``, see
    :func:`~stepscope.events.tags.run_name`; ``-1``, ``-2``, ... when an earlier run holds that
    folder) or a tracker. ``settings.wandb``: ``True`` (a run in project ``stepscope`` named
    after the run, ``WANDB_MODE``/``WANDB_DIR`` honoured) or a tracker. Both get the run record.
    """
    tb, wb = getattr(settings, "tensorboard", None), getattr(settings, "wandb", False)
    if tb is None and (wb is None or wb is False):
        return None
    name = run_name(record, path)
    trackers: list[Any] = []
    dest: dict[str, str] = {}
    if isinstance(tb, (str, os.PathLike)):
        tb_dir = _free_dir(Path(tb), name, bool(getattr(settings, "resume", False)))
        tb = TensorBoardTracker(tb_dir)
        tb.write_run_record(record.to_dict(), name)
        dest["tensorboard"] = str(tb_dir)
    if tb is not None:
        trackers.append(tb)
    if wb is True:
        wb = WandbTracker(  # read here: wandb reads its environment once per process
            project=os.environ.get("WANDB_PROJECT", "stepscope"),
            dir=os.environ.get("WANDB_DIR"),
            name=name,
            config={"stepscope_run_record": record.to_dict()},
        )
        dest["wandb"] = str(getattr(wb.run, "dir", "") or "wandb")
    if wb is not None and wb is not False:
        trackers.append(wb)
    return LiveStream(trackers, destinations=dest)
