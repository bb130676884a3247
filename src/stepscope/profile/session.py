"""``stepscope.session``: the one activation knob, and the one place a profiler is constructed.

* **Owned** mode (``session()``) creates a ``torch.profiler.profile``, starts it on entry, stops
  it on exit and joins its events (:class:`~stepscope.profile.results.ProfileResult` on
  ``.result``).
* **Borrowed** mode (``session(profiler=prof)``) only adds stepscope's markers -- a
  ``stepscope.session/<n>`` bracket, region brackets, spans -- inside a profiler the caller
  started; it never steps, stops or reads that profiler (read it later with
  :func:`stepscope.profile.from_profiler`). A profiler built with
  ``schedule=torch.profiler.schedule(wait=..., warmup=..., active=...)`` is accepted in any
  phase, ``wait`` included: the markers of work done in its active windows land in its traces,
  and those of its wait/warm-up steps are dropped by torch, as for any other op.

One session may be active per process: opening a second refuses ``profiler_session_nested``.
Every marker, mode, hook and the active-session slot itself sit on one exit stack that unwinds on
success, early return, exception and ``KeyboardInterrupt`` alike.

Example
-------
>>> import torch, stepscope as ss
>>> with ss.session() as s:
...     _ = torch.ones(3).sum()
>>> s.result.availability.value in ("unavailable", "empty", "partial", "joined")
True
>>> "aten::sum" in [row.key for row in s.result.hot_path(by="cpu_time")]
True
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from contextlib import ExitStack
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.profile import compat
from stepscope.profile.accounting import SESSION_PREFIX
from stepscope.profile.hooks import HOOK_ALTITUDES, AltitudeCapture
from stepscope.profile.kineto import join_events
from stepscope.profile.results import Availability, ProfileResult, availability_of
from stepscope.profile.spans import Altitude, OwnerClass, SpanRegistry

#: The active-session slot: at most one session per process.
_ACTIVE: list[session | None] = [None]
_SERIAL = itertools.count()

#: Host events torch emits around Python function/dispatch modes: stepscope's capture overhead
#: while an altitude capture is installed.
CAPTURE_OVERHEAD_EVENTS = frozenset(
    {"PythonDispatchMode", "PythonTLSSnapshot", "TorchFunctionMode"}
)
BOUNDARY_DISCLOSURE = "still open at the session boundary; closed by the session"


def active_session() -> session | None:
    """The session currently active in this process, or ``None``."""
    return _ACTIVE[0]


def _new_profiler(activities: list[Any], record_shapes: bool, with_stack: bool) -> Any:
    # The single construction site of torch.profiler.profile in stepscope (test-enforced).
    return torch.profiler.profile(
        activities=activities, record_shapes=record_shapes, with_stack=with_stack
    )


def _check_borrowed(profiler: Any) -> None:
    if not isinstance(profiler, torch.profiler.profile):
        raise Refusal(
            "profiler_session_inactive",
            f"profiler= must be a started torch.profiler.profile, got {type(profiler).__name__}.",
            ["pass the object returned by `with torch.profiler.profile(...) as prof:`"],
        )
    running = getattr(profiler, "profiler", None) is not None and (
        torch.autograd._profiler_enabled()
    )
    if not running and not _scheduled_and_started(profiler):
        raise Refusal(
            "profiler_session_inactive",
            "the borrowed profiler is not running (never started, or already stopped).",
            ["open stepscope.session(profiler=prof) inside `with prof:` (or after prof.start())"],
        )


def _scheduled_and_started(profiler: Any) -> bool:
    """A scheduled profiler between ``start()`` and ``stop()``, whatever its current phase.

    During ``wait`` torch has not built its inner profiler yet (``profiler.profiler is None``),
    but ``start()`` has opened its ``ProfilerStep#N`` marker, which ``stop()`` closes.
    """
    return bool(getattr(profiler, "record_steps", False)) and (
        getattr(profiler, "step_rec_fn", None) is not None
    )


class session:  # lower-case: used like a function: ``with ss.session() as s:``
    """Activate stepscope's profiling for the duration of a ``with`` block.

    Parameters
    ----------
    profiler
        ``None`` for owned mode; a started ``torch.profiler.profile`` for borrowed mode.
    altitudes
        Span altitudes to capture on stepscope's clock: any of ``"op"``, ``"aten"``,
        ``"grad_fn_fire"`` (default none: regions only).
    device_time
        Owned mode: also record device activity when the build has any (default ``True``).
        ``False`` records CPU only and reports availability ``not_requested``.
    record_shapes, with_stack
        Passed to the owned profiler.
    force_fallback
        Owned mode: read events through the bounded chrome-trace fallback (disclosed).

    Attributes
    ----------
    registry : SpanRegistry
        The session's spans (regions, captured altitudes, the session span).
    result : ProfileResult
        Available after a normal exit; before that, or after an exception escaped the block,
        reading it refuses ``profiler_session_inactive`` (never ``None``).
    """

    def __init__(
        self,
        profiler: Any = None,
        *,
        altitudes: Iterable[str | Altitude] = (),
        device_time: bool = True,
        record_shapes: bool = False,
        with_stack: bool = False,
        force_fallback: bool = False,
    ) -> None:
        try:
            wanted = frozenset(Altitude(a) for a in altitudes)
        except ValueError as exc:
            raise Refusal(
                "profile_view_invalid",
                f"unknown span altitude in {tuple(altitudes)!r}.",
                [f"use any of {sorted(a.value for a in HOOK_ALTITUDES)}"],
            ) from exc
        if not wanted <= HOOK_ALTITUDES:
            raise Refusal(
                "profile_view_invalid",
                f"altitudes {sorted(a.value for a in wanted - HOOK_ALTITUDES)} are not capturable.",
                [f"use any of {sorted(a.value for a in HOOK_ALTITUDES)}"],
            )
        self.borrowed = profiler is not None
        self._profiler = profiler
        self._altitudes = wanted
        self._device_time = device_time
        self._record_shapes = record_shapes
        self._with_stack = with_stack
        self._force_fallback = force_fallback
        self._activities: list[Any] = []
        self._stack: ExitStack | None = None
        self.registry = SpanRegistry()
        self._result: ProfileResult | None = None
        self.capture: AltitudeCapture | None = None

    def __enter__(self) -> session:
        if _ACTIVE[0] is not None:
            raise Refusal(
                "profiler_session_nested",
                "a stepscope session is already active; sessions do not nest.",
                ["use stepscope.region(...) inside the active session", "close the outer one"],
            )
        if self._stack is not None:
            raise Refusal("profiler_session_nested", "this session object is already open.", [])
        if self.borrowed:
            _check_borrowed(self._profiler)
        elif torch.autograd._profiler_enabled():
            raise Refusal(
                "profiler_session_nested",
                "another torch profiler is already running; an owned session cannot start one.",
                ["pass it in: stepscope.session(profiler=prof) adds markers to your profiler"],
            )
        self.registry = SpanRegistry()  # a reused session object starts with fresh spans
        self._result = None
        stack = ExitStack()
        self._stack = stack
        try:
            _ACTIVE[0] = self
            stack.callback(_ACTIVE.__setitem__, 0, None)
            if not self.borrowed:
                cpu = [torch.profiler.ProfilerActivity.CPU]
                self._activities = compat.default_activities() if self._device_time else cpu
                self._profiler = _new_profiler(
                    self._activities, self._record_shapes, self._with_stack
                )
                stack.enter_context(self._profiler)
            span = self.registry.open("session", Altitude.SESSION, OwnerClass.STEPSCOPE_INTERNAL)
            stack.callback(self._close_spans, span)
            stack.enter_context(compat.record_function(f"{SESSION_PREFIX}{next(_SERIAL)}"))
            self.capture = AltitudeCapture(self.registry, self._altitudes)
            stack.callback(self.capture.remove)
            self.capture.install()
        except BaseException:
            self._stack = None
            stack.close()
            raise
        return self

    def _close_spans(self, session_span: Any) -> None:
        self.registry.close_all(BOUNDARY_DISCLOSURE, keep=session_span)
        self.registry.close(session_span)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()  # markers, hooks, slot; then the owned profiler stops
        if exc_type is None:
            self._result = self._build_result()

    @property
    def result(self) -> ProfileResult:
        """The session's :class:`ProfileResult` (refuses until the block exited normally)."""
        if self._result is None:
            raise Refusal(
                "profiler_session_inactive",
                "this session has no result: it is still open, or its block raised.",
                ["read .result after the `with` block ends normally"],
            )
        return self._result

    def _build_result(self) -> ProfileResult:
        spans = self.registry.spans
        leaked = sum(1 for s in spans if s.closed_by == BOUNDARY_DISCLOSURE)
        notes: tuple[str, ...] = (f"{leaked} span(s) {BOUNDARY_DISCLOSURE}",) if leaked else ()
        if self.borrowed:
            notes += ("borrowed profiler: events are read by its owner (from_profiler)",)
            return ProfileResult(None, Availability.NOT_REQUESTED, "borrowed", notes, spans)
        requested = compat.requests_device(self._activities)
        loaded = compat.extract_events(self._profiler, requested, self._force_fallback)
        ours = CAPTURE_OVERHEAD_EVENTS if self._altitudes else frozenset()
        join = join_events(loaded.events, ours)
        availability = availability_of(join, loaded.device_capable)
        if not self._device_time:
            availability = Availability.NOT_REQUESTED
        prof = self._profiler
        return ProfileResult(
            join=join,
            availability=availability,
            source=loaded.source,
            disclosures=(*loaded.disclosures, *notes),
            spans=spans,
            exporter=lambda path: prof.export_chrome_trace(str(path)),
        )
