"""Triggers: when a step's readings leave their own trailing range, or turn non-finite.

Each trigger reads one step's :class:`StepReading` and the window's rows before it, and returns
the :class:`Crossing` s it saw (empty: nothing). The spike tests are *robust z-scores* over a
trailing window of the same channel's earlier, finite values:

.. math::  z = \\frac{x - \\operatorname{median}(h)}{\\max(1.4826\\,\\operatorname{MAD}(h),\\ s_{min})}

(``MAD`` the median absolute deviation, ``1.4826 MAD`` the standard deviation of a normal
sample). Losses are compared as they are (``s_min`` 1% of the median), magnitudes (gradient norm,
update ratio) on a natural-log scale (``s_min`` 0.05, i.e. a 5% change is never more than one
unit). Only upward crossings fire: a falling loss or a shrinking update is not a spike.

* :class:`LossSpike` — the logged loss (``z > threshold``);
* :class:`GradNormSpike` — the total gradient norm;
* :class:`UpdateRatioSpike` — any parameter's ``update_ratio`` (per site, each its own range);
* :class:`NonFinite` — any observed value that is NaN or infinite (loss, gradients, updates,
  parameters, activations);
* :class:`Predicate` — your own ``fn(reading) -> bool``.

>>> import numpy as np
>>> robust_z(np.array([1.0, 1.1, 0.9, 1.0, 1.05]), 2.0, log=False)[0] > 6
True
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from stepscope.codec import float_from_json, json_float
from stepscope.errors import Refusal
from stepscope.forensics.channels import RUN_SITE, Channel

__all__ = [
    "Crossing",
    "GradNormSpike",
    "LossSpike",
    "NonFinite",
    "Predicate",
    "StepReading",
    "Trigger",
    "check_triggers",
    "default_triggers",
    "robust_z",
]

#: Smallest robust scale: relative to the median for a loss, in nats for log-scale magnitudes.
MIN_SCALE_LINEAR, MIN_SCALE_LOG = 0.01, 0.05


@dataclass(frozen=True)
class StepReading:
    """One step's recorder readings, as triggers (and a :class:`Predicate`) see them."""

    step: int
    channels: Sequence[Channel]
    values: np.ndarray  # float64, one per channel
    present: np.ndarray  # bool: observed this step
    scalars: Mapping[str, float] = field(default_factory=dict)  # the user's logged scalars

    def get(self, site: str, field: str) -> float | None:
        """The value of ``field`` of ``site`` this step (``None``: not observed)."""
        for i, c in enumerate(self.channels):
            if c.site == site and c.field == field:
                return float(self.values[i]) if self.present[i] else None
        return None

    @property
    def loss(self) -> float | None:
        return self.get(RUN_SITE, "loss")


@dataclass(frozen=True)
class Crossing:
    """What crossed: ``channel`` (a label ``site/field``) had ``value`` beyond ``limit``."""

    trigger: str
    channel: str
    value: float
    center: float | None = None  # the trailing median
    limit: float | None = None  # the bound it crossed (``None``: non-finite or a predicate)
    z: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "trigger": self.trigger,
            "channel": self.channel,
            "value": json_float(self.value),
            "center": json_float(self.center),
            "limit": json_float(self.limit),
            "z": json_float(self.z),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Crossing:
        value = float_from_json(d.get("value"))
        return cls(
            str(d["trigger"]),
            str(d["channel"]),
            math.nan if value is None else value,
            float_from_json(d.get("center")),
            float_from_json(d.get("limit")),
            float_from_json(d.get("z")),
        )


def robust_z(history: np.ndarray, x: float, log: bool) -> tuple[float, float, float]:
    """``(z, center, scale)`` of ``x`` against ``history`` (finite values; see the module)."""
    h = np.log(history) if log else history
    v = math.log(x) if log else x
    center = float(np.median(h))
    mad = float(np.median(np.abs(h - center)))
    floor = MIN_SCALE_LOG if log else MIN_SCALE_LINEAR * abs(center) + 1e-12
    scale = max(1.4826 * mad, floor)
    return (v - center) / scale, center, scale


