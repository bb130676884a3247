"""One rule for negligible denominators, shared by the dense probe and ``analyze_curvature``.

A ratio ``numerator / denominator`` is *undefined* (reported ``None`` with a validity count, never
an enormous number) when its denominator is negligible against the **scale of the terms it was
computed from**:

.. math:: |\\mathrm{denominator}| \\le \\mathrm{NEGLIGIBLE\\_RTOL} \\cdot \\mathrm{scale}.

``scale`` is the size of the terms the denominator was computed from. For the mean-gradient
squared norm :math:`\\lVert G\\rVert^2 = \\lVert\\frac1n\\sum_i g_i\\rVert^2` (the denominator of
gradient diversity, of the simple noise scale and of every Rayleigh quotient along :math:`G`) it is
:math:`\\frac1n\\sum_i\\lVert g_i\\rVert^2` (the empirical-Fisher trace, which bounds it); for a
quadratic form :math:`q(G)` it is :math:`\\frac1n\\sum_i q(g_i)`. Gradient diversity
:math:`\\sum_i\\lVert g_i\\rVert^2/\\lVert\\sum_i g_i\\rVert^2` is therefore defined exactly when
:math:`\\lVert G\\rVert^2 > 10^{-6}\\,\\frac1n\\sum_i\\lVert g_i\\rVert^2`, i.e. below
:math:`10^{6}/n`.
Below ``NEGLIGIBLE_RTOL = 1e-6`` a float32 mean gradient is dominated by round-off. The same
threshold is used in float64 (the offline analysis), so the recorder's FP32 and the offline FP64
numbers are defined on the same probes and can be compared side by side.

:func:`cancellation_error` estimates the relative round-off error of a difference of two
nearly equal non-negative quantities (e.g. the covariance trace ``fisher_trace -
mean_grad_sq_norm``): ``eps(dtype) * (|a| + |b|) / |a - b|``.

Example
-------
>>> safe_ratio(3.0, 1e-12, scale=1.0) is None
True
>>> safe_ratio(3.0, 2.0, scale=2.0)
1.5
>>> round(cancellation_error(1.0, 1.0 - 1e-6, "float32"), 3)
0.238
"""

from __future__ import annotations

import math

import numpy as np

#: A denominator at or below this fraction of the scale of its terms is negligible.
NEGLIGIBLE_RTOL = 1e-6
#: An estimated relative cancellation error above this is flagged (``*_cancellation_suspect``).
CANCELLATION_FLAG = 1e-2
RULE = (
    "ratio undefined (None) when |denominator| <= 1e-6 * scale of the terms it sums "
    "(stepscope.denominators, same rule in float32 and float64)"
)


def negligible(denominator: float, scale: float, rtol: float = NEGLIGIBLE_RTOL) -> bool:
    """Whether ``denominator`` is negligible against ``scale`` (or not finite, or zero)."""
    d, s = float(denominator), abs(float(scale))
    if not math.isfinite(d) or d == 0.0:
        return True
    return abs(d) <= rtol * s


def safe_ratio(
    numerator: float, denominator: float, scale: float, rtol: float = NEGLIGIBLE_RTOL
) -> float | None:
    """``numerator / denominator``, or ``None`` when the denominator is negligible.

    Parameters
    ----------
    numerator, denominator
        The two numbers.
    scale
        The size of the terms the denominator was computed from (see the module docstring).
    rtol
        The relative threshold (default :data:`NEGLIGIBLE_RTOL`).
    """
    if negligible(denominator, scale, rtol) or not math.isfinite(float(numerator)):
        return None
    return float(numerator) / float(denominator)


def cancellation_error(a: float, b: float, dtype: str = "float32") -> float | None:
    """Estimated relative round-off error of ``a - b``: ``eps * (|a| + |b|) / |a - b|``.

    ``None`` when ``a == b`` (the difference carries no significant digit). ``dtype`` names the
    precision the two operands were computed in (``"float32"``, ``"float64"``, ...).
    """
    diff = abs(float(a) - float(b))
    if diff == 0.0:
        return None
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return eps * (abs(float(a)) + abs(float(b))) / diff


__all__ = [
    "CANCELLATION_FLAG",
    "NEGLIGIBLE_RTOL",
    "RULE",
    "cancellation_error",
    "negligible",
    "safe_ratio",
]
