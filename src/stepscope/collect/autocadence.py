"""``cadence="auto"``: measure what each stream costs, then choose cadences under a budget.

For the first ``warmup`` steps every watched stream takes its spine every step (no histograms)
while the collector times each stream's reductions, its shared per-step work (the host copy, the
write) and the training step itself. It then picks, per stream, the densest spine cadence whose
share of the budget holds:

.. math::
    k_s = \\left\\lceil \\frac{(c_s + c_{shared}/n)\\,(1 + \\rho / h)}{\\tau\\, T / n} \\right\\rceil

with ``c_s`` the median seconds of stream ``s`` per logged step, ``T`` the median training
seconds per step, ``n`` the number of streams, ``tau`` the target fraction, ``h`` the histogram
factor (histograms every ``h * k_s`` steps) and ``rho`` the assumed cost of a histogram relative to
a spine (3, measured by ``benchmarks/kernels.py``: the histogram kernel is 1.3–1.5x the spine
kernel, plus its larger host copy and write). The decision, its inputs and the expected overhead
are recorded; precision is never changed.

Example
-------
>>> d = choose_stream_cadences({"a": [0.001], "b": [0.003]}, [0.0], [0.1], target=0.05)
>>> d.cadences["a"].spine, d.cadences["b"].spine, round(d.expected_overhead, 4)
(1, 2, 0.0325)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
        """Every step, spines only, while measuring."""
        return Cadence(1, None)


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
            "histogram_cost_factor": HISTOGRAM_COST_FACTOR,
        }


def choose_stream_cadences(
    stream_seconds: Mapping[str, Sequence[float]],
    shared_seconds: Sequence[float],
    training_seconds: Sequence[float],
    target: float = 0.05,
    histogram_factor: int = 10,
) -> CadenceChoice:
    """The densest per-stream cadences whose expected telemetry stays within ``target`` (pure).

    Returns a :class:`CadenceChoice`; with no usable training time (all zero) every stream keeps
    cadence 1 and the rule says so.
    """
    streams = list(stream_seconds)
    if not streams:
        raise Refusal("cadence_invalid", "no stream was measured", ["watch at least one stream"])
    med = {s: statistics.median(v) if v else 0.0 for s, v in stream_seconds.items()}
    shared = statistics.median(shared_seconds) if shared_seconds else 0.0
    train = statistics.median(training_seconds) if training_seconds else 0.0
    n = len(streams)
    if train <= 0:
        cad = {s: Cadence(1, histogram_factor) for s in streams}
        return CadenceChoice(cad, None, target, train, med, shared, "no_training_time_measured")
    budget = target * train / n
    scale = 1 + HISTOGRAM_COST_FACTOR / histogram_factor
    cadences, expected = {}, 0.0
    for s in streams:
        cost = (med[s] + shared / n) * scale
        k = max(1, math.ceil(cost / budget - 1e-12))
        cadences[s] = Cadence(k, histogram_factor * k)
        expected += cost / k
    return CadenceChoice(
        cadences, expected / train, target, train, med, shared, "equal_share_per_stream"
    )
