"""Where an event sits: its training axes (:class:`Axes`) and what it observed (:class:`Subject`).

Both are small frozen value objects validated once and shared: the converter builds one
:class:`Axes` per step and one :class:`Subject` per site row, and the eight spine scalars, the
histogram and any ``unavailable`` events of that row all point at the same two objects. An
event's constructor then only checks what is its own (see :mod:`stepscope.events.event`).

* :class:`Axes` — ``optimizer_step`` (an int >= 0), ``examples_seen`` and ``epoch`` (ints >= 0,
  or ``None`` when unknown: never 0). :class:`Axis` names one of them (a tracker's x-axis).
* :class:`Subject` — ``site``, ``stream``, ``phase``, ``micro_batch`` and, for gradient streams
  (which must say them), the :class:`GradientStage` and the scale provenance
  (:class:`~stepscope.history.ScaleGrad`). User scalars have the empty subject
  :data:`NO_SUBJECT`.

Invalid values refuse ``event_invalid``.

Example
-------
>>> a = Axes(7, examples_seen=448)
>>> a.of(Axis.EXAMPLES_SEEN), a.of("epoch")
(448, None)
>>> s = Subject("fc1", "gradient", "pre_step", stage="pre_step", scale_provenance="unscaled")
>>> s.stream.value, s.stage.value
('gradient', 'pre_step')
>>> try:
...     Subject("fc1", "gradient", "pre_step")
... except Refusal as err:
...     print(err.code)
event_invalid
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.vocab import GRADIENT_STREAMS, Phase, ScaleGrad, Stream

__all__ = ["NO_SUBJECT", "Axes", "Axis", "GradientStage", "Subject", "invalid_event"]


def invalid_event(message: str) -> Refusal:
    """The ``event_invalid`` refusal with the remedy every event constructor names."""
    return Refusal(
        "event_invalid",
        message,
        ["build events with events_from_step() or fill every field the kind requires"],
    )


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


def _count(name: str, v: Any, optional: bool) -> int | None:
    """``v`` as an int >= 0 (numpy ints accepted), ``None`` where allowed; else refuse."""
    if v is None and optional:
        return None
    if type(v) is int and v >= 0:
        return v
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
        raise invalid_event(f"{name}={v!r} is not an int >= 0.")
    return int(v)


@dataclass(frozen=True, slots=True)
class Axes:
    """The training coordinate of an event.

    Parameters
    ----------
    optimizer_step
        The optimizer step (int >= 0).
    examples_seen, epoch
        Training examples consumed and the epoch (ints >= 0), ``None`` when unknown.
    """

    optimizer_step: int
    examples_seen: int | None = None
    epoch: int | None = None

    def __post_init__(self) -> None:
        s = object.__setattr__
        s(self, "optimizer_step", _count("optimizer_step", self.optimizer_step, False))
        s(self, "examples_seen", _count("examples_seen", self.examples_seen, True))
        s(self, "epoch", _count("epoch", self.epoch, True))

    def of(self, axis: Axis | str) -> int | None:
        """The value of one training axis (``None`` when unknown)."""
        a = axis if isinstance(axis, Axis) else Axis(axis)
        if a is Axis.OPTIMIZER_STEP:
            return self.optimizer_step
        return self.examples_seen if a is Axis.EXAMPLES_SEEN else self.epoch


def _member(kind: type[enum.Enum], name: str, v: Any) -> Any:
    if v is None or type(v) is kind:
        return v
    try:
        return kind(v)
    except ValueError:
        allowed = ", ".join(str(m.value) for m in kind)
        raise invalid_event(f"{name}={v!r} is not one of {allowed}.") from None


@dataclass(frozen=True, slots=True, init=False)
class Subject:
    """What an event is about: a site's stream at a phase (all ``None`` for user scalars).

    Parameters
    ----------
    site
        The site name (``None`` when the event is not about a site).
    stream, phase
        :class:`~stepscope.history.Stream` and :class:`~stepscope.history.Phase` (or values).
    micro_batch
        The micro-batch index of an accumulation partial (int >= 0), else ``None``.
    stage, scale_provenance
        :class:`GradientStage` and :class:`~stepscope.history.ScaleGrad`: required when
        ``stream`` is a gradient stream.
    """

    site: str | None
    stream: Stream | None
    phase: Phase | None
    micro_batch: int | None
    stage: GradientStage | None
    scale_provenance: ScaleGrad | None

    def __init__(
        self,
        site: str | None = None,
        stream: Stream | str | None = None,
        phase: Phase | str | None = None,
        micro_batch: int | None = None,
        stage: GradientStage | str | None = None,
        scale_provenance: ScaleGrad | str | None = None,
    ) -> None:
        # one subject per site row (the converter's hot path): exact types pass with one test
        if site is not None and not isinstance(site, str):
            raise invalid_event(f"site={site!r} is not a string.")
        if type(stream) is not Stream:
            stream = _member(Stream, "stream", stream)
        if type(phase) is not Phase:
            phase = _member(Phase, "phase", phase)
        if micro_batch is not None:
            micro_batch = _count("micro_batch", micro_batch, True)
        if type(stage) is not GradientStage:
            stage = _member(GradientStage, "stage", stage)
        if type(scale_provenance) is not ScaleGrad:
            scale_provenance = _member(ScaleGrad, "scale_provenance", scale_provenance)
        if isinstance(stream, Stream) and stream in GRADIENT_STREAMS:
            if stage is None or scale_provenance is None:
                raise invalid_event(
                    f"a {stream.value} subject ({site}) must carry stage and scale_provenance."
                )
        s = object.__setattr__
        s(self, "site", site)
        s(self, "stream", stream)
        s(self, "phase", phase)
        s(self, "micro_batch", micro_batch)
        s(self, "stage", stage)
        s(self, "scale_provenance", scale_provenance)


#: The subject of events that are not about a site (user scalars, run-level numbers).
NO_SUBJECT = Subject()
