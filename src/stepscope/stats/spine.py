"""The scalar spine: exact counts and stable-merge moments of a stream of tensors.

Definitions (over all elements seen so far):

- ``total``: number of elements; ``finite``: not NaN and not +/-inf; ``zero``: exactly 0 (either
  sign); ``negative``: finite and < 0; ``nan``, ``posinf``, ``neginf``: the specials.
  ``total == finite + nan + posinf + neginf``. All exact Python ints.
- Over finite values only: ``min``, ``max``, ``absmax`` (exact; an int64 extreme that float64
  cannot hold, above 2**53, is kept as a Python int), ``sum``, ``sum_squares``,
  ``sum_abs`` (float64 accumulations), ``mean`` and ``m2 = sum((x - mean)**2)`` (merged with Chan's
  pairwise formulas), ``var = m2 / finite`` (population variance). Each is ``None`` when no
  finite value has been seen — never 0 (sums of nothing are exactly 0.0).

Accumulation is float64 whatever the input dtype. Float64 inputs with magnitudes above ~1e154
overflow the squared sums to ``inf`` and ``m2`` to NaN; that is reported as is, never clamped.

Example
-------
>>> import torch
>>> s = RunningStats()
>>> s.update(torch.tensor([1.0, 2.0, float("inf")]))
>>> s.total, s.finite, s.posinf, s.mean, s.max
(3, 2, 1, 1.5, 2.0)
>>> RunningStats.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from stepscope.codec import float_from_json, json_float
from stepscope.errors import Refusal
from stepscope.stats.layout import (
    COUNT_FIELDS,
    FLOAT_FIELDS,
    REDUCTION_DTYPE,
    SPINE_FIELDS,
    SPINE_WIDTH,
    SUM_FIELDS,
    host_array,
    merge_spine_rows,
)

if TYPE_CHECKING:
    import torch

__all__ = ["RunningStats"]


def _exact(value: int) -> int | float:
    """``value`` as a float when float64 holds it exactly, else the exact int (int64 extremes)."""
    return float(value) if float(value) == value else value


def _dec(value: Any, name: str) -> float | None:
    if value is None or isinstance(value, str | bool) or not isinstance(value, int):
        return float_from_json(value, name, "stat_payload_invalid")
    if not -(2**63) <= value <= 2**63:
        raise Refusal("stat_payload_invalid", f"field {name!r} is out of range: {value}")
    if name in ("min", "max", "absmax"):
        return _exact(value)  # integer extremes beyond float64 stay exact
    return float(value)


class RunningStats:
    """Exact streaming spine of tensors (see module docstring for every field's definition).

    ``update`` reduces on the tensor's device (fused C kernel on the CPU) and reads back one row;
    ``merge`` combines two spines exactly for counts and with Chan's formulas for moments.
    Consumes no RNG and never changes the tensor.
    """

    __slots__ = ("_c", "_f", "reduction_dtype")

    def __init__(self) -> None:
        self._c = dict.fromkeys(COUNT_FIELDS, 0)
        self._f: dict[str, float | None] = dict.fromkeys(FLOAT_FIELDS, None)
        for name in SUM_FIELDS:
            self._f[name] = 0.0
        self.reduction_dtype = REDUCTION_DTYPE

    # ---- fields (definitions in the module docstring)
    @property
    def total(self) -> int:
        """Number of elements."""
        return self._c["total"]

    @property
    def finite(self) -> int:
        """Number of finite elements (not NaN, not +/-inf)."""
        return self._c["finite"]

    @property
    def zero(self) -> int:
        """Number of elements exactly 0 (either sign)."""
        return self._c["zero"]

    @property
    def negative(self) -> int:
        """Number of finite elements < 0."""
        return self._c["negative"]

    @property
    def nan(self) -> int:
        """Number of NaN elements."""
        return self._c["nan"]

    @property
    def posinf(self) -> int:
        """Number of +inf elements."""
        return self._c["posinf"]

    @property
    def neginf(self) -> int:
        """Number of -inf elements."""
        return self._c["neginf"]

    @property
    def min(self) -> float | None:
        """Smallest finite value (an exact int beyond 2**53 for int64 input); None if none."""
        return self._f["min"]

    @property
    def max(self) -> float | None:
        """Largest finite value (an exact int beyond 2**53 for int64 input); None if none."""
        return self._f["max"]

    @property
    def absmax(self) -> float | None:
        """Largest finite magnitude (exact int beyond 2**53 for int64 input); None if none."""
        return self._f["absmax"]

    @property
    def sum(self) -> float:
        """Float64 sum of the finite values (0.0 if none)."""
        return self._required("sum")

    @property
    def sum_squares(self) -> float:
        """Float64 sum of the squared finite values (0.0 if none)."""
        return self._required("sum_squares")

    @property
    def sum_abs(self) -> float:
        """Float64 sum of the finite magnitudes (0.0 if none)."""
        return self._required("sum_abs")

    @property
    def mean(self) -> float | None:
        """Mean of the finite values (Chan-merged); None if none."""
        return self._f["mean"]

    @property
    def m2(self) -> float | None:
        """``sum((x - mean)**2)`` over the finite values (Chan-merged); None if none."""
        return self._f["m2"]

    @property
    def var(self) -> float | None:
        """Population variance of the finite values (``m2 / finite``), ``None`` if none."""
        m2 = self._f["m2"]
        return None if m2 is None else m2 / self._c["finite"]

    # ---- streaming
    def update(self, tensor: torch.Tensor) -> None:
        """Fold every element of ``tensor`` into the spine (in place)."""
        # imported here, not above: the value class loads without torch (history decodes into it)
        from stepscope.stats.reduce import host_spine  # lazy: reduce imports torch

        row, int_extremes = host_spine(tensor)
        part = RunningStats.from_vector(row, reduction_dtype=self.reduction_dtype)
        if int_extremes is not None:
            # the float64 row rounds integers above 2**53: take the extremes in int64 (exact)
            lo, hi = int_extremes
            part._f.update(min=_exact(lo), max=_exact(hi), absmax=_exact(max(-lo, hi)))
        merged = self.merge(part)
        self._c, self._f = merged._c, merged._f

    def merge(self, other: RunningStats) -> RunningStats:
        """A new spine over the union of both inputs (neither input is changed)."""
        if not isinstance(other, RunningStats):
            raise Refusal(
                "stat_kind_mismatch", f"cannot merge RunningStats with {type(other).__name__}"
            )
        merged = merge_spine_rows(self.to_vector(), other.to_vector())
        out = RunningStats.from_vector(merged, reduction_dtype=self.reduction_dtype)
        for name, pick in (("min", min), ("max", max), ("absmax", max)):
            # Python compares int with float exactly: integer extremes above 2**53 survive
            vals = [v for v in (self._f[name], other._f[name]) if v is not None]
            if vals:
                out._f[name] = pick(vals)
        return out

    # ---- vectors and dicts
    def to_vector(self) -> np.ndarray:
        """The float64 row in :data:`SPINE_FIELDS` order (NaN where a float field is ``None``)."""
        vals = [float(self._c[n]) for n in COUNT_FIELDS]
        floats = (self._f[n] for n in FLOAT_FIELDS)
        vals += [math.nan if v is None else float(v) for v in floats]
        return np.asarray(vals, dtype=np.float64)

    @classmethod
    def from_vector(
        cls, vec: np.ndarray | torch.Tensor, reduction_dtype: str = REDUCTION_DTYPE
    ) -> RunningStats:
        """Decode a spine row produced by :func:`reduce_spines` or :meth:`to_vector`."""
        v = host_array(vec)
        if v.shape != (SPINE_WIDTH,):
            raise Refusal(
                "stat_payload_invalid", f"spine row must have shape ({SPINE_WIDTH},), got {v.shape}"
            )
        counts = v[: len(COUNT_FIELDS)]
        if not (
            np.isfinite(counts).all() and (counts >= 0).all() and (counts == np.floor(counts)).all()
        ):
            raise Refusal(
                "stat_payload_invalid",
                f"spine counts {counts.tolist()} must be whole numbers >= 0 (not NaN or inf)",
                ["decode rows written by reduce_spines or RunningStats.to_vector"],
            )
        out = cls()
        out.reduction_dtype = reduction_dtype
        for i, name in enumerate(COUNT_FIELDS):
            out._c[name] = int(v[i])
        has = out._c["finite"] > 0
        for i, name in enumerate(FLOAT_FIELDS, start=len(COUNT_FIELDS)):
            if name in SUM_FIELDS:
                out._f[name] = float(v[i])
            else:
                out._f[name] = float(v[i]) if has else None
        out._validate()
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite sums as strings); :meth:`from_dict` inverts it exactly."""
        d: dict[str, Any] = {"kind": "running_stats", "reduction_dtype": self.reduction_dtype}
        d.update(self._c)
        d.update({k: json_float(v) for k, v in self._f.items()})
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunningStats:
        """Rebuild from :meth:`to_dict` output; refuses ``stat_payload_invalid`` when malformed."""
        if not isinstance(data, dict) or data.get("kind") != "running_stats":
            raise Refusal(
                "stat_payload_invalid",
                "not a running_stats payload",
                ["pass RunningStats.to_dict() output"],
            )
        missing = [k for k in SPINE_FIELDS if k not in data]
        if missing:
            raise Refusal("stat_payload_invalid", f"running_stats payload lacks {missing}")
        out = cls()
        out.reduction_dtype = str(data.get("reduction_dtype", REDUCTION_DTYPE))
        for name in COUNT_FIELDS:
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise Refusal(
                    "stat_payload_invalid",
                    f"count {name!r} must be a non-negative int, got {value!r}",
                )
            out._c[name] = value
        for name in FLOAT_FIELDS:
            out._f[name] = _dec(data[name], name)
        out._validate()
        return out

    def _validate(self) -> None:
        c = self._c
        if (
            c["finite"] != c["total"] - c["nan"] - c["posinf"] - c["neginf"]
            or c["zero"] + c["negative"] > c["finite"]
        ):
            raise Refusal("stat_payload_invalid", f"inconsistent spine counts {c}")
        has = c["finite"] > 0
        for name in ("min", "max", "absmax", "mean", "m2"):
            if (self._f[name] is None) == has:
                raise Refusal(
                    "stat_payload_invalid",
                    f"field {name!r} must be {'set' if has else 'None'} when finite == {c['finite']}",
                )
        if any(self._f[n] is None for n in SUM_FIELDS):
            raise Refusal("stat_payload_invalid", "sums must be numbers (0.0 when empty)")

    def to_tensorboard(self) -> dict[str, float | int]:
        """Keyword arguments ``num, min, max, sum, sum_squares`` of ``add_histogram_raw``.

        ``num`` is the number of finite values (the values ``sum`` and ``sum_squares`` describe);
        NaN and infinities have no place on TensorBoard's axis and are exported separately.
        With no finite value, ``min``/``max`` are 0.0 and ``num`` is 0 (TensorBoard needs numbers).
        """
        has = self._c["finite"] > 0
        return {
            "num": self._c["finite"],
            "min": self._required("min") if has else 0.0,
            "max": self._required("max") if has else 0.0,
            "sum": self._required("sum"),
            "sum_squares": self._required("sum_squares"),
        }

    def _required(self, name: str) -> float:
        """A float field that :meth:`_validate` requires to be set (sums; extremes if finite)."""
        value = self._f[name]
        if value is None:
            raise Refusal("stat_payload_invalid", f"field {name!r} is None")
        return value

    # ---- comparison
    def _key(self) -> tuple:
        # NaN compares equal to NaN here: an overflowed float64 moment (inf - inf) is a value
        floats = tuple(
            "nan" if isinstance(v, float) and math.isnan(v) else v for v in self._f.values()
        )
        return (tuple(self._c.values()), floats, self.reduction_dtype)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunningStats) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v}" for k, v in {**self._c, **self._f}.items())
        return f"RunningStats({fields})"
