"""The bounded event bus and its subscribers: one scan, many consumers, isolated failures.

:class:`EventBus` delivers each published batch of :class:`ObserverEvent` to every enabled
subscriber. A subscriber that raises is caught (collection carries on), warned about once, and
disabled after :data:`MAX_CONSECUTIVE_FAILURES` consecutive failing deliveries; a successful
delivery resets the count. Subscribers may return events of source ``check`` (verdicts, derived
ratios); they are delivered to every subscriber after the current batch. A check configured to
raise signals :class:`CheckFailed`; the bus finishes delivering (so trackers still record the
verdict) and then re-raises it. The most recent ``capacity`` events are kept for inspection.

Example
-------
>>> from stepscope.events import Axes, EventBus, ScalarEvent, Subscriber
>>> class Count(Subscriber):
...     n = 0
...     def on_events(self, events):
...         self.n += len(events)
>>> bus = EventBus(capacity=2)
>>> c = bus.subscribe(Count())
>>> bus.publish([ScalarEvent("loss", Axes(i), 1.0) for i in range(3)])
>>> c.n, [e.optimizer_step for e in bus.recent()]
(3, [1, 2])
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

from stepscope.errors import Refusal
from stepscope.events.event import EventKind, EventSource, ObserverEvent, VerdictEvent

__all__ = [
    "MAX_CONSECUTIVE_FAILURES",
    "CheckFailed",
    "EventBus",
    "Subscriber",
    "SubscriberFailureWarning",
    "SubscriberLike",
    "SubscriberStatus",
]

#: A subscriber is disabled after exactly this many consecutive failing deliveries.
MAX_CONSECUTIVE_FAILURES = 8
_S = TypeVar("_S")
#: Rounds of subscriber-produced events handled per publish (checks never react to checks).
_MAX_ROUNDS = 4


class SubscriberFailureWarning(RuntimeWarning):
    """A subscriber raised; it was isolated from collection."""


class CheckFailed(Refusal):
    """A check configured with ``action="raise"`` found a violation (code ``check_failed``).

    ``events`` are the verdicts that explain it; the bus delivers them before re-raising.
    """

    def __init__(
        self, message: str, events: Sequence[ObserverEvent] = (), remedies: Iterable[str] = ()
    ) -> None:
        super().__init__("check_failed", message, remedies)
        self.events = tuple(events)

    def __reduce__(self):  # pragma: no cover - pickling across processes
        return (type(self), (self.message, self.events, self.remedies))


@runtime_checkable
class SubscriberLike(Protocol):
    """Anything with ``on_events(events)`` and ``close()``."""

    def on_events(self, events: Sequence[ObserverEvent]) -> Sequence[ObserverEvent] | None: ...

    def close(self) -> None: ...


class Subscriber:
    """Base class of checks and trackers: override :meth:`on_events` (and :meth:`close`)."""

    def on_events(self, events: Sequence[ObserverEvent]) -> Sequence[ObserverEvent] | None:
        """Consume one published batch; may return ``check``-source events to publish."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and release resources (called once by :meth:`EventBus.close`)."""


@dataclass
class SubscriberStatus:
    """Delivery bookkeeping of one subscriber (mutable, owned by the bus)."""

    enabled: bool = True
    deliveries: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    warned: bool = False
    last_error: str | None = None


