"""The check base: events in, verdicts out, and the user's choice of ``warn | raise | stop``.

A check is a :class:`~stepscope.events.Subscriber` that reads only events (never tensors). Its
:meth:`Check.evaluate` is a function from one published batch to findings; the base turns each
finding into a ``verdict`` event (published back on the bus) and applies the action:

* ``warn`` — ``warnings.warn(CheckWarning)`` once per (check, name), every verdict still published;
* ``raise`` — :class:`~stepscope.events.CheckFailed` (``Refusal`` code ``check_failed``) after the
  bus has delivered the verdicts to every subscriber;
* ``stop`` — sets :attr:`Check.should_stop` (and ``EventBus.stop_requested``) for the training
  loop to poll.

Example
-------
>>> from stepscope.events import Axes, EventBus, NonFiniteCheck, ScalarEvent
>>> bus = EventBus()
>>> check = bus.subscribe(NonFiniteCheck(action="stop"))
>>> bus.publish([ScalarEvent("loss", Axes(4), float("nan"))])
>>> check.should_stop, check.first.optimizer_step, bus.stop_requested
(True, 4, True)
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from stepscope.errors import Refusal
from stepscope.events.bus import CheckFailed, Subscriber
from stepscope.events.event import EventSource, ObserverEvent, VerdictEvent
from stepscope.events.payload import Verdict

__all__ = ["Check", "CheckAction", "CheckWarning", "Finding"]


class CheckAction(str, enum.Enum):
    """What a check does when it finds a violation."""

    WARN = "warn"
    RAISE = "raise"
    STOP = "stop"


class CheckWarning(UserWarning):
    """A check configured with ``action="warn"`` found a violation."""


@dataclass(frozen=True)
class Finding:
    """One violation found by :meth:`Check.evaluate`: the event that showed it, and why."""

    event: ObserverEvent
    message: str
    observed: float | None = None
    lower: float | None = None
    upper: float | None = None


class Check(Subscriber):
    """Base class of checks; subclasses implement :meth:`evaluate`.

    Parameters
    ----------
    action
        ``"warn"`` (default), ``"raise"`` or ``"stop"`` (:class:`CheckAction`).
    """

    #: Stable check name used in verdict tags (``"check/{name}/..."``).
    name: str = "check"

    def __init__(self, action: CheckAction | str = CheckAction.WARN) -> None:
        try:
            self.action = CheckAction(action)
        except ValueError:
            raise Refusal(
                "settings_invalid",
                f"check action {action!r} is not one of warn, raise, stop.",
                ["pass action='warn', 'raise' or 'stop'"],
            ) from None
        self.should_stop = False
        self.verdicts: list[VerdictEvent] = []
        self._warned: set[str] = set()

    def evaluate(self, events: Sequence[ObserverEvent]) -> list[Finding | ObserverEvent]:
        """Findings (and derived ``check``-source events) of one batch of measured events."""
        raise NotImplementedError

    def on_events(self, events: Sequence[ObserverEvent]) -> list[ObserverEvent]:
        """Evaluate the batch (ignoring events produced by checks) and apply the action."""
        measured = [e for e in events if e.source is not EventSource.CHECK]
        if not measured:
            return []
        out: list[ObserverEvent] = []
        verdicts: list[VerdictEvent] = []
        for item in self.evaluate(measured):
            if isinstance(item, ObserverEvent):
                out.append(item)
                continue
            verdicts.append(self._verdict(item))
        self.verdicts.extend(verdicts)
        if not verdicts:
            return out
        if self.action is CheckAction.STOP:
            self.should_stop = True
        elif self.action is CheckAction.WARN:
            for v in verdicts:
                if v.name not in self._warned:
                    self._warned.add(v.name)
                    warnings.warn(v.verdict.message, CheckWarning, stacklevel=2)
        else:
            first = verdicts[0].verdict.message
            raise CheckFailed(
                first,
                [*out, *verdicts],
                [
                    "inspect the verdict events on the bus",
                    f"or run {self.name} with action='warn'",
                ],
            )
        return [*out, *verdicts]

    def _verdict(self, f: Finding) -> VerdictEvent:
        e = f.event  # the verdict sits on its target's axes and keeps its subject and field
        return VerdictEvent(
            f"check/{self.name}/{e.name}",
            e.axes,
            Verdict(self.name, self.action.value, f.message, f.observed, f.lower, f.upper),
            subject=e.subject,
            field=e.field,
        )
