"""Three clocks per step: isolated training seconds, telemetry seconds, total elapsed seconds.

Definitions (seconds). Per step ``k``:

``training_seconds``
    The step window (from the step's start to the moment our boundary work begins) minus the
    telemetry spent *inside* that window. On the host (CPU) it is measured with
    ``time.perf_counter``. On CUDA it is the device interval between two CUDA events recorded on
    the current stream at the window's ends (``torch.cuda.Event.elapsed_time``), read only once
    the end event has completed (``query()``), so the clock never adds a synchronisation; rows
    are resolved at a later boundary or at close. The CUDA interval includes the device time of
    our own reduction kernels launched inside the step (they share the stream); it is not a host
    timer without synchronisation.
``telemetry_seconds``
    Host time in stepscope's own work attributed to the step: hooks, reductions, staging
    transfers, step-block writes, event publishing, ``log*`` calls.
``elapsed_seconds``
    Host time from the start of the run (collector/run-log construction) to the end of the step.

Telemetry after the last step (a final probe or checkpoint inside ``collector.telemetry()``, the
last step's write) belongs to no step row: at close it is added to the run's
``telemetry_seconds`` total and shown apart as ``trailing_telemetry_seconds``
(:meth:`StepClock.trailing`).

The scalars ``clock/training_seconds``, ``clock/telemetry_seconds`` and ``clock/elapsed_seconds``
written at step ``k`` are *cumulative* up to the end of step ``k`` (a throughput is a difference
quotient, a per-step value a difference). With the host clock, the training and telemetry
intervals are disjoint subsets of ``[start, end of step k]``, so at every step
``training + telemetry <= elapsed`` holds by construction (with CUDA events the training clock
is on the device timeline, so this is expected, not guaranteed). The run's measured overhead is
``telemetry / training``.

Example
-------
>>> ticks = iter([0.0, 1.0, 3.0, 10.0])
>>> clock = StepClock(timer=lambda: next(ticks))  # run starts at 0.0
>>> clock.begin(0)                                  # window opens at 1.0
>>> clock.end(0)                                    # user work ends at 3.0
>>> row = clock.finish(0, telemetry_in_window=0.5, telemetry=2.5)[0]
>>> row.training_seconds, row.telemetry_seconds, row.elapsed_seconds
(1.5, 2.5, 10.0)
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch


class ClockKind(str, enum.Enum):
    """How the training clock was measured."""

    HOST_PERF_COUNTER = "host_perf_counter"
    CUDA_EVENT = "cuda_event"


class ClockRow(NamedTuple):
    """The clocks of one step (seconds): this step's, and cumulative at its end (a tuple:
    one is made at every step)."""

    step: int
    training_seconds: float  # this step
    telemetry_seconds: float  # this step
    training_total: float  # cumulative, including this step
    telemetry_total: float  # cumulative, including this step
    elapsed_seconds: float  # since the run started, at the end of this step


@dataclass(slots=True)
class _Open:
    step: int
    host_start: float
    host_end: float | None = None
    start_event: Any = None
    end_event: Any = None


@dataclass
class _Waiting:
    step: int
    start_event: Any
    end_event: Any
    telemetry: float
    elapsed: float


class StepClock:
    """Measures each step's clocks; see the module docstring for the definitions.

    Parameters
    ----------
    device
        Device of the training tensors; a CUDA device selects CUDA events for the training clock.
    timer
        Host timer (seconds); injectable for exact tests.
    event_factory
        Callable returning an event with ``record()``, ``query()``, ``synchronize()`` and
        ``elapsed_time(end) -> ms`` (default ``torch.cuda.Event(enable_timing=True)``).
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        timer: Callable[[], float] = time.perf_counter,
        event_factory: Callable[[], Any] | None = None,
    ) -> None:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        cuda = dev.type == "cuda" and torch.cuda.is_available()
        if event_factory is None and cuda:
            event_factory = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731
        self.kind = (
            ClockKind.CUDA_EVENT if event_factory is not None else ClockKind.HOST_PERF_COUNTER
        )
        self._events = event_factory
        self._timer = timer
        self.started = timer()
        self._open: _Open | None = None
        self._waiting: list[_Waiting] = []
        self.training_total = 0.0
        self.telemetry_total = 0.0
        self.trailing_telemetry = 0.0  # after the last step (a final probe, checkpoint, write)
        self.elapsed = 0.0

    def begin(self, step: int) -> None:
        """Open the window of ``step`` (restarting it if it was already open)."""
        start = None
        if self._events is not None:
            start = self._events()
            start.record()
        self._open = _Open(step, self._timer(), start_event=start)

    def end(self, step: int) -> None:
        """Close the user's part of the window (our boundary work starts now)."""
        self._close_window(step)

    def _close_window(self, step: int) -> _Open:
        if self._open is None or self._open.step != step:
            self.begin(step)  # a step that never began: an empty window
        opened = self._open
        if opened is None:  # pragma: no cover - begin() always opens
            raise RuntimeError("step clock window did not open")
        opened.host_end = self._timer()
        if self._events is not None:
            opened.end_event = self._events()
            opened.end_event.record()
        return opened

    def finish(self, step: int, telemetry_in_window: float, telemetry: float) -> list[ClockRow]:
        """Close ``step``; returns the rows now known (host: this step; CUDA: completed ones).

        ``telemetry_in_window`` is our time between :meth:`begin` and :meth:`end`,
        ``telemetry`` all our time attributed to the step (window, boundary, outside).
        """
        opened = self._open
        if opened is None or opened.step != step or opened.host_end is None:
            opened = self._close_window(step)
        host_end = opened.host_end if opened.host_end is not None else opened.host_start
        self._open = None
        self.elapsed = self._timer() - self.started
        if self._events is None:
            window = host_end - opened.host_start
            return [
                self._account(step, max(window - telemetry_in_window, 0.0), telemetry, self.elapsed)
            ]
        self._waiting.append(
            _Waiting(step, opened.start_event, opened.end_event, telemetry, self.elapsed)
        )
        return self.resolve(block=False)

    def resolve(self, block: bool) -> list[ClockRow]:
        """CUDA rows whose end event completed (all of them, synchronising, if ``block``)."""
        out = []
        while self._waiting:
            w = self._waiting[0]
            if not block and not w.end_event.query():
                break
            if block:
                w.end_event.synchronize()
            seconds = w.start_event.elapsed_time(w.end_event) / 1000.0
            out.append(self._account(w.step, seconds, w.telemetry, w.elapsed))
            self._waiting.pop(0)
        return out

    def _account(self, step: int, training: float, telemetry: float, elapsed: float) -> ClockRow:
        self.training_total += training
        self.telemetry_total += telemetry
        return ClockRow(
            step, training, telemetry, self.training_total, self.telemetry_total, elapsed
        )

    def trailing(self, telemetry: float) -> None:
        """Telemetry seconds spent after the last step (no step row holds them): counted in
        the totals at close, and shown apart as ``trailing_telemetry_seconds``."""
        if telemetry > 0:
            self.trailing_telemetry += telemetry
            self.telemetry_total += telemetry
            self.elapsed = self._timer() - self.started

    @property
    def overhead_fraction(self) -> float | None:
        """``telemetry / training`` over resolved steps (``None`` before any training time)."""
        return self.telemetry_total / self.training_total if self.training_total > 0 else None

    def summary(self, closed: bool) -> dict[str, Any]:
        """JSON-safe totals (the ``runlog.json`` content)."""
        return {
            "format": "stepscope.runlog.v1",
            "training_clock": self.kind.value,
            "telemetry_clock": ClockKind.HOST_PERF_COUNTER.value,
            "elapsed_clock": ClockKind.HOST_PERF_COUNTER.value,
            "training_seconds": self.training_total,
            "telemetry_seconds": self.telemetry_total,
            "trailing_telemetry_seconds": self.trailing_telemetry,
            "elapsed_seconds": self.elapsed,
            "overhead_fraction": self.overhead_fraction,
            "unresolved_steps": len(self._waiting),
            "closed": closed,
        }