class EventBus:
    """A bounded bus of immutable observer events: publish batches, deliver them to subscribers.

    Parameters
    ----------
    capacity
        How many of the most recent events :meth:`recent` keeps (>= 1).
    """

    def __init__(self, capacity: int = 4096) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise Refusal(
                "settings_invalid",
                f"EventBus capacity must be an int >= 1, got {capacity!r}.",
                ["pass capacity=4096 (the default) or another positive int"],
            )
        self.capacity = capacity
        self._recent: collections.deque[ObserverEvent] = collections.deque(maxlen=capacity)
        self._subs: list[Any] = []
        self._status: dict[int, SubscriberStatus] = {}
        self.published = 0
        self.stop_requested = False
        self._closed = False

    # -- subscribers ---------------------------------------------------------------------------
    def subscribe(self, subscriber: _S) -> _S:
        """Add a subscriber (anything with ``on_events``, see :class:`SubscriberLike`); returns it."""
        if not callable(getattr(subscriber, "on_events", None)):
            raise Refusal(
                "event_invalid",
                f"{type(subscriber).__name__} has no on_events(events) method.",
                ["subclass stepscope.events.Subscriber"],
            )
        if id(subscriber) not in self._status:
            self._subs.append(subscriber)
            self._status[id(subscriber)] = SubscriberStatus()
        return subscriber

    def unsubscribe(self, subscriber: Any) -> None:
        """Remove a subscriber (without closing it)."""
        self._subs = [s for s in self._subs if s is not subscriber]
        self._status.pop(id(subscriber), None)

    def status(self, subscriber: Any) -> SubscriberStatus:
        """The delivery bookkeeping of a subscribed ``subscriber``."""
        return self._status[id(subscriber)]

    @property
    def active(self) -> bool:
        """True while some subscriber is enabled (a collector may skip converting otherwise)."""
        return any(self._status[id(s)].enabled for s in self._subs)

    @property
    def subscribers(self) -> tuple[Any, ...]:
        """Subscribers in delivery order (enabled or not)."""
        return tuple(self._subs)

    # -- publishing ----------------------------------------------------------------------------
    def publish(self, events: Iterable[ObserverEvent]) -> None:
        """Deliver ``events`` to every enabled subscriber, isolating their failures.

        Raises
        ------
        CheckFailed
            After delivery, if a check configured to raise found a violation.
        """
        batch = tuple(events)
        for e in batch:
            if not isinstance(e, ObserverEvent):
                raise Refusal(
                    "event_invalid",
                    f"published object of type {type(e).__name__} is not an ObserverEvent.",
                    [
                        "publish events from events_from_step() or the event classes (ScalarEvent, ...)"
                    ],
                )
        failed: CheckFailed | None = None
        rounds = 0
        while batch and rounds < _MAX_ROUNDS:
            rounds += 1
            self._recent.extend(batch)
            self.published += len(batch)
            produced: list[ObserverEvent] = []
            for sub in list(self._subs):
                out, err = self._deliver(sub, batch)
                produced.extend(out)
                if err is not None and failed is None:
                    failed = err
            self.stop_requested |= any(
                isinstance(e, VerdictEvent) and e.verdict.action == "stop" for e in batch
            )
            batch = tuple(produced)
        if failed is not None:
            raise failed

    def _deliver(
        self, sub: Any, batch: tuple[ObserverEvent, ...]
    ) -> tuple[list[ObserverEvent], CheckFailed | None]:
        st = self._status.get(id(sub))
        if st is None or not st.enabled:
            return [], None
        st.deliveries += 1
        try:
            out = sub.on_events(batch)
            produced = self._produced(sub, out)
        except CheckFailed as err:
            st.consecutive_failures = 0
            return list(err.events), err
        except Exception as exc:  # isolation: a subscriber never breaks collection
            self._failed(sub, st, exc)
            return [], None
        st.consecutive_failures = 0
        return produced, None

    @staticmethod
    def _produced(sub: Any, out: Any) -> list[ObserverEvent]:
        if out is None:
            return []
        produced = list(out)
        for e in produced:
            if not isinstance(e, ObserverEvent) or e.source is not EventSource.CHECK:
                raise Refusal(
                    "event_invalid",
                    f"{type(sub).__name__} returned {e!r}; subscribers may only return "
                    "ObserverEvents of source 'check'.",
                    ["return verdicts or derived events with source=EventSource.CHECK"],
                )
        return produced

    def _failed(self, sub: Any, st: SubscriberStatus, exc: Exception) -> None:
        st.failures += 1
        st.consecutive_failures += 1
        st.last_error = f"{type(exc).__name__}: {exc}"
        if not st.warned:
            st.warned = True
            warnings.warn(
                f"stepscope: subscriber {type(sub).__name__} raised {st.last_error}; "
                f"collection continues and the subscriber is disabled after "
                f"{MAX_CONSECUTIVE_FAILURES} consecutive failures (see EventBus.status).",
                SubscriberFailureWarning,
                stacklevel=4,
            )
        if st.consecutive_failures >= MAX_CONSECUTIVE_FAILURES:
            st.enabled = False

    # -- inspection and lifecycle --------------------------------------------------------------
    def recent(self, kind: EventKind | str | None = None) -> tuple[ObserverEvent, ...]:
        """The most recent events (at most ``capacity``), oldest first, optionally of one kind."""
        if kind is None:
            return tuple(self._recent)
        k = EventKind(kind)
        return tuple(e for e in self._recent if e.kind is k)

    def close(self) -> None:
        """Close every subscriber once; a failing ``close`` is warned about, never raised."""
        if self._closed:
            return
        self._closed = True
        for sub in self._subs:
            close = getattr(sub, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception as exc:
                warnings.warn(
                    f"stepscope: closing subscriber {type(sub).__name__} raised {exc!r}.",
                    SubscriberFailureWarning,
                    stacklevel=2,
                )

    def __enter__(self) -> EventBus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
