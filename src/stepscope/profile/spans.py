"""Spans: identity-carrying brackets registered at entry, on stepscope's own monotonic clock.

A :class:`Span` is opened (registered) when the bracketed work *starts*, so a span that never
closes is still known: the session boundary closes it with a disclosure instead of losing it.
Every span has an :class:`Altitude` (what kind of work it brackets) and an :class:`OwnerClass`
(whose work it is). Our own bookkeeping is always owned by ``stepscope_internal`` so that it can
be excluded from the user's accounting and reported on its own.

Timestamps come from :func:`time.perf_counter_ns` and are never projected onto the profiler's
(Kineto's) clock: the two clocks are reported side by side, never mixed.

Example
-------
>>> from stepscope.profile.spans import Altitude, OwnerClass, SpanRegistry
>>> reg = SpanRegistry()
>>> outer = reg.open("step", Altitude.USER_REGION, OwnerClass.USER)
>>> inner = reg.open("fwd", Altitude.USER_REGION, OwnerClass.USER)
>>> reg.close(inner)
>>> inner.parent_id == outer.span_id
True
>>> leaked = reg.close_all("session boundary")
>>> [s.name for s in leaked], outer.closed_by
(['step'], 'session boundary')
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from enum import Enum

from stepscope.errors import Refusal

#: Longest span name kept verbatim (characters, after escaping); longer names are truncated
#: with a visible marker and ``name_truncated=True``.
MAX_NAME_CHARS = 160

#: Scalar types accepted as span metadata.
SCALAR_TYPES = (bool, int, float, str, type(None))
_EXACT_SCALARS = frozenset(SCALAR_TYPES)


class Altitude(str, Enum):
    """What a span brackets: the closed vocabulary of span altitudes."""

    OP = "op"  # a torch-level function call (``torch.*`` / tensor method)
    GRAD_FN_FIRE = "grad_fn_fire"  # one autograd node executing in backward
    ATEN = "aten"  # one ATen operator at the dispatcher
    USER_REGION = "user_region"  # a ``stepscope.region`` bracket
    SESSION = "session"  # the session itself


class OwnerClass(str, Enum):
    """Whose work a span (or a profiled op) is: the closed vocabulary of owners."""

    USER = "user"  # brackets the user asked for (regions)
    FRAMEWORK = "framework"  # torch's own ops, autograd nodes, optimizer steps
    EXTERNAL = "external"  # annotations from other libraries or unknown origin
    STEPSCOPE_INTERNAL = "stepscope_internal"  # our own work, always reported apart


def escape_name(name: object) -> tuple[str, bool]:
    """Escape a span name to printable text and bound its length.

    Non-printable characters become ``\\xNN``/``\\uNNNN`` escapes (so a name can never break a
    table or a trace file); names longer than :data:`MAX_NAME_CHARS` are cut and end in ``...``.

    Returns
    -------
    (name, truncated)
        The escaped, bounded name and whether it was cut.

    Examples
    --------
    >>> escape_name("a\\nb")
    ('a\\\\nb', False)
    >>> len(escape_name("x" * 500)[0]), escape_name("x" * 500)[1]
    (160, True)
    """
    text = name if isinstance(name, str) else str(name)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    if len(text) > MAX_NAME_CHARS:
        return text[: MAX_NAME_CHARS - 3] + "...", True
    return text, False


def check_scalar_metadata(metadata: dict[str, object]) -> dict[str, object]:
    """Return ``metadata`` if every value is a scalar, else refuse ``span_metadata_invalid``."""
    for value in metadata.values():  # fast path: exact scalar types, no generator
        if type(value) not in _EXACT_SCALARS:
            break
    else:
        return metadata
    for key, value in metadata.items():
        if not isinstance(value, SCALAR_TYPES):
            raise Refusal(
                "span_metadata_invalid",
                f"metadata {key!r} is a {type(value).__name__}; span metadata must be scalars "
                "(bool, int, float, str or None).",
                ["pass a number or a string, e.g. float(t.item()) outside the hot path"],
            )
    return metadata


@dataclass(eq=False)
class Span:
    """One bracket on stepscope's monotonic clock (nanoseconds from ``perf_counter_ns``).

    ``end_ns`` is ``None`` while the span is open; ``closed_by`` says who closed it
    (``"exit"`` for a normal close, or the disclosure reason of a boundary close).
    """

    span_id: int
    parent_id: int | None
    name: str
    altitude: Altitude
    owner: OwnerClass
    thread_id: int
    start_ns: int
    occurrence: int
    metadata: dict[str, object] = field(default_factory=dict)
    name_truncated: bool = False
    end_ns: int | None = None
    closed_by: str | None = None

    @property
    def duration_ns(self) -> int | None:
        """Wall time of the span in ns, or ``None`` while it is open (missing is not zero)."""
        return None if self.end_ns is None else self.end_ns - self.start_ns

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready record of the span."""
        return {
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "name": self.name,
            "altitude": self.altitude.value,
            "owner": self.owner.value,
            "thread_id": self.thread_id,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "occurrence": self.occurrence,
            "metadata": dict(self.metadata),
            "name_truncated": self.name_truncated,
            "closed_by": self.closed_by,
        }