class Trigger:
    """Base of the triggers: :meth:`check` one step against the rows before it."""

    name: ClassVar[str] = "trigger"

    def check(
        self, reading: StepReading, values: np.ndarray, present: np.ndarray
    ) -> list[Crossing]:
        """Crossings of ``reading`` (``values``/``present``: the window's earlier rows)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        return {"trigger": self.name}


class _Spike(Trigger):
    """A robust z-score test of some channels against their own trailing values."""

    log: ClassVar[bool] = True

    def __init__(self, threshold: float = 6.0, trailing: int = 64, min_history: int = 16) -> None:
        bad = []
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            bad.append(f"threshold={threshold!r} is not a number")
        elif not 0 < threshold < math.inf:
            bad.append(f"threshold={threshold!r} must be finite and > 0")
        for n, v in (("trailing", trailing), ("min_history", min_history)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                bad.append(f"{n}={v!r} must be an int >= 2")
        if not bad and min_history > trailing:
            bad.append(f"min_history={min_history} exceeds trailing={trailing}")
        if bad:
            raise Refusal(
                "settings_invalid",
                f"{type(self).__name__}: " + "; ".join(bad) + ".",
                [f"e.g. {type(self).__name__}(threshold=6.0, trailing=64, min_history=16)"],
            )
        self.threshold, self.trailing, self.min_history = float(threshold), trailing, min_history

    def columns(self, reading: StepReading) -> list[int]:
        raise NotImplementedError

    def check(
        self, reading: StepReading, values: np.ndarray, present: np.ndarray
    ) -> list[Crossing]:
        cols = np.asarray(self.columns(reading), dtype=np.int64)
        if not len(cols):
            return []
        x = reading.values[cols]
        ok_x = reading.present[cols] & np.isfinite(x) & ((x > 0) if self.log else True)
        h = values[-self.trailing :, cols]
        ok = present[-self.trailing :, cols] & np.isfinite(h) & ((h > 0) if self.log else True)
        test = ok_x & (ok.sum(axis=0) >= self.min_history)
        if not test.any():
            return []
        cols, x, h, ok = cols[test], x[test], h[:, test], ok[:, test]
        with np.errstate(divide="ignore", invalid="ignore"):
            hh = np.where(ok, np.log(h) if self.log else h, np.nan)
            v = np.log(x) if self.log else x
        # every column at once: the same numbers as robust_z() column by column
        center, mad = _median_mad(hh, ok)
        floor = MIN_SCALE_LOG if self.log else MIN_SCALE_LINEAR * np.abs(center) + 1e-12
        scale = np.maximum(1.4826 * mad, floor)
        z = (v - center) / scale
        out = []
        back = np.exp if self.log else (lambda a: a)
        for k in np.flatnonzero(z > self.threshold):
            limit = center[k] + self.threshold * scale[k]
            out.append(
                Crossing(
                    self.name,
                    reading.channels[int(cols[k])].label,
                    float(x[k]),
                    float(back(center[k])),
                    float(back(limit)),
                    float(z[k]),
                )
            )
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "trigger": self.name,
            "threshold": self.threshold,
            "trailing": self.trailing,
            "min_history": self.min_history,
        }


def _median_mad(h: np.ndarray, ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per column of ``h``: the median and the median absolute deviation of its ``ok`` values
    (``np.median`` where a column is complete; ``np.nanmedian``, ~10x slower, elsewhere)."""
    full = ok.all(axis=0)
    center, mad = np.empty(h.shape[1]), np.empty(h.shape[1])
    for cols, median in ((full, np.median), (~full, np.nanmedian)):
        if cols.any():
            part = h[:, cols]
            c = median(part, axis=0)
            center[cols], mad[cols] = c, median(np.abs(part - c), axis=0)
    return center, mad


_COLUMN_CACHE: dict[tuple[int, str | None, str], tuple[Sequence[Channel], list[int]]] = {}


def _columns(reading: StepReading, site: str | None, field: str) -> list[int]:
    """Indices of the channels of ``field`` (of ``site``; any site for ``None``), cached per
    channel list (a recorder's list is fixed for its run)."""
    key = (id(reading.channels), site, field)
    hit = _COLUMN_CACHE.get(key)
    if hit is not None and hit[0] is reading.channels:
        return hit[1]
    cols = [
        i
        for i, c in enumerate(reading.channels)
        if c.field == field and (site is None or c.site == site)
    ]
    if len(_COLUMN_CACHE) > 64:  # recorders of finished runs
        _COLUMN_CACHE.clear()
    _COLUMN_CACHE[key] = (reading.channels, cols)
    return cols


