"""The immutable observer events: one small frozen class per kind, on shared coordinates.

An :class:`ObserverEvent` is exactly one of four kinds (:class:`EventKind`), each its own class:

* :class:`ScalarEvent` — one number, ``value`` (e.g. the l2 norm of a site's gradient);
* :class:`HistogramEvent` — ``histogram``: the exact signed log2 counts of a site with the spine
  that describes the same data (:class:`HistogramPayload`);
* :class:`VerdictEvent` — ``verdict``: a check's finding (:class:`Verdict`);
* :class:`UnavailableEvent` — a value that was not measured, with its ``reason`` (never a 0).

Every event has a ``name`` (the stable tag), :class:`~stepscope.events.Axes` (``optimizer_step``,
``examples_seen``, ``epoch``; the last two ``None`` when unknown, never 0), a
:class:`~stepscope.events.Subject` (site, stream, phase, micro-batch, and for gradients the stage
and scale provenance; :data:`~stepscope.events.NO_SUBJECT` for user scalars), an optional
``field`` and an :class:`EventSource`. Each kind is a frozen dataclass whose ``__post_init__``
validates it. Axes and subject are validated value objects shared by the events built from them,
so an event checks only what is its own: a non-empty name, the two coordinates' types, the
payload (a real number, a non-empty reason, ...). Arguments of the exact types pass with one
``type(x) is T`` test each; anything else is coerced (``source`` may be given as its value, a
number as an int or numpy number) or refused on a slower path. :meth:`ScalarEvent.measured` is
the converter's positional constructor for the spine scalars (most events): the same checks, no
keyword parsing. Invalid events refuse ``event_invalid``. The coordinates read through as properties
(``e.optimizer_step``, ``e.site``, ...).

Consumers narrow on the class: after ``isinstance(e, ScalarEvent)``, ``e.value`` is a ``float``.
:attr:`ObserverEvent.kind` names the kind for counting and filtering. :meth:`ObserverEvent.to_dict`
writes the same 18 keys for every kind (the JSONL line), ``None`` where a kind has no such field;
:meth:`ObserverEvent.from_dict` builds the class of the line's ``kind``.

Example
-------
>>> e = ScalarEvent("loss", Axes(3), 0.25)
>>> e.kind.value, e.optimizer_step, e.examples_seen
('scalar', 3, None)
>>> ObserverEvent.from_dict(e.to_dict()) == e
True
>>> UnavailableEvent("acc", Axes(3), "not_scheduled").to_dict()["value"] is None
True
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any, ClassVar

import numpy as np

from stepscope.codec import json_float
from stepscope.errors import Refusal
from stepscope.events.coordinates import (
    NO_SUBJECT,
    Axes,
    Axis,
    GradientStage,
    Subject,
    invalid_event,
)
from stepscope.events.payload import HistogramPayload, Verdict
from stepscope.history.vocab import Phase, ScaleGrad, Stream

__all__ = [
    "EventKind",
    "EventSource",
    "HistogramEvent",
    "ObserverEvent",
    "ScalarEvent",
    "UnavailableEvent",
    "VerdictEvent",
]


class EventKind(str, enum.Enum):
    """The closed vocabulary of event kinds (one class each)."""

    SCALAR = "scalar"
    HISTOGRAM_COUNTS = "histogram_counts"
    VERDICT = "verdict"
    UNAVAILABLE = "unavailable"


class EventSource(str, enum.Enum):
    """Where an event's number came from (its provenance)."""

    SPINE = "spine"  # a field of (or derived from) a site's spine row
    HISTOGRAM = "histogram"  # a site's histogram row
    USER_SCALAR = "user_scalar"  # a scalar the user logged (loss, lr, ...)
    PROBE = "probe"  # a dense-probe measurement (stepscope.probe), outside the step's hooks
    CHECK = "check"  # produced by a check from other events (verdicts, derived ratios)


_set = object.__setattr__  # a frozen class's __post_init__ replaces a coerced value
_new = object.__new__


def _checked_common(
    kind: EventKind, name: Any, axes: Any, subject: Any, field: Any, source: Any
) -> EventSource:
    """The slow path of :meth:`ObserverEvent._check_common`: refuse, or coerce ``source``."""
    if not isinstance(name, str) or not name:
        raise invalid_event(f"a {kind.value} event needs a non-empty name, not {name!r}.")
    if not isinstance(axes, Axes):
        raise invalid_event(f"event {name!r}: axes={axes!r} is not an Axes.")
    if not isinstance(subject, Subject):
        raise invalid_event(f"event {name!r}: subject={subject!r} is not a Subject.")
    if field is not None and not isinstance(field, str):
        raise invalid_event(f"event {name!r}: field={field!r} is not a string.")
    try:
        return EventSource(source)
    except ValueError:
        allowed = ", ".join(s.value for s in EventSource)
        raise invalid_event(f"event {name!r}: source={source!r} is not one of {allowed}.") from None


