"""The payloads of histogram and verdict events, and their JSON form.

* :class:`HistogramPayload` — a site row's exact signed log2 counts with the spine row of the
  same data and the descriptor (read-only arrays); JSON keeps the non-zero counts as sparse
  ``[index, count]`` pairs.
* :class:`Verdict` — a check's finding: the check, its action, the message, the observed value
  and the band.
Non-finite floats are written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` by the one
codec, :func:`stepscope.codec.json_float` (JSON has no such numbers).

Example
-------
>>> v = Verdict("nonfinite", "warn", "NaN in fc1", observed=float("inf"), upper=0.0)
>>> v.to_dict()["observed"], Verdict.from_dict(v.to_dict()) == v
('inf', True)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.codec import float_from_json, json_float
from stepscope.errors import Refusal
from stepscope.stats import (
    SPINE_FIELDS,
    SPINE_WIDTH,
    Histogram,
    HistogramDescriptor,
    RunningStats,
)

__all__ = ["HistogramPayload", "Verdict"]


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

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the descriptor, sparse ``[index, count]`` pairs and the named spine."""
        c = self.counts
        return {
            "descriptor": self.descriptor.to_dict(),
            "counts": [[int(i), int(c[i])] for i in np.flatnonzero(c)],
            "spine": {f: json_float(float(v)) for f, v in zip(SPINE_FIELDS, self.spine.tolist())},
        }

    @classmethod
    def from_dict(cls, h: Mapping[str, Any]) -> HistogramPayload:
        """Inverse of :meth:`to_dict`."""
        desc = HistogramDescriptor.from_dict(h["descriptor"])
        counts = np.zeros(desc.width, dtype=np.int64)
        for i, c in h["counts"]:
            counts[int(i)] = int(c)
        spine = [float_from_json(h["spine"][f]) for f in SPINE_FIELDS]
        return cls(counts, np.array(spine, dtype=np.float64), desc)

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
            "observed": json_float(self.observed),
            "lower": json_float(self.lower),
            "upper": json_float(self.upper),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        """Inverse of :meth:`to_dict`."""
        return cls(
            str(d["check"]),
            str(d["action"]),
            str(d["message"]),
            float_from_json(d.get("observed")),
            float_from_json(d.get("lower")),
            float_from_json(d.get("upper")),
        )