class LossSpike(_Spike):
    """The logged loss jumps: robust ``z > threshold`` over its ``trailing`` earlier values.

    The loss is the first of ``key`` the step logged (``collector.log("loss", loss)``; the
    Lightning callback logs ``train/loss``).
    """

    name = "loss_spike"
    log = False

    def __init__(
        self,
        threshold: float = 6.0,
        key: str | Sequence[str] = ("loss", "train/loss"),
        trailing: int = 64,
        min_history: int = 16,
    ) -> None:
        super().__init__(threshold, trailing, min_history)
        keys = (key,) if isinstance(key, str) else tuple(key)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise Refusal(
                "settings_invalid",
                f"LossSpike(key={key!r}) must name the logged loss scalar(s).",
                ['LossSpike(key="loss")'],
            )
        self.keys = keys

    def columns(self, reading: StepReading) -> list[int]:
        return _columns(reading, RUN_SITE, "loss")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "key": list(self.keys)}


class GradNormSpike(_Spike):
    """The total gradient norm jumps (log scale, its own trailing range)."""

    name = "grad_norm_spike"

    def columns(self, reading: StepReading) -> list[int]:
        return _columns(reading, RUN_SITE, "grad_norm")


class UpdateRatioSpike(_Spike):
    """Some parameter's update/parameter ratio jumps (log scale, each site its own range)."""

    name = "update_ratio_spike"

    def columns(self, reading: StepReading) -> list[int]:
        return _columns(reading, None, "update_ratio")


class NonFinite(Trigger):
    """Any observed value of the step is NaN or infinite (an update ratio of a zero parameter
    is never observed, so it cannot fire)."""

    name = "non_finite"

    def check(
        self, reading: StepReading, values: np.ndarray, present: np.ndarray
    ) -> list[Crossing]:
        bad = np.flatnonzero(reading.present & ~np.isfinite(reading.values))
        return [
            Crossing(self.name, reading.channels[int(j)].label, float(reading.values[j]))
            for j in bad
        ]


class Predicate(Trigger):
    """Your own trigger: ``fn(reading) -> bool`` (``reading`` a :class:`StepReading`).

    >>> Predicate(lambda r: r.step == 3, name="step3").name
    'step3'
    """

    def __init__(self, fn: Callable[[StepReading], bool], name: str = "predicate") -> None:
        if not callable(fn):
            raise Refusal(
                "settings_invalid",
                f"Predicate needs a callable, not {type(fn).__name__}.",
                ["Predicate(lambda reading: reading.loss is not None and reading.loss > 10)"],
            )
        self.fn = fn
        self.name = name  # type: ignore[misc]  # an instance's own name

    def check(
        self, reading: StepReading, values: np.ndarray, present: np.ndarray
    ) -> list[Crossing]:
        if not self.fn(reading):
            return []
        loss = reading.loss
        return [Crossing(self.name, self.name, math.nan if loss is None else loss)]


def default_triggers() -> tuple[Trigger, ...]:
    """Loss spike, non-finite, gradient-norm spike and update-ratio spike (threshold 6)."""
    return (LossSpike(), NonFinite(), GradNormSpike(), UpdateRatioSpike())


def check_triggers(
    triggers: Sequence[Trigger],
    reading: StepReading,
    values: np.ndarray,
    present: np.ndarray,
    failed: set[str],
) -> list[Crossing]:
    """Every trigger's crossings; a trigger that raises is warned about once and skipped from
    then on (its name joins ``failed``): a trigger never breaks the training step."""
    out: list[Crossing] = []
    for t in triggers:
        if t.name in failed:
            continue
        try:
            out += t.check(reading, values, present)
        except Exception as e:
            failed.add(t.name)
            warnings.warn(
                f"stepscope: flight recorder trigger {t.name!r} raised {type(e).__name__}: {e}; "
                "it is off for the rest of the run.",
                RuntimeWarning,
                stacklevel=2,
            )
    return out