class SpanRegistry:
    """Registers spans at entry and keeps one parent stack per thread.

    The registry is owned by a session (never a module global). ``open`` returns the span
    immediately so a span leaked by an exception can still be closed by :meth:`close_all`.
    """

    def __init__(self) -> None:
        self._spans: list[Span] = []
        self._open: dict[int, Span] = {}
        self._occurrences: dict[tuple[Altitude, str], int] = {}
        self._stacks = threading.local()
        self._lock = threading.Lock()

    def _stack(self) -> list[Span]:
        stack = getattr(self._stacks, "stack", None)
        if stack is None:
            stack = self._stacks.stack = []
        return stack

    def open(
        self,
        name: object,
        altitude: Altitude,
        owner: OwnerClass,
        metadata: dict[str, object] | None = None,
    ) -> Span:
        """Register a span now; its parent is the innermost open span on this thread."""
        text, truncated = escape_name(name)
        stack = self._stack()
        with self._lock:
            key = (altitude, text)
            occurrence = self._occurrences.get(key, 0)
            self._occurrences[key] = occurrence + 1
            span = Span(
                span_id=len(self._spans),
                parent_id=stack[-1].span_id if stack else None,
                name=text,
                altitude=altitude,
                owner=owner,
                thread_id=threading.get_ident(),
                start_ns=time.perf_counter_ns(),
                occurrence=occurrence,
                metadata=dict(metadata or {}),
                name_truncated=truncated,
            )
            self._spans.append(span)
            self._open[span.span_id] = span
        stack.append(span)
        return span

    def close(self, span: Span, closed_by: str = "exit") -> None:
        """Close ``span`` (idempotent) and pop it, plus anything opened above it, off its stack."""
        now = time.perf_counter_ns()
        with self._lock:
            if self._open.pop(span.span_id, None) is None:
                return
            span.end_ns = now
            span.closed_by = closed_by
        stack = self._stack()
        if span in stack:
            while stack:
                top = stack.pop()
                if top is span:
                    break
                self._close_leaked(top, f"parent {span.name!r} closed first", now)

    def _close_leaked(self, span: Span, reason: str, now: int) -> None:
        with self._lock:
            if self._open.pop(span.span_id, None) is not None:
                span.end_ns = now
                span.closed_by = reason

    def close_all(self, reason: str, keep: Span | None = None) -> list[Span]:
        """Close every span still open (but ``keep``), disclosing ``reason`` on each.

        Returns the spans it closed. Parent stacks are reset; ``keep`` stays open for its owner
        to close normally.
        """
        now = time.perf_counter_ns()
        with self._lock:
            leaked = sorted(
                (s for s in self._open.values() if s is not keep), key=lambda s: s.span_id
            )
            for span in leaked:
                span.end_ns = now
                span.closed_by = reason
                del self._open[span.span_id]
        self._stacks = threading.local()
        if keep is not None and keep.end_ns is None:
            self._stack().append(keep)
        return leaked

    @property
    def spans(self) -> tuple[Span, ...]:
        """Every span registered so far, in registration order."""
        return tuple(self._spans)

    @property
    def open_count(self) -> int:
        """How many spans are currently open."""
        return len(self._open)
