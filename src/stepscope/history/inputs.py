"""Writer inputs checked at the boundary: nothing accepted that later breaks a step or the run.

A step the reader could not hold (beyond :data:`MAX_STEP`, the bound every index row is read
with), a site id, presence code or count that an integer cast would silently wrap or truncate, a
scalar name that is not a string, a value that is text: each refuses ``history_write_invalid``
(or the caller's own code) when it is written, never later at the next commit or on open.

Example
-------
>>> check_step(3, "write_scalar step")
3
>>> exact_ints([1, 2], np.int32, "site_ids").dtype.name
'int32'
>>> from stepscope.errors import Refusal
>>> try:
...     exact_ints([2**32 + 1], np.int32, "site_ids")
... except Refusal as refusal:
...     print(refusal.code)
history_write_invalid
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from stepscope.errors import Refusal

#: The largest optimizer step an artifact holds (the bound its reader checks index rows against).
MAX_STEP = int(np.iinfo(np.int64).max // 2)
_INT64 = int(np.iinfo(np.int64).max)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")  # a lone surrogate cannot be written to JSON, a tag or a file name
    except UnicodeEncodeError:
        return False
    return True


def check_step(step: Any, what: str, code: str = "history_write_invalid") -> int:
    """``step`` as an int in ``0..MAX_STEP``, else refuse ``code`` naming ``what``."""
    if not _is_int(step) or not 0 <= int(step) <= MAX_STEP:
        raise Refusal(
            code,
            f"{what} {step!r} is not an int in 0..{MAX_STEP} (2**62 - 1).",
            [f"pass {what} as a plain int >= 0, e.g. step=12"],
        )
    return int(step)


def natural_or_none(value: Any, what: str, code: str = "history_write_invalid") -> int | None:
    """``None`` or an exact int in ``0..2**62`` (``examples_seen``, ``epoch``, counts).

    Never coerced: ``-1``, ``1.5``, ``"3"`` and ``True`` all refuse ``code``.
    """
    if value is None:
        return None
    if not _is_int(value) or not 0 <= int(value) <= MAX_STEP + 1:
        raise Refusal(code, f"{what} {str(value)[:40]} is not an int in 0..2**62 or None.")
    return int(value)


def check_text(value: Any, what: str, code: str = "history_write_invalid", limit: int = 500) -> str:
    """A non-empty string of at most ``limit`` characters without NUL (a name or a label)."""
    if (
        not isinstance(value, str)
        or not value
        or len(value) > limit
        or "\0" in value
        or not _utf8(value)
    ):
        raise Refusal(
            code,
            f"{what} {repr(value)[:60]} is not a non-empty UTF-8 string of at most {limit} "
            "characters without NUL.",
            [f"pass {what} as a str, e.g. 'loss'"],
        )
    return value


def check_real(value: Any, what: str, code: str = "history_write_invalid") -> float:
    """A real number (int, float, numpy or 0-d tensor scalar) as a float; text refuses."""
    if isinstance(value, (str, bytes, complex)) or not hasattr(type(value), "__float__"):
        raise Refusal(
            code,
            f"{what} {repr(value)[:60]} ({type(value).__name__}) is not a real number.",
            [f"pass {what} as a float, e.g. float(loss)"],
        )
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
        raise Refusal(code, f"{what} cannot be read as one float ({exc}).", []) from None


def exact_ints(
    values: Any, dtype: Any, what: str, code: str = "history_write_invalid"
) -> np.ndarray:
    """``values`` as a contiguous array of ``dtype``, refusing any value the cast would change.

    Integer arrays must fit ``dtype``; float arrays must hold integral values that fit (0.7 and
    NaN refuse); booleans, text and objects refuse.
    """
    try:
        a = np.asarray(values)
    except (TypeError, ValueError, OverflowError) as exc:
        raise Refusal(code, f"{what} is not an array of ints ({exc}).", []) from None
    if a.size and a.dtype.kind not in "iuf":
        raise Refusal(
            code,
            f"{what} has dtype {a.dtype}, not integers (a wider int, a bool or text would be "
            "changed by the cast).",
            [f"pass {what} as an int array, e.g. np.array([0, 1])"],
        )
    if a.size and a.dtype.kind == "f" and not np.all(np.isfinite(a) & (a == np.round(a))):
        raise Refusal(code, f"{what} holds non-integral values (e.g. 0.7 or NaN).", [])
    info = np.iinfo(dtype)
    if a.size and (a.min() < info.min or a.max() > info.max):
        raise Refusal(
            code,
            f"{what} holds values outside {info.min}..{info.max} ({np.dtype(dtype).name}): a cast "
            "would wrap them onto other values.",
            [f"pass {what} within {info.min}..{info.max}"],
        )
    return np.ascontiguousarray(a, dtype=dtype)


def finite_or_none(value: Any, what: str, code: str = "history_write_invalid") -> float | None:
    """``None`` or a finite real (``wall_time``)."""
    if value is None:
        return None
    out = check_real(value, what, code)
    if not math.isfinite(out):
        raise Refusal(code, f"{what} {value!r} is not finite.", [])
    return out


def as_stored(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)`` for a record read from a file: a value the writer would refuse is damage
    there (``history_json_invalid``), not a bad argument."""
    try:
        return cls(**fields)
    except Refusal as exc:
        if exc.code != "history_write_invalid":
            raise
        raise Refusal(
            "history_json_invalid", f"{cls.__name__} on disk: {exc.message}", []
        ) from None
