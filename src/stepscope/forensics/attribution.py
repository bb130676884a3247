"""Attribution: which layers left their own trailing range first, before a trigger.

For a trigger at step ``t`` and its saved window, every per-site channel (a field of a layer:
``grad_rms``, ``update_rms``, ``update_ratio``, ``param_rms``, ``act_absmax``) is scanned over
the ``lookback`` steps up to ``t``. At each step ``s`` it is compared with its *own* trailing
range, the robust z-score (:func:`~stepscope.forensics.detector.robust_z`, log scale) of its
value against its ``trailing`` finite values before ``s``; it *leaves its range* at the first
``s`` where ``z > threshold`` (upward, like the triggers: a layer that grew, never one that
quietened). Channels that left are ranked by that step (earliest first), then by ``z``; a layer (site) takes its earliest channel. Run-wide channels
(loss, total gradient norm) are not layers and are not ranked.

>>> import numpy as np
>>> from stepscope.forensics.channels import Channel
>>> chans = [Channel("a", "update", "update_rms"), Channel("b", "update", "update_rms")]
>>> rng = np.random.default_rng(0)
>>> vals = np.exp(rng.normal(0, 0.1, (40, 2)))
>>> vals[30, 0] *= 100; vals[31:, 1] *= 50
>>> [m.site for m in first_movers(np.arange(40), vals, np.ones((40, 2), bool), chans, 31)]
['a', 'b']
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.codec import json_float
from stepscope.errors import Refusal
from stepscope.forensics.archive import ForensicsFiles, WindowRows
from stepscope.forensics.channels import LOG_FIELDS, RUN_SITE, Channel
from stepscope.forensics.detector import Crossing, robust_z

__all__ = ["Mover", "Spike", "first_movers", "read_spikes", "spike_from_row"]


@dataclass(frozen=True)
class Mover:
    """A layer that left its trailing range: ``field`` of ``site`` at ``step`` (``z`` there)."""

    site: str
    field: str
    step: int
    z: float
    value: float
    center: float  # its trailing median (same units as ``value``)

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "field": self.field,
            "step": self.step,
            "z": json_float(self.z),
            "value": json_float(self.value),
            "center": json_float(self.center),
        }


@dataclass(frozen=True)
class Spike:
    """One trigger of a run, with the layers that moved first.

    ``step`` is the step the trigger fired at, ``crossings`` what crossed there (empty on a rank
    that went dense because another rank fired: ``agreed``), ``first`` the ranked layers,
    ``window_steps`` the saved rows' step range, ``dense_from``/``dense_to`` the dense cadence
    that followed and ``reason`` its reason.
    """

    step: int
    rank: int
    crossings: tuple[Crossing, ...]
    first: tuple[Mover, ...]
    window_steps: tuple[int, int]
    dense_from: int | None
    dense_to: int | None
    reason: str
    agreed: bool = False
    window: WindowRows | None = field(default=None, repr=False, compare=False)
    channels: tuple[Channel, ...] = field(default=(), repr=False, compare=False)

    def column(self, site: str, field: str) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of one channel of the saved window (NaN where not observed)."""
        if self.window is None:
            raise Refusal("selection_empty", f"the spike at step {self.step} has no window.")
        for j, c in enumerate(self.channels):
            if c.site == site and c.field == field:
                v = np.where(self.window.present[:, j], self.window.values[:, j], np.nan)
                return self.window.steps.copy(), v
        labels = sorted({c.field for c in self.channels if c.site == site})
        raise Refusal(
            "selection_empty",
            f"no channel {site}/{field} in the spike's window.",
            [f"fields of {site!r}: {labels}" if labels else "see Spike.channels for the sites"],
        )

    @property
    def triggers(self) -> list[str]:
        """The names of the triggers that fired (``crossings``' triggers, in order)."""
        return list(dict.fromkeys(c.trigger for c in self.crossings))

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rank": self.rank,
            "triggers": self.triggers,
            "reason": self.reason,
            "agreed": self.agreed,
            "crossings": [c.to_dict() for c in self.crossings],
            "first": [m.to_dict() for m in self.first],
            "window_steps": list(self.window_steps),
            "dense_from": self.dense_from,
            "dense_to": self.dense_to,
        }


def first_movers(
    steps: np.ndarray,
    values: np.ndarray,
    present: np.ndarray,
    channels: Sequence[Channel],
    trigger_step: int,
    lookback: int = 16,
    trailing: int = 32,
    threshold: float = 6.0,
    min_history: int = 8,
) -> list[Mover]:
    """Layers ranked by the step they left their own range (see the module docstring)."""
    best: dict[str, Mover] = {}
    scan = np.flatnonzero((steps <= trigger_step) & (steps > trigger_step - lookback - 1))
    for j, ch in enumerate(channels):
        if ch.site == RUN_SITE:
            continue
        log = ch.field in LOG_FIELDS
        ok = present[:, j] & np.isfinite(values[:, j])
        if log:
            ok &= values[:, j] > 0
        for i in scan:
            if not ok[i]:
                continue
            before = np.flatnonzero(ok[:i])[-trailing:]
            if len(before) < min_history:
                continue
            x = float(values[i, j])
            z, center, _ = robust_z(values[before, j], x, log)
            if z > threshold:
                m = Mover(
                    ch.site, ch.field, int(steps[i]), z, x, math.exp(center) if log else center
                )
                cur = best.get(ch.site)
                if cur is None or (m.step, -abs(m.z)) < (cur.step, -abs(cur.z)):
                    best[ch.site] = m
                break
    return sorted(best.values(), key=lambda m: (m.step, -abs(m.z)))


def spike_from_row(
    row: Mapping[str, Any],
    steps: np.ndarray,
    values: np.ndarray,
    present: np.ndarray,
    channels: Sequence[Channel],
    lookback: int,
) -> Spike:
    """The :class:`Spike` of a trigger row and its window (attribution computed here)."""
    step = int(row["step"])
    dense = row.get("dense") or {}
    movers = first_movers(steps, values, present, channels, step, lookback=lookback)
    lo, hi = (int(steps[0]), int(steps[-1])) if len(steps) else (step, step)
    return Spike(
        step=step,
        rank=int(row.get("rank", 0)),
        crossings=tuple(Crossing.from_dict(c) for c in row.get("crossings", [])),
        first=tuple(movers),
        window_steps=(lo, hi),
        dense_from=dense.get("from_step"),
        dense_to=dense.get("to_step"),
        reason=str(dense.get("reason", "")),
        agreed=bool(row.get("agreed", False)),
        window=WindowRows(steps, values, present),
        channels=tuple(channels),
    )


def read_spikes(run_dir: str | os.PathLike[str]) -> list[Spike]:
    """The triggers of one artifact directory, with attribution (``[]``: no flight recorder,
    or none fired). Each window is checked against its sha256 first."""
    files = ForensicsFiles(run_dir)
    if not files.exists():
        return []
    channels, meta = files.channels()
    lookback = int((meta.get("recorder") or {}).get("lookback", 16))
    out = []
    for row in files.triggers():
        w = files.window(row, len(channels))
        out.append(spike_from_row(row, w.steps, w.values, w.present, channels, lookback))
    return out
