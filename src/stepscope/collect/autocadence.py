"""``cadence="auto"``: measure what each stream costs, then choose cadences under a budget.

During the first ``warmup`` steps the collector follows a fixed pattern of period 4 (step ``s``):
``s % 4 == 0`` spines and histograms of every stream, ``1`` and ``2`` spines only, ``3`` nothing
due, and times each stream's reductions, the shared per-step work (the host copy, the step block
and its write, the commit, events) and the training step itself (the transaction body minus the
telemetry and the hooks inside it). A :class:`WarmupMeter` turns those into what the steady state pays:

- ``F``: the fixed seconds every step pays even with nothing due (step block, write, clock;
  the hooks' own Python, timed inside them, plus torch's dispatch per hook call, measured once
  on a private module; one commit, timed at the last warm-up step and spread over the steps
  between commits: ``commit_steps`` or ``commit_seconds`` of steps, whichever is fewer),
- ``S``: the extra shared seconds of a step on which spines are due,
- ``c_s``: stream ``s``'s spine seconds, ``H_s``: the extra seconds of its histograms (plus its
  share of the histogram step's larger copy and write),
- ``T``: the training seconds of a step (median).

It then picks, per stream, the densest cadence whose share of the budget holds:

.. math::
    k_s = \\left\\lceil \\frac{c_s + S/n + H_s / h}{(\\tau T - F) / n} \\right\\rceil,
    \\qquad \\text{expected overhead} = \\frac{F + \\sum_s (c_s + S/n + H_s/h) / k_s}{T}

with ``n`` streams, ``tau`` the target fraction and histograms every ``h * k_s`` steps. Costs
are means (a steady state pays the mean, commit spikes included), training time the median.
Without measured histogram costs the rule assumes ``H_s = rho (c_s + S/n)`` with ``rho`` =
:data:`HISTOGRAM_COST_FACTOR`. The decision, its inputs and the expected overhead are recorded;
precision is never changed.

Example
-------
>>> d = choose_stream_cadences({"a": [0.001], "b": [0.003]}, [0.0], [0.1], target=0.05)
>>> d.cadences["a"].spine, d.cadences["b"].spine, round(d.expected_overhead, 4)
(1, 2, 0.0325)
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepscope.budget import densest_cadence
from stepscope.collect.settings import Cadence
from stepscope.errors import Refusal

HISTOGRAM_COST_FACTOR = 3.0


@dataclass(frozen=True)
class AutoCadence:
    """Ask the collector to choose its cadences by measurement.

    Parameters
    ----------
    target
        Telemetry budget as a fraction of the training time (0.05 = 5%).
    warmup
        Steps measured with every spine on before deciding (>= 2).
    histogram_factor
        Histograms every ``histogram_factor`` x the chosen spine cadence.
    """

    target: float = 0.05
    warmup: int = 20
    histogram_factor: int = 10

    def __post_init__(self) -> None:
        if not (0 < self.target < 1) or self.warmup < 2 or self.histogram_factor < 1:
            raise Refusal(
                "cadence_invalid",
                f"AutoCadence needs 0 < target < 1, warmup >= 2, histogram_factor >= 1: {self}",
                ["use AutoCadence(target=0.05, warmup=20, histogram_factor=10)"],
            )

    def warmup_cadence(self) -> Cadence:
        """The measuring pattern: histograms at ``s % 4 == 0``, spines at 1 and 2, nothing at 3."""
        return Cadence(_warmup_spine, _warmup_histogram)


def _warmup_spine(step: int) -> bool:
    return step % 4 != 3


def _warmup_histogram(step: int) -> bool:
    return step % 4 == 0


#: Cap on a chosen cadence.
MAX_CADENCE = 10_000


@dataclass(frozen=True)
class CadenceChoice:
    """The chosen cadences and what they were chosen from (JSON-safe via :meth:`to_dict`)."""

    cadences: dict[str, Cadence]
    expected_overhead: float | None
    target: float
    training_seconds_median: float
    stream_seconds_median: dict[str, float]
    shared_seconds_median: float
    rule: str
    fixed_seconds: float = 0.0
    histogram_seconds: dict[str, float] | None = None
    measurements: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "cadences": {s: c.describe() for s, c in self.cadences.items()},
            "expected_overhead": self.expected_overhead,
            "target": self.target,
            "training_seconds_median": self.training_seconds_median,
            "stream_seconds_median": self.stream_seconds_median,
            "shared_seconds_median": self.shared_seconds_median,
            "rule": self.rule,
            "fixed_seconds": self.fixed_seconds,
            "histogram_seconds": self.histogram_seconds,
            "histogram_cost_factor": None if self.histogram_seconds else HISTOGRAM_COST_FACTOR,
        }


def _mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def choose_stream_cadences(
    stream_seconds: Mapping[str, Sequence[float]],
    shared_seconds: Sequence[float],
    training_seconds: Sequence[float],
    target: float = 0.05,
    histogram_factor: int = 10,
    *,
    histogram_seconds: Mapping[str, Sequence[float]] | None = None,
    fixed_seconds: Sequence[float] = (),
) -> CadenceChoice:
    """The densest per-stream cadences whose expected telemetry stays within ``target`` (pure).

    Parameters
    ----------
    stream_seconds
        Per stream, its spine seconds on measured logged steps (``c_s``: the mean is used).
    shared_seconds
        Extra shared seconds of a logged step (``S``), beyond the fixed cost.
    training_seconds
        Training seconds per step (``T``: the median is used).
    target, histogram_factor
        Budget fraction ``tau`` and ``h``.
    histogram_seconds
        Per stream, the extra seconds its histograms add to a step (``H_s``); default
        ``rho (c_s + S/n)`` with ``rho`` = :data:`HISTOGRAM_COST_FACTOR`.
    fixed_seconds
        Seconds every step pays with nothing due (``F``); default 0.

    Returns
    -------
    CadenceChoice
        With no usable training time (all zero) every stream keeps cadence 1 and the rule says
        so; when ``F`` alone exceeds the budget the streams share ``tau T`` as if ``F`` were free
        (rule ``fixed_cost_exceeds_budget``; the expected overhead then exceeds the target).
    """
    streams = list(stream_seconds)
    if not streams:
        raise Refusal("cadence_invalid", "no stream was measured", ["watch at least one stream"])
    mean = {s: _mean(v) for s, v in stream_seconds.items()}
    shared = _mean(shared_seconds)
    fixed = _mean(fixed_seconds)
    train = statistics.median(training_seconds) if training_seconds else 0.0
    n = len(streams)
    if train <= 0:
        cad = {s: Cadence(1, histogram_factor) for s in streams}
        return CadenceChoice(cad, None, target, train, mean, shared, "no_training_time_measured")
    if histogram_seconds is None:
        hist = {s: HISTOGRAM_COST_FACTOR * (mean[s] + shared / n) for s in streams}
    else:
        hist = {s: _mean(histogram_seconds.get(s, ())) for s in streams}
    budget = (target * train - fixed) / n
    rule = "equal_share_per_stream"
    if budget <= 0:  # no cadence can keep the promise: share the budget as if F were free, say so
        budget, rule = target * train / n, "fixed_cost_exceeds_budget"
    cadences, expected = {}, fixed
    for s in streams:
        cost = mean[s] + shared / n + hist[s] / histogram_factor
        k = min(MAX_CADENCE, densest_cadence(cost, budget))
        cadences[s] = Cadence(k, histogram_factor * k)
        expected += cost / k
    return CadenceChoice(
        cadences,
        expected / train,
        target,
        train,
        mean,
        shared,
        rule,
        fixed_seconds=fixed,
        histogram_seconds=None if histogram_seconds is None else hist,
    )
