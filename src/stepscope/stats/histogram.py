"""The signed log2 histogram: exact counts on one immutable grid, mergeable, never rebinned.

Positive value ``x`` with ``2**(lo + k/bpo) <= x < 2**(lo + (k+1)/bpo)`` counts in ``positive[k]``;
a negative value counts in ``negative[k]`` by its magnitude. Exact zero, per-sign underflow
(``0 < |x| < 2**lo_exp``), per-sign overflow (``|x| >= 2**hi_exp``, finite), NaN, +inf and -inf
are separate exact counts. Bin assignment is exact (see :mod:`stepscope.stats.descriptor`).

Example
-------
>>> import torch
>>> h = Histogram()
>>> h.update(torch.tensor([1.0, 1.5, -3.0, 0.0]))
>>> h.total, h.zero, int(h.positive.sum()), int(h.negative.sum())
(4, 1, 2, 1)
>>> h.quantile(0.5).value  # inverted CDF: the 2nd of the sorted -3, 0, 1, 1.5
0.0
>>> q = h.quantile(0.75)
>>> q.estimated, q.lower <= 1.0 <= q.upper
(True, True)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.stats.descriptor import SPECIAL_FIELDS, HistogramDescriptor
from stepscope.stats.layout import host_array

if TYPE_CHECKING:
    import torch

_F32_MAX = float(np.finfo(np.float32).max)
_F32_TINY = float(np.finfo(np.float32).smallest_subnormal)


@dataclass(frozen=True)
class QuantileEstimate:
    """A quantile read off histogram bins: the true value lies in ``[lower, upper]``.

    ``value`` is the bin's geometric midpoint (0 for the zero bucket, the finite bound for
    under/overflow). ``estimated`` is always True; ``method`` names the rule.
    """

    q: float
    value: float
    lower: float
    upper: float
    estimated: bool = True
    method: str = "inverted_cdf_bin_geometric_midpoint"


class Histogram:
    """Exact signed log2 histogram of a stream of tensors on a fixed descriptor.

    Parameters
    ----------
    descriptor
        The grid (default :class:`HistogramDescriptor()`: 4 bins per octave on ``[2**-48, 2**16)``).
    """

    __slots__ = ("descriptor", "negative", "positive", "specials")

    def __init__(self, descriptor: HistogramDescriptor | None = None) -> None:
        self.descriptor = descriptor or HistogramDescriptor()
        nb = self.descriptor.n_bins
        self.positive = np.zeros(nb, dtype=np.int64)
        self.negative = np.zeros(nb, dtype=np.int64)
        self.specials = dict.fromkeys(SPECIAL_FIELDS, 0)

    # ---- the special counts (see the module docstring)
    @property
    def zero(self) -> int:
        """Elements exactly 0 (either sign)."""
        return self.specials["zero"]

    @property
    def underflow_pos(self) -> int:
        """Elements with ``0 < x < 2**lo_exp``."""
        return self.specials["underflow_pos"]

    @property
    def underflow_neg(self) -> int:
        """Elements with ``-2**lo_exp < x < 0``."""
        return self.specials["underflow_neg"]

    @property
    def overflow_pos(self) -> int:
        """Finite elements with ``x >= 2**hi_exp``."""
        return self.specials["overflow_pos"]

    @property
    def overflow_neg(self) -> int:
        """Finite elements with ``x <= -2**hi_exp``."""
        return self.specials["overflow_neg"]

    @property
    def nan(self) -> int:
        """NaN elements."""
        return self.specials["nan"]

    @property
    def posinf(self) -> int:
        """+inf elements."""
        return self.specials["posinf"]

    @property
    def neginf(self) -> int:
        """-inf elements."""
        return self.specials["neginf"]

    @property
    def total(self) -> int:
        """Every element counted, specials included."""
        return int(self.positive.sum() + self.negative.sum()) + sum(self.specials.values())

    def edges(self) -> np.ndarray:
        """Magnitude edges (float64, ``n_bins + 1``) shared by both signs."""
        return self.descriptor.edges()

    # ---- streaming
    def update(self, tensor: torch.Tensor) -> None:
        """Count every element of ``tensor`` (in place)."""
        # imported here, not above: the value class loads without torch (history decodes into it)
        from stepscope.stats.binning import reduce_histograms  # lazy: binning imports torch

        row = reduce_histograms([tensor], self.descriptor)[0].cpu().numpy()
        self._add_vector(row)

    def _add_vector(self, row: np.ndarray) -> None:
        nb = self.descriptor.n_bins
        self.negative += row[:nb]
        self.positive += row[nb : 2 * nb]
        for i, name in enumerate(SPECIAL_FIELDS):
            self.specials[name] += int(row[2 * nb + i])

    def merge(self, other: Histogram) -> Histogram:
        """A new histogram over both inputs; refuses ``sketch_descriptor_mismatch`` on any difference."""
        if not isinstance(other, Histogram):
            raise Refusal(
                "stat_kind_mismatch", f"cannot merge Histogram with {type(other).__name__}"
            )
        if other.descriptor != self.descriptor:
            raise Refusal(
                "sketch_descriptor_mismatch",
                f"histograms on different grids cannot merge: {self.descriptor} vs {other.descriptor}",
                ["record both runs with the same HistogramDescriptor (there is no rebinning)"],
            )
        out = Histogram(self.descriptor)
        out._add_vector(self.to_vector())
        out._add_vector(other.to_vector())
        return out

    # ---- vectors and dicts
    def to_vector(self) -> np.ndarray:
        """int64 row ``[negative bins, positive bins, SPECIAL_FIELDS...]``."""
        specials = np.array([self.specials[n] for n in SPECIAL_FIELDS], dtype=np.int64)
        return np.concatenate([self.negative, self.positive, specials])

    @classmethod
    def from_vector(
        cls, vec: np.ndarray | torch.Tensor, descriptor: HistogramDescriptor | None = None
    ) -> Histogram:
        """Decode a row from :func:`reduce_histograms` or :meth:`to_vector`."""
        out = cls(descriptor)
        v = host_array(vec)
        if (
            v.shape != (out.descriptor.width,)
            or not np.issubdtype(v.dtype, np.integer)
            or (v < 0).any()
        ):
            raise Refusal(
                "stat_payload_invalid",
                f"histogram row must be {out.descriptor.width} non-negative ints, got {v.shape} {v.dtype}",
            )
        out._add_vector(v.astype(np.int64))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict with the descriptor and sparse ``[bin, count]`` pairs per sign."""

        def sparse(a: np.ndarray) -> list[list[int]]:
            idx = np.flatnonzero(a)
            return [[int(i), int(a[i])] for i in idx]

        return {
            "kind": "histogram",
            "descriptor": self.descriptor.to_dict(),
            "negative": sparse(self.negative),
            "positive": sparse(self.positive),
            **self.specials,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Histogram:
        """Rebuild from :meth:`to_dict` output; refuses ``stat_payload_invalid`` when malformed."""
        if not isinstance(data, dict) or data.get("kind") != "histogram":
            raise Refusal(
                "stat_payload_invalid",
                "not a histogram payload",
                ["pass Histogram.to_dict() output"],
            )
        out = cls(HistogramDescriptor.from_dict(data.get("descriptor")))
        nb = out.descriptor.n_bins
        for sign in ("negative", "positive"):
            arr = getattr(out, sign)
            for pair in data.get(sign, []):
                ok = isinstance(pair, list) and len(pair) == 2 and all(type(v) is int for v in pair)
                if not ok or not 0 <= pair[0] < nb or pair[1] < 0:
                    raise Refusal("stat_payload_invalid", f"bad {sign} bin entry {pair!r}")
                arr[pair[0]] += pair[1]
        for name in SPECIAL_FIELDS:
            value = data.get(name)
            if type(value) is not int or value < 0:
                raise Refusal(
                    "stat_payload_invalid", f"special count {name!r} must be a non-negative int"
                )
            out.specials[name] = value
        return out

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Histogram)
            and other.descriptor == self.descriptor
            and np.array_equal(self.to_vector(), other.to_vector())
        )

    __hash__ = None  # type: ignore[assignment]

    # ---- views
    def buckets(self, include_infinities: bool = False) -> list[tuple[float, float, int]]:
        """Ordered ``(lower, upper, count)`` buckets over the real line, most negative first.

        Finite values only unless ``include_infinities``; NaN is never on the axis.
        """
        e = self.edges()
        d = self.descriptor
        lo, hi = math.ldexp(1.0, d.lo_exp), math.ldexp(1.0, d.hi_exp)
        out: list[tuple[float, float, int]] = []
        if include_infinities:
            out.append((-math.inf, -math.inf, self.specials["neginf"]))
        out.append((-math.inf, -hi, self.specials["overflow_neg"]))
        for k in range(d.n_bins - 1, -1, -1):
            out.append((-float(e[k + 1]), -float(e[k]), int(self.negative[k])))
        out.append((-lo, 0.0, self.specials["underflow_neg"]))
        out.append((0.0, 0.0, self.specials["zero"]))
        out.append((0.0, lo, self.specials["underflow_pos"]))
        for k in range(d.n_bins):
            out.append((float(e[k]), float(e[k + 1]), int(self.positive[k])))
        out.append((hi, math.inf, self.specials["overflow_pos"]))
        if include_infinities:
            out.append((math.inf, math.inf, self.specials["posinf"]))
        return out

    def quantile(self, q: float) -> QuantileEstimate:
        """Estimate the ``q``-quantile of the non-NaN values (infinities included).

        Uses the inverted-CDF definition (the smallest value whose rank reaches ``ceil(q * N)``),
        so the exact quantile of the data lies within the returned ``[lower, upper]`` bin bounds.
        Refuses ``stat_payload_invalid`` for ``q`` outside [0, 1] or an empty histogram.
        """
        if not 0.0 <= q <= 1.0:
            raise Refusal("stat_payload_invalid", f"quantile q must lie in [0, 1], got {q}")
        buckets = self.buckets(include_infinities=True)
        n = sum(c for _, _, c in buckets)
        if n == 0:
            raise Refusal(
                "stat_payload_invalid",
                "quantile of an empty histogram",
                ["update it with data first"],
            )
        rank = max(1, math.ceil(q * n))
        seen, chosen = 0, buckets[-1]
        for bucket in buckets:
            seen += bucket[2]
            if bucket[2] and seen >= rank:
                chosen = bucket
                break
        lower, upper = chosen[0], chosen[1]
        if lower == upper:
            value = lower
        elif lower > 0 and math.isfinite(upper):
            value = math.sqrt(lower * upper)
        elif upper < 0 and math.isfinite(lower):
            value = -math.sqrt(lower * upper)
        else:
            value = lower if math.isfinite(lower) and lower != 0 else upper
        return QuantileEstimate(q=q, value=value, lower=lower, upper=upper)

    def to_tensorboard(self, stats: Any | None = None) -> dict[str, Any]:
        """Keyword arguments for ``SummaryWriter.add_histogram_raw`` (finite values).

        Buckets follow TensorBoard's convention (``bucket_limits[i]`` is bucket i's right edge),
        zero is a zero-width bucket, under/overflow are their own buckets, edges are clamped to
        the float32 range, and empty buckets at both ends are trimmed. With ``stats`` (a
        :class:`~stepscope.stats.RunningStats` of the same data), ``min, max, sum, sum_squares``
        are exact; without it they are bounds/estimates from the bins. NaN and infinities are not
        representable on TensorBoard's axis and are left out (``num`` counts finite values).
        """
        # the negative-underflow bucket ends just below zero so that zero keeps a zero-width bucket
        rows = [
            (lo, -_F32_TINY if (up == 0.0 and lo < 0) else up, c) for lo, up, c in self.buckets()
        ]
        nz = [i for i, (_, _, c) in enumerate(rows) if c]
        if not nz:
            return {
                "min": 0.0,
                "max": 0.0,
                "num": 0,
                "sum": 0.0,
                "sum_squares": 0.0,
                "bucket_limits": [],
                "bucket_counts": [],
            }
        rows = rows[nz[0] : nz[-1] + 1]
        # min/max of Python floats: np.clip per bucket cost ~7 us each, 2 ms per histogram
        limits = [min(max(float(up), -_F32_MAX), _F32_MAX) for _, up, _ in rows]
        counts = [c for _, _, c in rows]
        if stats is not None and stats.finite:
            tb = stats.to_tensorboard()
            limits[-1] = max(limits[-1], float(np.clip(tb["max"], -_F32_MAX, _F32_MAX)))
            return {**tb, "bucket_limits": limits, "bucket_counts": counts}
        mids = [0.0 if lo == up else (self._mid(lo, up)) for lo, up, _ in rows]
        first_lo = rows[0][0]
        return {
            "min": float(np.clip(first_lo, -_F32_MAX, _F32_MAX)),
            "max": limits[-1],
            "num": int(sum(counts)),
            "sum": float(sum(m * c for m, c in zip(mids, counts))),
            "sum_squares": float(sum(m * m * c for m, c in zip(mids, counts))),
            "bucket_limits": limits,
            "bucket_counts": counts,
        }

    @staticmethod
    def _mid(lo: float, up: float) -> float:
        if not (math.isfinite(lo) and math.isfinite(up)):
            return float(np.clip(lo if math.isfinite(lo) else up, -_F32_MAX, _F32_MAX))
        if lo * up > 0:
            return math.copysign(math.sqrt(lo * up), lo)
        return (lo + up) / 2

    def __repr__(self) -> str:
        return f"Histogram(total={self.total}, descriptor={self.descriptor})"
