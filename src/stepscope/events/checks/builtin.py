"""Built-in checks, each a function of events only (no tensor is ever re-scanned).

* :class:`NonFiniteCheck` — NaN/inf appeared (``nonfinite_count > 0`` or a non-finite user scalar);
  remembers the first step and site.
* :class:`ZeroFractionCheck` — the fraction of exact zeros of a site exceeds a threshold (dead
  units: a ReLU layer whose outputs are all zero). Whole-tensor fraction, not per unit.
* :class:`GradientNormCheck` — gradient l2 norm above ``upper`` (exploding) or below ``lower``
  (vanishing).
* :class:`UpdateRatioCheck` — ``update l2 / parameter l2`` of the same site at the same step outside
  ``[lower, upper]``; also publishes the ratio itself as a derived scalar.

Example
-------
>>> import warnings
>>> from stepscope.events import Axes, EventBus, EventSource, ScalarEvent, Subject
>>> bus = EventBus()
>>> check = bus.subscribe(GradientNormCheck(lower=1e-6, upper=10.0))
>>> fc = Subject("fc", "gradient", "backward", stage="backward", scale_provenance="unscaled")
>>> e = ScalarEvent("gradient.backward/fc/l2", Axes(2), 50.0, subject=fc, field="l2",
...                 source=EventSource.SPINE)
>>> with warnings.catch_warnings(record=True):
...     bus.publish([e])
>>> check.verdicts[0].verdict.message
'gradient l2 of fc is 50 > 10 (exploding) at step 2 [backward, unscaled]'
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeGuard

from stepscope.events.checks.base import Check, CheckAction, Finding
from stepscope.events.convert import SpineScalar
from stepscope.events.event import EventSource, ObserverEvent, ScalarEvent, UnavailableEvent
from stepscope.history.vocab import Phase, Stream

__all__ = ["GradientNormCheck", "NonFiniteCheck", "UpdateRatioCheck", "ZeroFractionCheck"]


def _spine_scalar(
    e: ObserverEvent, field: SpineScalar, streams: frozenset[Stream] | None
) -> TypeGuard[ScalarEvent]:
    """Whether ``e`` is the spine scalar ``field`` of one of ``streams`` (``None``: any)."""
    return (
        isinstance(e, ScalarEvent)
        and e.source is EventSource.SPINE
        and e.field == field.value
        and (streams is None or e.stream in streams)
    )


def _streams(streams: Sequence[Stream | str] | None) -> frozenset[Stream] | None:
    return None if streams is None else frozenset(Stream(s) for s in streams)


def _stream(e: ObserverEvent) -> str:
    return "-" if e.stream is None else e.stream.value


def _where(e: ObserverEvent) -> str:
    parts = [p.value for p in (e.stage, e.scale_provenance) if p is not None]
    return f" [{', '.join(parts)}]" if parts else ""


class NonFiniteCheck(Check):
    """NaN or inf appeared in a site's tensor or in a user scalar.

    Parameters
    ----------
    streams
        Streams to watch (default: all). User scalars are always watched.
    action
        ``warn``, ``raise`` or ``stop``.

    Attributes
    ----------
    first
        The first violating event (earliest step, then publication order: the collector
        publishes sites in forward order, so this is where NaN/inf first appeared).
    """

    name = "nonfinite"

    def __init__(
        self,
        streams: Sequence[Stream | str] | None = None,
        action: CheckAction | str = CheckAction.WARN,
    ) -> None:
        super().__init__(action)
        self.streams = _streams(streams)
        self.first: ObserverEvent | None = None

    def evaluate(self, events: Sequence[ObserverEvent]) -> list[Finding | ObserverEvent]:
        """Findings for every event showing a non-finite value."""
        out: list[Finding | ObserverEvent] = []
        for e in events:
            if _spine_scalar(e, SpineScalar.NONFINITE_COUNT, self.streams) and e.value > 0:
                msg = (
                    f"{int(e.value)} non-finite value(s) in {_stream(e)} of {e.site} "
                    f"at step {e.optimizer_step}{_where(e)}"
                )
            elif (
                isinstance(e, ScalarEvent)
                and e.source is EventSource.USER_SCALAR
                and not math.isfinite(e.value)
            ):
                msg = f"user scalar {e.name} is {e.value} at step {e.optimizer_step}"
            else:
                continue
            if self.first is None or e.optimizer_step < self.first.optimizer_step:
                self.first = e
            out.append(Finding(e, msg, observed=e.value, upper=0.0 if e.field else None))
        return out


class ZeroFractionCheck(Check):
    """The fraction of exact zeros of a site is above ``threshold`` (e.g. dead ReLU units).

    Parameters
    ----------
    threshold
        A fraction in [0, 1); a site whose ``zero_fraction > threshold`` is reported.
    streams
        Streams to watch (default: activations).
    """

    name = "zero_fraction"

    def __init__(
        self,
        threshold: float = 0.99,
        streams: Sequence[Stream | str] | None = (Stream.ACTIVATION,),
        action: CheckAction | str = CheckAction.WARN,
    ) -> None:
        super().__init__(action)
        self.threshold = float(threshold)
        self.streams = _streams(streams)

    def evaluate(self, events: Sequence[ObserverEvent]) -> list[Finding | ObserverEvent]:
        """Findings for zero fractions above the threshold."""
        return [
            Finding(
                e,
                f"zero fraction of {_stream(e)} {e.site} is {e.value:.4g} > "
                f"{self.threshold:g} at step {e.optimizer_step}{_where(e)}",
                observed=e.value,
                upper=self.threshold,
            )
            for e in events
            if _spine_scalar(e, SpineScalar.ZERO_FRACTION, self.streams)
            and e.value > self.threshold
        ]


class GradientNormCheck(Check):
    """Gradient l2 norms outside ``[lower, upper]``: vanishing below, exploding above.

    Thresholds apply to the norm as recorded; the verdict names its ``scale_provenance`` (a
    loss-scaled gradient's norm is the unscaled one times the scale).
    """

    name = "gradient_norm"

    def __init__(
        self,
        lower: float = 1e-7,
        upper: float = 1e3,
        streams: Sequence[Stream | str] = (Stream.GRADIENT,),
        action: CheckAction | str = CheckAction.WARN,
    ) -> None:
        super().__init__(action)
        self.lower, self.upper = float(lower), float(upper)
        self.streams = _streams(streams)

    def evaluate(self, events: Sequence[ObserverEvent]) -> list[Finding | ObserverEvent]:
        """Findings for norms outside the band."""
        out: list[Finding | ObserverEvent] = []
        for e in events:
            if not _spine_scalar(e, SpineScalar.L2, self.streams):
                continue
            v = e.value
            if v > self.upper:
                what = f"{v:.4g} > {self.upper:g} (exploding)"
            elif v < self.lower:
                what = f"{v:.4g} < {self.lower:g} (vanishing)"
            else:
                continue
            msg = f"{_stream(e)} l2 of {e.site} is {what} at step {e.optimizer_step}{_where(e)}"
            out.append(Finding(e, msg, observed=v, lower=self.lower, upper=self.upper))
        return out


class UpdateRatioCheck(Check):
    """``update l2 / parameter l2`` of one site at one step outside ``[lower, upper]``.

    Parameters
    ----------
    lower, upper
        The band of healthy ratios (a common rule of thumb is around 1e-3 per step).
    parameter_phase
        Which parameter observation is the denominator (default ``post_step``, the phase at which
        :class:`~stepscope.HistoryCollector` records the ``parameter`` stream, i.e. the weight
        after the update; ``None`` takes the first parameter l2 seen at that step).

    Each ratio is also published as a ``scalar`` event ``"update_ratio/{site}"`` (source
    ``check``); a zero parameter norm gives an ``unavailable`` event
    (``undefined_zero_parameter_norm``), never an infinite or zero ratio.

    Like is compared with like. An exact update (``estimated=False``) gives
    ``l2(update) / l2(parameter)``. An update reduced from a seeded sample of ``k`` of the
    parameter's ``n`` elements (``estimated=True``) has the l2 norm of the *sample*, which is
    ``sqrt(k/n)`` times too small for the whole tensor; its ratio is then the ratio of
    root-mean-squares ``rms(update sample) / rms(parameter)`` with ``rms = sqrt(mean**2 + std**2)``
    over the finite elements, which estimates the same l2 ratio (``sum(u**2)/n`` is estimated
    without bias by ``sum(u_sample**2)/k``). The derived scalar then carries ``estimated=True``.
    """

    name = "update_ratio"
    _FIELDS = (SpineScalar.L2.value, SpineScalar.MEAN.value, SpineScalar.STD.value)

    def __init__(
        self,
        lower: float = 1e-6,
        upper: float = 1e-1,
        parameter_phase: Phase | str | None = Phase.POST_STEP,
        action: CheckAction | str = CheckAction.WARN,
    ) -> None:
        super().__init__(action)
        self.lower, self.upper = float(lower), float(upper)
        self.parameter_phase = None if parameter_phase is None else Phase(parameter_phase)
        # (step, site) -> role -> field -> event (l2, mean, std of one row)
        self._pending: dict[tuple[int, str | None], dict[str, dict[str, ScalarEvent]]] = {}
        self._done: set[tuple[int, str | None]] = set()  # compared: later fields are ignored

    def evaluate(self, events: Sequence[ObserverEvent]) -> list[Finding | ObserverEvent]:
        """Pair update and parameter norms (across publishes of the same step) and compare."""
        out: list[Finding | ObserverEvent] = []
        streams = frozenset({Stream.UPDATE, Stream.PARAMETER})
        for e in events:
            if (
                not isinstance(e, ScalarEvent)
                or e.source is not EventSource.SPINE
                or e.field is None
                or e.field not in self._FIELDS
                or e.stream not in streams
                or e.micro_batch is not None
            ):
                continue
            role = "update" if e.stream is Stream.UPDATE else "parameter"
            if role == "parameter" and self.parameter_phase not in (None, e.phase):
                continue
            key = (e.optimizer_step, e.site)
            if key in self._done:
                continue
            slot = self._pending.setdefault(key, {})
            fields = slot.setdefault(role, {})
            if e.field in fields:
                continue  # the first row of a role at this step is the one compared
            fields[e.field] = e
            if self._complete(slot):
                del self._pending[key]
                self._done.add(key)
                out.extend(self._compare(slot["update"], slot["parameter"]))
        if events:  # give up on halves of steps older than the previous one
            newest = max(e.optimizer_step for e in events)
            self._done = {k for k in self._done if k[0] >= newest - 1}
            for key in [k for k in self._pending if k[0] < newest - 1]:
                half = self._pending.pop(key)
                if "update" in half:  # an update whose weight norm never came: say so
                    upd = next(iter(half["update"].values()))
                    out.append(self._missing(upd, "parameter_norm_not_observed"))
        return out

    def _complete(self, slot: dict[str, dict[str, ScalarEvent]]) -> bool:
        upd, par = slot.get("update"), slot.get("parameter")
        if upd is None or par is None:
            return False
        need = self._FIELDS if any(e.estimated for e in upd.values()) else self._FIELDS[:1]
        return all(f in upd and f in par for f in need)

    @staticmethod
    def _rms(fields: dict[str, ScalarEvent]) -> float:
        mean, std = fields[SpineScalar.MEAN.value].value, fields[SpineScalar.STD.value].value
        return math.sqrt(mean * mean + std * std)

    # the derived events keep the update row's subject (site, stream update, its phase)
    def _missing(self, upd: ScalarEvent, reason: str) -> UnavailableEvent:
        return UnavailableEvent(
            f"update_ratio/{upd.site}",
            upd.axes,
            reason,
            subject=upd.subject,
            field="update_to_weight_ratio",
            source=EventSource.CHECK,
        )

    def _compare(
        self, upd_fields: dict[str, ScalarEvent], par_fields: dict[str, ScalarEvent]
    ) -> list[Finding | ObserverEvent]:
        upd, par = upd_fields[SpineScalar.L2.value], par_fields[SpineScalar.L2.value]
        estimated = upd.estimated
        name = f"update_ratio/{upd.site}"
        if par.value == 0:
            return [self._missing(upd, "undefined_zero_parameter_norm")]
        if estimated:  # a sample's l2 is not the tensor's: compare per-element rms
            ratio = self._rms(upd_fields) / self._rms(par_fields)
        else:
            ratio = upd.value / par.value
        derived = ScalarEvent(
            name,
            upd.axes,
            ratio,
            subject=upd.subject,
            field="update_to_weight_ratio",
            source=EventSource.CHECK,
            estimated=estimated,
        )
        out: list[Finding | ObserverEvent] = [derived]
        if not self.lower <= ratio <= self.upper:
            side = "above" if ratio > self.upper else "below"
            msg = (
                f"update/weight l2 ratio of {upd.site} is {ratio:.4g}, {side} "
                f"[{self.lower:g}, {self.upper:g}] at step {upd.optimizer_step}"
                + (" (estimated from a sampled update)" if estimated else "")
            )
            out.append(Finding(derived, msg, observed=ratio, lower=self.lower, upper=self.upper))
        return out