def _number(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.number)):
        raise invalid_event(f"scalar event {name!r}: value {v!r} is not a number.")
    return float(v)


def _flag(name: str, v: Any) -> bool:
    if not isinstance(v, (bool, np.bool_)):
        raise invalid_event(f"event {name!r}: estimated={v!r} is not a bool.")
    return bool(v)


class ObserverEvent:
    """Base of the four event kinds: the name, the coordinates, the field and the source.

    Not constructed itself; build :class:`ScalarEvent`, :class:`HistogramEvent`,
    :class:`VerdictEvent` or :class:`UnavailableEvent`. Every subclass has the attributes
    ``name`` (str), ``axes`` (:class:`~stepscope.events.Axes`), ``subject``
    (:class:`~stepscope.events.Subject`), ``field`` (str or ``None``) and ``source``
    (:class:`EventSource`); the coordinates' members read through as properties.
    """

    __slots__ = ()
    #: The kind of every instance of the class.
    kind: ClassVar[EventKind]
    name: str
    axes: Axes
    subject: Subject
    field: str | None
    source: EventSource

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise invalid_event(
            "ObserverEvent is the base of the four kinds: build a ScalarEvent, HistogramEvent, "
            "VerdictEvent or UnavailableEvent (or use ObserverEvent.from_dict)."
        )

    def _check_common(self) -> None:
        """Validate what every kind has (one type test each on the fast path); coerce ``source``.

        The first step of every kind's ``__post_init__``.
        """
        name, field = self.name, self.field
        if not (
            type(name) is str
            and name
            and type(self.axes) is Axes
            and type(self.subject) is Subject
            and (field is None or type(field) is str)
            and type(self.source) is EventSource
        ):
            source = _checked_common(self.kind, name, self.axes, self.subject, field, self.source)
            _set(self, "source", source)

    @property
    def estimated(self) -> bool:
        """Whether the number is a sample estimate (only scalars and histograms can be)."""
        return False

    # -- the coordinates, read through -------------------------------------------------------
    @property
    def optimizer_step(self) -> int:
        """The optimizer step."""
        return self.axes.optimizer_step

    @property
    def examples_seen(self) -> int | None:
        """Training examples seen (``None`` when unknown)."""
        return self.axes.examples_seen

    @property
    def epoch(self) -> int | None:
        """The epoch (``None`` when unknown)."""
        return self.axes.epoch

    def axis(self, axis: Axis | str) -> int | None:
        """The value of one training axis (``None`` when unknown)."""
        return self.axes.of(axis)

    @property
    def site(self) -> str | None:
        """The observed site (``None`` when not about a site)."""
        return self.subject.site

    @property
    def stream(self) -> Stream | None:
        """The observed stream."""
        return self.subject.stream

    @property
    def phase(self) -> Phase | None:
        """The phase of the observation."""
        return self.subject.phase

    @property
    def micro_batch(self) -> int | None:
        """The micro-batch index of an accumulation partial."""
        return self.subject.micro_batch

    @property
    def stage(self) -> GradientStage | None:
        """The gradient stage (gradient streams)."""
        return self.subject.stage

    @property
    def scale_provenance(self) -> ScaleGrad | None:
        """Whether the gradient was loss-scaled (gradient streams)."""
        return self.subject.scale_provenance

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary with the same 18 keys for every kind (``None`` where absent).

        Histogram counts are sparse ``[index, count]`` pairs; non-finite floats are strings.
        """
        a, s = self.axes, self.subject
        return {
            "kind": self.kind.value,
            "name": self.name,
            "optimizer_step": a.optimizer_step,
            "examples_seen": a.examples_seen,
            "epoch": a.epoch,
            "value": None,
            "site": s.site,
            "stream": None if s.stream is None else s.stream.value,
            "phase": None if s.phase is None else s.phase.value,
            "field": self.field,
            "micro_batch": s.micro_batch,
            "stage": None if s.stage is None else s.stage.value,
            "scale_provenance": None if s.scale_provenance is None else s.scale_provenance.value,
            "reason": None,
            "source": self.source.value,
            "verdict": None,
            "histogram": None,
            "estimated": self.estimated,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ObserverEvent:
        """Inverse of :meth:`to_dict` (refuses ``event_invalid`` when malformed).

        A key that belongs to another kind (a ``reason`` on a scalar, ...) must be ``null``.
        """
        try:
            kind = EventKind(d["kind"])
            for key, owner in _PAYLOAD_KEYS.items():
                if owner is not kind and d.get(key) is not None:
                    raise invalid_event(f"a {kind.value} event carries no {key!r}.")
            axes = Axes(d["optimizer_step"], d.get("examples_seen"), d.get("epoch"))
            subject = Subject(
                d.get("site"),
                d.get("stream"),
                d.get("phase"),
                d.get("micro_batch"),
                d.get("stage"),
                d.get("scale_provenance"),
            )
            common: dict[str, Any] = {
                "subject": subject,
                "field": d.get("field"),
                "source": d.get("source", EventSource.USER_SCALAR.value),
            }
            estimated = d.get("estimated", False)
            if kind is EventKind.SCALAR:
                value = float(d["value"])  # a null value is malformed: TypeError below
                return ScalarEvent(d["name"], axes, value, estimated=estimated, **common)
            if kind is EventKind.HISTOGRAM_COUNTS:
                payload = HistogramPayload.from_dict(d["histogram"])
                return HistogramEvent(d["name"], axes, payload, estimated=estimated, **common)
            if estimated:
                raise invalid_event(f"a {kind.value} event is never estimated.")
            if kind is EventKind.VERDICT:
                return VerdictEvent(d["name"], axes, Verdict.from_dict(d["verdict"]), **common)
            return UnavailableEvent(d["name"], axes, d["reason"], **common)
        except Refusal:  # a RefusalInputError is a ValueError too: keep its own code
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise invalid_event(f"malformed event dictionary: {exc!r}.") from None


@dataclass(frozen=True, slots=True)
class ScalarEvent(ObserverEvent):
    """One number on the training axes.

    Parameters
    ----------
    name, axes
        The tag (e.g. ``"gradient.backward/fc1/l2"`` or a user scalar's name) and the axes.
    value
        The number (an int, float or numpy number; stored as a float, NaN and inf allowed).
    subject, field, source
        What was observed (default: nothing, a user scalar), which quantity of it, provenance
        (an :class:`EventSource` or its value).
    estimated
        ``True`` when the value is an estimate from a sample rather than an exact statistic
        (an ``update`` row reduced from ``update_sample_size`` seeded elements of a larger
        parameter: its ``l2`` is the norm of the *sample*, not of the whole update).
    """

    kind: ClassVar[EventKind] = EventKind.SCALAR
    name: str
    axes: Axes
    value: float
    _: KW_ONLY
    subject: Subject = NO_SUBJECT
    field: str | None = None
    source: EventSource = EventSource.USER_SCALAR
    estimated: bool = False

    def __post_init__(self) -> None:
        self._check_common()
        if type(self.value) is not float:
            _set(self, "value", _number(self.name, self.value))
        if type(self.estimated) is not bool:
            _set(self, "estimated", _flag(self.name, self.estimated))

    @classmethod
    def measured(
        cls,
        name: str,
        axes: Axes,
        value: float,
        subject: Subject,
        field: str | None,
        source: EventSource | str,
        estimated: bool,
    ) -> ScalarEvent:
        """The hot-path constructor: every argument positional, checked by exact type.

        Accepts what the constructor accepts and refuses what it refuses (the test
        ``test_the_hot_path_constructor_equals_init_and_refuses_the_same`` holds the two
        together). The arguments are set through the slots' own setters. Arguments of the exact
        types, as :func:`~stepscope.events.events_from_step` passes them for each spine field (a
        ``float`` value, a non-empty ``str`` name and field, an :class:`Axes`, a
        :class:`Subject`, an :class:`EventSource`, a ``bool``), pass with one type test each;
        anything else goes through ``__post_init__`` (coerced or refused there), as after the
        constructor.

        >>> e = ScalarEvent.measured("w/l2", Axes(1), 2.0, NO_SUBJECT, "l2", EventSource.SPINE, False)
        >>> e == ScalarEvent("w/l2", Axes(1), 2.0, field="l2", source="spine")
        True
        """
        e = _new(cls)
        set_name, set_axes, set_subject, set_field, set_source, set_value, set_estimated = (
            _SCALAR_SLOT_SETTERS
        )
        set_name(e, name)
        set_axes(e, axes)
        set_subject(e, subject)
        set_field(e, field)
        set_source(e, source)
        set_value(e, value)
        set_estimated(e, estimated)
        if not (
            type(value) is float
            and type(name) is str
            and name
            and type(field) is str
            and type(axes) is Axes
            and type(subject) is Subject
            and type(source) is EventSource
            and type(estimated) is bool
        ):
            e.__post_init__()
        return e

    def to_dict(self) -> dict[str, Any]:
        """See :meth:`ObserverEvent.to_dict`."""
        d = ObserverEvent.to_dict(self)
        d["value"] = json_float(self.value)
        return d


#: The slot setters of :class:`ScalarEvent`, in :meth:`ScalarEvent.measured`'s order. A frozen
#: class's slots are set once, at construction; a slot's own ``__set__`` does what
#: ``object.__setattr__`` (the generated ``__init__``) does without looking the attribute up
#: (about 40% cheaper per slot).
_SCALAR_SLOT_SETTERS = tuple(
    ScalarEvent.__dict__[f].__set__
    for f in ("name", "axes", "subject", "field", "source", "value", "estimated")
)


@dataclass(frozen=True, slots=True)
class HistogramEvent(ObserverEvent):
    """The exact histogram counts of one site row (kind ``histogram_counts``).

    Parameters
    ----------
    name, axes
        The tag (``"{stream}.{phase}/{site}"``) and the axes.
    histogram
        The :class:`HistogramPayload`.
    subject, field, source, estimated
        As for :class:`ScalarEvent` (``source`` defaults to ``histogram``).
    """

    kind: ClassVar[EventKind] = EventKind.HISTOGRAM_COUNTS
    name: str
    axes: Axes
    histogram: HistogramPayload
    _: KW_ONLY
    subject: Subject = NO_SUBJECT
    field: str | None = None
    source: EventSource = EventSource.HISTOGRAM
    estimated: bool = False

    def __post_init__(self) -> None:
        self._check_common()
        if not isinstance(self.histogram, HistogramPayload):
            raise invalid_event(
                f"histogram_counts event {self.name!r}: {self.histogram!r} is not a "
                "HistogramPayload."
            )
        if type(self.estimated) is not bool:
            _set(self, "estimated", _flag(self.name, self.estimated))

    def to_dict(self) -> dict[str, Any]:
        """See :meth:`ObserverEvent.to_dict`."""
        d = ObserverEvent.to_dict(self)
        d["histogram"] = self.histogram.to_dict()
        return d


@dataclass(frozen=True, slots=True)
class VerdictEvent(ObserverEvent):
    """A check's finding about another event (whose subject and field it keeps).

    Parameters
    ----------
    name, axes
        The tag (``"check/{check}/{target name}"``) and the axes of the target event.
    verdict
        The :class:`Verdict`.
    subject, field, source
        As for :class:`ScalarEvent` (``source`` defaults to ``check``).
    """

    kind: ClassVar[EventKind] = EventKind.VERDICT
    name: str
    axes: Axes
    verdict: Verdict
    _: KW_ONLY
    subject: Subject = NO_SUBJECT
    field: str | None = None
    source: EventSource = EventSource.CHECK

    def __post_init__(self) -> None:
        self._check_common()
        if not isinstance(self.verdict, Verdict):
            raise invalid_event(f"verdict event {self.name!r}: {self.verdict!r} is not a Verdict.")

    def to_dict(self) -> dict[str, Any]:
        """See :meth:`ObserverEvent.to_dict`."""
        d = ObserverEvent.to_dict(self)
        d["verdict"] = self.verdict.to_dict()
        return d


@dataclass(frozen=True, slots=True)
class UnavailableEvent(ObserverEvent):
    """A value that was not measured, and why — never a 0.

    Parameters
    ----------
    name, axes
        The tag of the missing value and the axes.
    reason
        Non-empty: a presence value (``not_scheduled``, ``capture_failed``, ...) or an
        ``undefined_*`` reason (``undefined_no_finite_values``, ...).
    subject, field, source
        As for :class:`ScalarEvent`.
    """

    kind: ClassVar[EventKind] = EventKind.UNAVAILABLE
    name: str
    axes: Axes
    reason: str
    _: KW_ONLY
    subject: Subject = NO_SUBJECT
    field: str | None = None
    source: EventSource = EventSource.USER_SCALAR

    def __post_init__(self) -> None:
        self._check_common()
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise invalid_event(f"unavailable event {self.name!r} needs a non-empty reason.")

    def to_dict(self) -> dict[str, Any]:
        """See :meth:`ObserverEvent.to_dict`."""
        d = ObserverEvent.to_dict(self)
        d["reason"] = self.reason
        return d


#: The JSON keys that belong to one kind only (``null`` on the others).
_PAYLOAD_KEYS: dict[str, EventKind] = {
    "value": EventKind.SCALAR,
    "histogram": EventKind.HISTOGRAM_COUNTS,
    "verdict": EventKind.VERDICT,
    "reason": EventKind.UNAVAILABLE,
}
