"""The immutable observer event: one vocabulary for checks and trackers.

An :class:`ObserverEvent` is exactly one of four kinds (:class:`EventKind`): ``scalar`` (one number,
e.g. the l2 norm of a site's gradient), ``histogram_counts`` (the exact signed log2 counts of a
site with the spine that describes the same data), ``verdict`` (a check's finding) and
``unavailable`` (a value that was not measured, with the reason — never a 0). Every event carries
the three training axes ``optimizer_step``, ``examples_seen`` and ``epoch`` (the last two may be
``None``: unknown, never 0). Construction validates the event and refuses ``event_invalid``.

Example
-------
>>> e = ObserverEvent(EventKind.SCALAR, "loss", optimizer_step=3, value=0.25)
>>> e.kind.value, e.optimizer_step, e.examples_seen
('scalar', 3, None)
>>> ObserverEvent.from_dict(e.to_dict()) == e
True
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from dataclasses import MISSING, dataclass
from typing import Any

import numpy as np

from stepscope.codec import float_from_json, json_float
from stepscope.errors import Refusal
from stepscope.history.schema import GRADIENT_STREAMS, Phase, ScaleGrad, Stream
from stepscope.stats import SPINE_FIELDS, SPINE_WIDTH, Histogram, HistogramDescriptor, RunningStats

__all__ = [
    "Axis",
    "EventKind",
    "EventSource",
    "GradientStage",
    "HistogramPayload",
    "ObserverEvent",
    "Verdict",
]


class EventKind(str, enum.Enum):
    """The closed vocabulary of event kinds."""

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


class Axis(str, enum.Enum):
    """The training axes every event records; trackers declare which one is their x-axis."""

    OPTIMIZER_STEP = "optimizer_step"
    EXAMPLES_SEEN = "examples_seen"
    EPOCH = "epoch"


class GradientStage(str, enum.Enum):
    """The point in a gradient's life at which it was observed.

    ``micro_batch`` is one accumulation partial (backward phase with a micro-batch index);
    ``backward`` the accumulated gradient as backward left it; ``pre_clip``/``post_clip`` around
    clipping; ``pre_step``/``post_step`` around ``optimizer.step()``; ``unknown`` otherwise.
    """

    MICRO_BATCH = "micro_batch"
    BACKWARD = "backward"
    PRE_CLIP = "pre_clip"
    POST_CLIP = "post_clip"
    PRE_STEP = "pre_step"
    POST_STEP = "post_step"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, phase: Phase, micro_batch: int | None) -> GradientStage:
        """The stage of a gradient observed in ``phase`` (and micro-batch, if any)."""
        if phase is Phase.BACKWARD and micro_batch is not None:
            return cls.MICRO_BATCH
        try:
            return cls(phase.value)
        except ValueError:
            return cls.UNKNOWN


def _readonly(a: Any, dtype: Any) -> np.ndarray:
    arr = np.array(a, dtype=dtype, copy=True)
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class HistogramPayload:
    """Exact histogram counts plus the spine row of the same data (read-only arrays).

    ``counts`` is the int64 row of :func:`stepscope.stats.reduce_histograms` on ``descriptor``;
    ``spine`` the float64 row of :func:`stepscope.stats.reduce_spines`, which gives TensorBoard
    its exact ``num, min, max, sum, sum_squares``.
    """

    counts: np.ndarray
    spine: np.ndarray
    descriptor: HistogramDescriptor

    def __post_init__(self) -> None:
        object.__setattr__(self, "counts", _readonly(self.counts, np.int64))
        object.__setattr__(self, "spine", _readonly(self.spine, np.float64))
        if self.counts.shape != (self.descriptor.width,) or self.spine.shape != (SPINE_WIDTH,):
            raise Refusal(
                "event_invalid",
                f"histogram payload has counts {self.counts.shape} / spine {self.spine.shape}; "
                f"expected ({self.descriptor.width},) / ({SPINE_WIDTH},).",
                ["build it from one reduce_histograms row and one reduce_spines row"],
            )

    def histogram(self) -> Histogram:
        """The counts as a :class:`stepscope.stats.Histogram`."""
        return Histogram.from_vector(self.counts, self.descriptor)

    def stats(self) -> RunningStats:
        """The spine as a :class:`stepscope.stats.RunningStats`."""
        return RunningStats.from_vector(self.spine)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, HistogramPayload)
            and self.descriptor == other.descriptor
            and np.array_equal(self.counts, other.counts)
            and np.array_equal(self.spine, other.spine, equal_nan=True)
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class Verdict:
    """A check's finding: which check, what it did, what it saw, against which band.

    ``observed`` is the value that violated ``[lower, upper]`` (either bound may be ``None``),
    ``action`` the configured behaviour (``warn``, ``raise`` or ``stop``).
    """

    check: str
    action: str
    message: str
    observed: float | None = None
    lower: float | None = None
    upper: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary (non-finite floats as strings)."""
        return {
            "check": self.check,
            "action": self.action,
            "message": self.message,
            "observed": _enc(self.observed),
            "lower": _enc(self.lower),
            "upper": _enc(self.upper),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """Inverse of :meth:`to_dict`."""
        return cls(
            str(d["check"]),
            str(d["action"]),
            str(d["message"]),
            _dec(d.get("observed")),
            _dec(d.get("lower")),
            _dec(d.get("upper")),
        )


_enc = json_float  # the one non-finite float spelling (stepscope.codec)
_dec = float_from_json


def _invalid(message: str) -> Refusal:
    return Refusal(
        "event_invalid",
        message,
        ["build events with events_from_step() or fill every field the kind requires"],
    )


@dataclass(frozen=True)
class ObserverEvent:
    """One immutable observation, finding or absence, on the training axes.

    Parameters
    ----------
    kind
        :class:`EventKind`.
    name
        The stable tag, e.g. ``"gradient.backward/fc1/l2"`` or a user scalar's name.
    optimizer_step, examples_seen, epoch
        The training axes (``examples_seen``/``epoch`` ``None`` when unknown).
    value
        The number of a ``scalar`` (and only of a scalar).
    site, stream, phase, field, micro_batch
        What was observed (``None`` for user scalars).
    stage, scale_provenance
        Required on ``scalar``/``histogram_counts`` events of gradient streams.
    reason
        Why an ``unavailable`` value is missing (non-empty; a presence value or ``undefined_*``).
    histogram
        The payload of a ``histogram_counts`` event.
    verdict
        The payload of a ``verdict`` event.
    source
        :class:`EventSource`.
    estimated
        ``True`` when the value is an estimate from a sample rather than an exact statistic
        (an ``update`` row reduced from ``update_sample_size`` seeded elements of a larger
        parameter: its ``l2`` is the norm of the *sample*, not of the whole update).
    """

    kind: EventKind
    name: str
    optimizer_step: int
    examples_seen: int | None = None
    epoch: int | None = None
    value: float | None = None
    site: str | None = None
    stream: Stream | None = None
    phase: Phase | None = None
    field: str | None = None
    micro_batch: int | None = None
    stage: GradientStage | None = None
    scale_provenance: ScaleGrad | None = None
    reason: str | None = None
    histogram: HistogramPayload | None = None
    verdict: Verdict | None = None
    source: EventSource = EventSource.USER_SCALAR
    estimated: bool = False

    def __post_init__(self) -> None:
        s = object.__setattr__
        try:
            s(self, "kind", EventKind(self.kind))
            s(self, "source", EventSource(self.source))
            for name, enum_type in (
                ("stream", Stream),
                ("phase", Phase),
                ("stage", GradientStage),
                ("scale_provenance", ScaleGrad),
            ):
                value = getattr(self, name)
                if value is not None:
                    s(self, name, enum_type(value))
        except ValueError as exc:
            raise _invalid(f"event {self.name!r}: {exc}.") from None
        for axis in ("optimizer_step", "examples_seen", "epoch"):
            v = getattr(self, axis)
            if v is None and axis != "optimizer_step":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise _invalid(f"event {self.name!r}: {axis}={v!r} is not an int >= 0.")
            s(self, axis, int(v))
        if not isinstance(self.name, str) or not self.name:
            raise _invalid("an event needs a non-empty name.")
        if not isinstance(self.estimated, (bool, np.bool_)):
            raise _invalid(f"event {self.name!r}: estimated={self.estimated!r} is not a bool.")
        s(self, "estimated", bool(self.estimated))
        if self.value is not None:
            if isinstance(self.value, bool) or not isinstance(self.value, (int, float, np.number)):
                raise _invalid(f"event {self.name!r}: value {self.value!r} is not a number.")
            s(self, "value", float(self.value))
        self._check_kind()

    def _check_kind(self) -> None:
        k = self.kind
        if (self.value is not None) != (k is EventKind.SCALAR):
            raise _invalid(f"{k.value} event {self.name!r}: only scalar events carry a value.")
        if (self.histogram is not None) != (k is EventKind.HISTOGRAM_COUNTS):
            raise _invalid(f"{k.value} event {self.name!r}: only histogram_counts carry counts.")
        if (self.verdict is not None) != (k is EventKind.VERDICT):
            raise _invalid(f"{k.value} event {self.name!r}: only verdict events carry a verdict.")
        if k is EventKind.UNAVAILABLE:
            if not isinstance(self.reason, str) or not self.reason.strip():
                raise _invalid(f"unavailable event {self.name!r} needs a non-empty reason.")
        elif self.reason is not None:
            raise _invalid(f"{k.value} event {self.name!r}: only unavailable events have a reason.")
        measured = k in (EventKind.SCALAR, EventKind.HISTOGRAM_COUNTS)
        if measured and self.stream in GRADIENT_STREAMS:
            if self.stage is None or self.scale_provenance is None:
                raise _invalid(
                    f"{self.stream.value} event {self.name!r} must carry stage and "
                    "scale_provenance."
                )

    @classmethod
    def _trusted(cls, fields: dict[str, Any]) -> ObserverEvent:
        """Build without validation from already-typed fields (the converter's hot path).

        ``fields`` must name every field (start from :func:`trusted_template`) and is adopted as
        the instance's attribute dict. Only for callers that build fields from validated records
        (enums already enums, axes from a ``StepBlockRecord``); everyone else uses ``__init__``.
        """
        obj = object.__new__(cls)
        object.__setattr__(obj, "__dict__", fields)
        return obj

    # -- axes ----------------------------------------------------------------------------------
    def axis(self, axis: Axis | str) -> int | None:
        """The value of one training axis (``None`` when unknown)."""
        return getattr(self, Axis(axis).value)

    # -- JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary with every field (sparse ``[index, count]`` histogram counts)."""
        d: dict[str, Any] = {
            "kind": self.kind.value,
            "name": self.name,
            "optimizer_step": self.optimizer_step,
            "examples_seen": self.examples_seen,
            "epoch": self.epoch,
            "value": _enc(self.value),
            "site": self.site,
            "stream": None if self.stream is None else self.stream.value,
            "phase": None if self.phase is None else self.phase.value,
            "field": self.field,
            "micro_batch": self.micro_batch,
            "stage": None if self.stage is None else self.stage.value,
            "scale_provenance": None
            if self.scale_provenance is None
            else self.scale_provenance.value,
            "reason": self.reason,
            "source": self.source.value,
            "verdict": None if self.verdict is None else self.verdict.to_dict(),
            "histogram": None,
            "estimated": self.estimated,
        }
        if self.histogram is not None:
            c = self.histogram.counts
            nz = np.flatnonzero(c)
            d["histogram"] = {
                "descriptor": self.histogram.descriptor.to_dict(),
                "counts": [[int(i), int(c[i])] for i in nz],
                "spine": {
                    f: _enc(float(v)) for f, v in zip(SPINE_FIELDS, self.histogram.spine.tolist())
                },
            }
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ObserverEvent:
        """Inverse of :meth:`to_dict` (refuses ``event_invalid`` when malformed)."""
        try:
            hist = None
            if d.get("histogram") is not None:
                h = d["histogram"]
                desc = HistogramDescriptor.from_dict(h["descriptor"])
                counts = np.zeros(desc.width, dtype=np.int64)
                for i, c in h["counts"]:
                    counts[int(i)] = int(c)
                spine = [_dec(h["spine"][f]) for f in SPINE_FIELDS]
                hist = HistogramPayload(counts, np.array(spine, dtype=np.float64), desc)
            return cls(
                kind=EventKind(d["kind"]),
                name=d["name"],
                optimizer_step=d["optimizer_step"],
                examples_seen=d.get("examples_seen"),
                epoch=d.get("epoch"),
                value=_dec(d.get("value")),
                site=d.get("site"),
                stream=d.get("stream"),
                phase=d.get("phase"),
                field=d.get("field"),
                micro_batch=d.get("micro_batch"),
                stage=d.get("stage"),
                scale_provenance=d.get("scale_provenance"),
                reason=d.get("reason"),
                histogram=hist,
                verdict=None if d.get("verdict") is None else Verdict.from_dict(d["verdict"]),
                source=EventSource(d.get("source", "user_scalar")),
                estimated=bool(d.get("estimated", False)),
            )
        except Refusal:  # a RefusalInputError is a ValueError too: keep its own code
            raise
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise _invalid(f"malformed event dictionary: {exc!r}.") from None


_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(ObserverEvent) if f.default is not MISSING
}


def trusted_template(**fields: Any) -> dict[str, Any]:
    """Every field of :class:`ObserverEvent` with its default, updated with ``fields``."""
    return {**_DEFAULTS, **fields}
