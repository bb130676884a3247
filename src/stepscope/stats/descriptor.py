"""The histogram descriptor: one immutable signed log2 grid, and its exact bin thresholds.

Bin ``k`` of a sign covers magnitudes in ``[2**(lo_exp + k/bpo), 2**(lo_exp + (k+1)/bpo))``. The
window edges ``2**lo_exp`` and ``2**hi_exp`` are exact powers of two, so a value's octave is its
binary exponent; the position inside the octave is decided by comparing the mantissa bits with
integer thresholds computed here *exactly* (integer roots, no floating ``log2``): threshold ``j``
is the smallest mantissa ``m`` with ``1 + m / 2**p >= 2**(j / bpo)``.

Example
-------
>>> d = HistogramDescriptor()
>>> d.n_bins, d.width
(256, 520)
>>> HistogramDescriptor.from_dict(d.to_dict()) == d
True
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.errors import Refusal

#: The special counts that follow the two signed bin blocks in a histogram row, in this order.
SPECIAL_FIELDS: tuple[str, ...] = (
    "zero",
    "underflow_pos",
    "underflow_neg",
    "overflow_pos",
    "overflow_neg",
    "nan",
    "posinf",
    "neginf",
)

ENCODING = "signed_log2_v1"


@dataclass(frozen=True)
class HistogramDescriptor:
    """A universal signed log2 histogram grid.

    Parameters
    ----------
    base
        Must be 2 (the grid is defined on binary exponents).
    bins_per_octave
        Bins per factor of two, 1..64 (OpenTelemetry's scale ``s`` is ``bins_per_octave = 2**s``).
    lo_exp, hi_exp
        The magnitude window ``[2**lo_exp, 2**hi_exp)`` per sign; ``-1022 <= lo_exp < hi_exp <= 1024``.
        Smaller non-zero magnitudes count as underflow, larger finite ones as overflow.
    signed
        Must be True: negative and positive magnitudes have separate bins.
    encoding
        The row layout version, ``"signed_log2_v1"``.
    """

    base: int = 2
    bins_per_octave: int = 4
    lo_exp: int = -48
    hi_exp: int = 16
    signed: bool = True
    encoding: str = ENCODING

    def __post_init__(self) -> None:
        problems = []
        if self.base != 2:
            problems.append(f"base={self.base!r} (only 2 is supported)")
        if not isinstance(self.bins_per_octave, int) or not 1 <= self.bins_per_octave <= 64:
            problems.append(f"bins_per_octave={self.bins_per_octave!r} (an int in 1..64)")
        if not (isinstance(self.lo_exp, int) and isinstance(self.hi_exp, int)):
            problems.append("lo_exp/hi_exp must be ints")
        elif not -1022 <= self.lo_exp < self.hi_exp <= 1024:
            problems.append(
                f"window [{self.lo_exp}, {self.hi_exp}) (need -1022 <= lo < hi <= 1024)"
            )
        if self.signed is not True:
            problems.append("signed must be True")
        if self.encoding != ENCODING:
            problems.append(f"encoding={self.encoding!r} (only {ENCODING!r})")
        if problems:
            raise Refusal(
                "descriptor_invalid",
                "invalid histogram descriptor: " + "; ".join(problems) + ".",
                ["use HistogramDescriptor() defaults or fix the listed fields"],
            )

    @property
    def n_bins(self) -> int:
        """Bins per sign: ``(hi_exp - lo_exp) * bins_per_octave``."""
        return (self.hi_exp - self.lo_exp) * self.bins_per_octave

    @property
    def width(self) -> int:
        """Length of a histogram row: two signed bin blocks plus the special counts."""
        return 2 * self.n_bins + len(SPECIAL_FIELDS)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict; :meth:`from_dict` inverts it."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> HistogramDescriptor:
        """Rebuild a descriptor, refusing ``descriptor_invalid`` on unknown or missing fields."""
        if not isinstance(data, dict):
            raise Refusal(
                "descriptor_invalid", f"descriptor must be a dict, got {type(data).__name__}"
            )
        allowed = set(cls.__dataclass_fields__)
        unknown = set(data) - allowed
        if unknown:
            raise Refusal("descriptor_invalid", f"unknown descriptor fields {sorted(unknown)}")
        return cls(**data)

    @property
    def digest(self) -> str:
        """A short sha256 of the canonical JSON form (travels with every stored histogram)."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def edges(self) -> np.ndarray:
        """Magnitude edges, float64, length ``n_bins + 1``: ``2**(lo_exp + k / bins_per_octave)``.

        Interior edges are rounded to float64 for display; bin *assignment* never uses them.
        """
        k = np.arange(self.n_bins + 1, dtype=np.float64)
        return np.exp2(self.lo_exp + k / self.bins_per_octave)

    def mantissa_thresholds(self, mantissa_bits: int) -> tuple[int, ...]:
        """Exact integer mantissa thresholds for a float format with ``mantissa_bits`` bits.

        Returns ``t_1 .. t_{bpo-1}``: ``t_j`` is the smallest integer ``m`` with
        ``(2**p + m)**bpo >= 2**(p*bpo + j)``, i.e. ``1 + m/2**p >= 2**(j/bpo)`` in real arithmetic.
        """
        return _thresholds(self.bins_per_octave, mantissa_bits)


@functools.lru_cache(maxsize=64)
def _thresholds(bpo: int, p: int) -> tuple[int, ...]:
    out = []
    for j in range(1, bpo):
        target = 1 << (p * bpo + j)
        m = _iroot_ceil(target, bpo)
        out.append(m - (1 << p))
    return tuple(out)


def _iroot_ceil(value: int, k: int) -> int:
    """Smallest integer ``r`` with ``r**k >= value`` (exact, integers only)."""
    lo, hi = 0, 1 << (value.bit_length() // k + 1)
    while lo < hi:
        mid = (lo + hi) // 2
        if mid**k >= value:
            hi = mid
        else:
            lo = mid + 1
    return lo
