"""The tracker base: a subscriber that sends events to an outside tool on one declared x-axis.

Every tracker says which training axis it plots against (:class:`~stepscope.events.Axis`,
default ``optimizer_step``). An event whose axis value is unknown (``None``, e.g.
``examples_seen`` not recorded) is counted in :attr:`TrackerCounts.skipped_no_axis` and never
placed at 0. ``unavailable`` events are counted, not drawn as zeros.

The events of a batch become tracker records with the tracker's
:class:`~stepscope.events.tags.TagLayout` (the one conversion every drawing tracker shares, live
and in ``stepscope export``); a subclass writes records (``write_scalar``, ``write_histogram``,
``write_matrix``, ``write_text``).

Example
-------
>>> from stepscope.events import Axes, ScalarEvent
>>> class Printer(Tracker):
...     def write_scalar(self, record, x):
...         print(record.tag, x, record.value)
>>> t = Printer(axis="examples_seen")
>>> t.on_events([ScalarEvent("loss", Axes(3, examples_seen=192), 0.5),
...              ScalarEvent("loss", Axes(4), 0.4)])
loss 192 0.5
>>> t.counts.skipped_no_axis
1
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.events.bus import Subscriber
from stepscope.events.coordinates import Axis
from stepscope.events.event import ObserverEvent, UnavailableEvent
from stepscope.events.tags import (
    Detail,
    HistogramRecord,
    MatrixRecord,
    ScalarRecord,
    TagLayout,
    TextRecord,
)

__all__ = ["Tracker", "TrackerCounts"]


@dataclass
class TrackerCounts:
    """What a tracker did: records written per kind, events it could not place."""

    scalars: int = 0
    histograms: int = 0
    matrices: int = 0
    texts: int = 0
    unavailable: int = 0
    skipped_no_axis: int = 0


class Tracker(Subscriber):
    """Base class: lays events out as records and dispatches them to ``write_*`` at the axis value.

    Parameters
    ----------
    axis
        The x-axis.
    detail
        ``"default"`` (the readable tag set) or ``"full"`` (every quantity); see
        :mod:`stepscope.events.tags`.

    Subclasses override the ``write_*`` methods they support and :meth:`flush`/:meth:`close`.
    """

    def __init__(
        self, axis: Axis | str = Axis.OPTIMIZER_STEP, detail: Detail | str = Detail.DEFAULT
    ) -> None:
        self.axis = Axis(axis)
        self.layout = TagLayout(detail)
        self.counts = TrackerCounts()

    def on_events(self, events: Sequence[ObserverEvent]) -> None:
        """Write the records of every event whose axis value is known."""
        placed = []
        for e in events:
            if e.axis(self.axis) is None:
                self.counts.skipped_no_axis += 1
            elif isinstance(e, UnavailableEvent):
                self.counts.unavailable += 1
            else:
                placed.append(e)
        for r in self.layout.records(placed):
            x = r.axes.of(self.axis)
            assert x is not None  # records take the axes of placed events
            if isinstance(r, ScalarRecord):
                self.write_scalar(r, x)
                self.counts.scalars += 1
            elif isinstance(r, HistogramRecord):
                self.write_histogram(r, x)
                self.counts.histograms += 1
            elif isinstance(r, MatrixRecord):
                self.write_matrix(r, x)
                self.counts.matrices += 1
            elif isinstance(r, TextRecord):
                self.write_text(r, x)
                self.counts.texts += 1
        self.end_batch()

    def write_scalar(self, record: ScalarRecord, x: int) -> None:
        """Write one scalar at axis value ``x``."""

    def write_histogram(self, record: HistogramRecord, x: int) -> None:
        """Write one histogram at axis value ``x``."""

    def write_matrix(self, record: MatrixRecord, x: int) -> None:
        """Write one confusion matrix at axis value ``x``."""

    def write_text(self, record: TextRecord, x: int) -> None:
        """Write one text entry (a verdict) at axis value ``x``."""

    def end_batch(self) -> None:
        """Called after each published batch."""

    def flush(self) -> None:
        """Push buffered output to its destination."""

    def close(self) -> None:
        """Flush and release the destination."""
        self.flush()
