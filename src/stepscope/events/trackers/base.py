"""The tracker base: a subscriber that sends events to an outside tool on one declared x-axis.

Every tracker says which training axis it plots against (:class:`~stepscope.events.Axis`,
default ``optimizer_step``). An event whose axis value is unknown (``None``, e.g.
``examples_seen`` not recorded) is counted in :attr:`TrackerCounts.skipped_no_axis` and never
placed at 0. ``unavailable`` events are counted, not drawn as zeros.

Example
-------
>>> from stepscope.events import Axes, ScalarEvent
>>> class Printer(Tracker):
...     def write_scalar(self, event, x):
...         print(event.name, x, event.value)
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

from stepscope.events.coordinates import Axis
from stepscope.events.event import (
    HistogramEvent,
    ObserverEvent,
    ScalarEvent,
    UnavailableEvent,
    VerdictEvent,
)
from stepscope.events.stream import Subscriber

__all__ = ["Tracker", "TrackerCounts"]


@dataclass
class TrackerCounts:
    """What a tracker did with the events it received."""

    scalars: int = 0
    histograms: int = 0
    verdicts: int = 0
    unavailable: int = 0
    skipped_no_axis: int = 0


class Tracker(Subscriber):
    """Base class: dispatches events by kind to ``write_*`` methods at the axis value.

    Subclasses override the ``write_*`` methods they support and :meth:`flush`/:meth:`close`.
    """

    def __init__(self, axis: Axis | str = Axis.OPTIMIZER_STEP) -> None:
        self.axis = Axis(axis)
        self.counts = TrackerCounts()

    def on_events(self, events: Sequence[ObserverEvent]) -> None:
        """Write every event whose axis value is known."""
        for e in events:
            x = e.axis(self.axis)
            if x is None:
                self.counts.skipped_no_axis += 1
                continue
            if isinstance(e, ScalarEvent):
                self.write_scalar(e, x)
                self.counts.scalars += 1
            elif isinstance(e, HistogramEvent):
                self.write_histogram(e, x)
                self.counts.histograms += 1
            elif isinstance(e, VerdictEvent):
                self.write_verdict(e, x)
                self.counts.verdicts += 1
            elif isinstance(e, UnavailableEvent):
                self.write_unavailable(e, x)
                self.counts.unavailable += 1
        self.end_batch()

    def write_scalar(self, event: ScalarEvent, x: int) -> None:
        """Write one scalar at axis value ``x``."""

    def write_histogram(self, event: HistogramEvent, x: int) -> None:
        """Write one histogram at axis value ``x``."""

    def write_verdict(self, event: VerdictEvent, x: int) -> None:
        """Write one verdict at axis value ``x``."""

    def write_unavailable(self, event: UnavailableEvent, x: int) -> None:
        """Record that a value is missing (never as a 0)."""

    def end_batch(self) -> None:
        """Called after each published batch."""

    def flush(self) -> None:
        """Push buffered output to its destination."""

    def close(self) -> None:
        """Flush and release the destination."""
        self.flush()
