"""Per-example gradient moments of affine layers from their inputs ``A`` and backprops ``B``.

Notation (one affine layer, ``n`` probe examples): ``A_i`` is example ``i``'s layer input (for
Conv2d: its unfolded patches, ``d x L`` with ``L`` output positions), ``B_i`` the derivative of
*example i's own* cross-entropy at the layer output (``o x L``). This is the per-example scale: the
backprop of the *mean* loss times ``n``. The per-example weight gradient is
``g_i = B_i A_i^T`` (summed over positions), the bias gradient ``b_i = B_i 1``.

.. math::

    \\mathrm{fisher\\_trace} = \\frac1n \\sum_i \\|g_i\\|^2, \\qquad
    \\mathrm{mean\\_grad\\_sq\\_norm} = \\Big\\|\\frac1n \\sum_i g_i\\Big\\|^2, \\qquad
    \\mathrm{gradient\\_diversity} = \\frac{\\sum_i \\|g_i\\|^2}{\\|\\sum_i g_i\\|^2}.

For a Linear layer on 2-D input ``||g_i||^2 = ||A_i||^2 ||B_i||^2``; with positions (Conv2d, or a
Linear on ``(n, ..., d)`` input) that identity fails and ``||g_i||^2`` is computed exactly, either
from the per-example products ``B_i A_i^T`` or from the Gram identity
``||B_i A_i^T||^2 = <A_i^T A_i, B_i^T B_i>``, whichever costs fewer flops. Units: squared
loss-per-parameter units (gradients of a per-example loss in nats).

Example
-------
>>> import torch
>>> a, b = torch.ones(3, 2), torch.ones(3, 4)
>>> sq, total = per_example_sq_norms(a, b), b.T @ a
>>> m = gradient_moments(sq.double().numpy(), float(total.square().sum()) / 9)
>>> m.fisher_trace, m.mean_grad_sq_norm, m.covariance_trace, m.gradient_diversity
(8.0, 8.0, 0.0, 0.3333333333333333)
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from stepscope.denominators import (
    CANCELLATION_FLAG,
    NEGLIGIBLE_RTOL,
    cancellation_error,
    negligible,
)

#: ``||G||^2 <= DIVERSITY_DENOMINATOR_RTOL * mean_i ||g_i||^2`` makes both diversities undefined:
#: the shared rule of :mod:`stepscope.denominators` (Yin diversity would exceed ``1e6 / n``).
DIVERSITY_DENOMINATOR_RTOL = NEGLIGIBLE_RTOL
#: A covariance trace in ``[-COVARIANCE_ROUNDOFF_RTOL * fisher_trace, 0)`` is float32 round-off of
#: a non-negative quantity and is clipped to 0 (recorded); more negative values are reported None.
COVARIANCE_ROUNDOFF_RTOL = 1e-5
#: ``validity['covariance_relative_error_kind']``: the estimate counts operand rounding only
ERROR_ESTIMATE_KIND = "operand_rounding_floor_not_a_bound"
#: largest per-example-gradient block (elements) the "outer" method materialises at once
OUTER_CHUNK_ELEMENTS = 1 << 24
QUANTILES: dict[str, float] = {"min": 0.0, "q25": 0.25, "median": 0.5, "q75": 0.75, "max": 1.0}


@dataclass
class BlockTensors:
    """On-device results for one measured module (weight and bias blocks), before the host transfer.

    ``weight_sq`` holds ``||g_i||^2`` per example (shape ``(n,)``); ``weight_sum`` the summed
    gradient ``sum_i g_i = n G`` (flattened for conv). Sums, not means: dividing a weight-sized
    tensor by ``n`` costs a pass over it, dividing the squared norm by ``n^2`` costs nothing.
    """

    weight_sq: torch.Tensor | None
    weight_sum: torch.Tensor | None
    bias_sq: torch.Tensor | None = None
    bias_sum: torch.Tensor | None = None


def choose_method(n: int, d: int, o: int, positions: int) -> str:
    """``"outer"`` when materialising ``B_i A_i^T`` costs fewer flops than the Gram identity
    (``n o d L`` vs ``n L^2 (d + o)``), else ``"gram"``."""
    return "outer" if o * d <= positions * (d + o) else "gram"


def per_example_sq_norms(a: torch.Tensor, b: torch.Tensor, method: str = "auto") -> torch.Tensor:
    """Exact ``||B_i A_i^T||_F^2`` for each example.

    Parameters
    ----------
    a, b
        ``(n, d)``/``(n, o)`` (then the value is ``||A_i||^2 ||B_i||^2``) or ``(n, d, L)``/``(n, o, L)``.
    method
        ``"outer"`` forms the per-example products, ``"gram"`` uses ``<A^T A, B^T B>``,
        ``"auto"`` picks the one with fewer flops. Both are exact up to float rounding.
    """
    if a.dim() == 2:
        return a.square().sum(1) * b.square().sum(1)
    _, d, positions = a.shape
    o = b.shape[1]
    if method == "auto":
        method = choose_method(a.shape[0], d, o, positions)
    if method == "outer":  # in chunks of examples: at most OUTER_CHUNK_ELEMENTS per product
        step = max(1, OUTER_CHUNK_ELEMENTS // max(1, o * d))
        return torch.cat(
            [
                torch.linalg.vector_norm(
                    torch.bmm(b[i : i + step], a[i : i + step].transpose(1, 2)), dim=(1, 2)
                ).square()
                for i in range(0, a.shape[0], step)
            ]
        )
    if method == "gram":
        return (torch.bmm(a.transpose(1, 2), a) * torch.bmm(b.transpose(1, 2), b)).sum((1, 2))
    raise ValueError(f"unknown method {method!r}")


@dataclass(frozen=True)
class MomentFields:
    """The gradient-moment fields, declared once: :class:`GradientMoments` defines them and
    :class:`stepscope.probe.recorder.BlockRecord` carries them flat beside its distances."""

    fisher_trace: float | None
    mean_grad_sq_norm: float | None
    covariance_trace: float | None
    gradient_diversity: float | None
    gradient_diversity_legacy_scale: float | None
    grad_norm_rms: float | None
    grad_norm_quantiles: dict[str, float] | None
    grad_fro_legacy_scale: float | None

    def moment_fields(self) -> dict[str, Any]:
        """The eight moment fields by name (what a :class:`BlockRecord` copies)."""
        return {f.name: getattr(self, f.name) for f in fields(MomentFields)}


@dataclass(frozen=True)
class GradientMoments(MomentFields):
    """Host-side gradient moments of one parameter block (float64 arithmetic on n scalars).

    Attributes
    ----------
    fisher_trace
        ``mean_i ||g_i||^2``: the exact empirical-Fisher trace of the block on the probe.
    mean_grad_sq_norm
        ``||G||^2`` with ``G = sum_i g_i / n`` (the mean-loss gradient).
    covariance_trace
        ``fisher_trace - mean_grad_sq_norm = mean_i ||g_i - G||^2`` (population-normalised);
        clipped to 0 only for diagnosed round-off (``validity['covariance_clipped']``).
    gradient_diversity
        Yin et al.: ``sum_i ||g_i||^2 / ||sum_i g_i||^2``; ``None`` when the denominator is
        negligible (:mod:`stepscope.denominators`).
    gradient_diversity_legacy_scale
        The seed's literal "first divided by second": ``fisher_trace / mean_grad_sq_norm`` =
        ``n * gradient_diversity`` (legacy ``layer-{i}/fisher/diversity``); ``None`` together
        with ``gradient_diversity``.
    grad_norm_rms
        ``sqrt(mean_i ||g_i||^2)``.
    grad_norm_quantiles
        ``min, q25, median, q75, max`` of ``||g_i||`` (linear interpolation).
    grad_fro_legacy_scale
        ``||G||_F``: the Frobenius norm of the mean-loss gradient (legacy ``grad_fro``).
    validity
        The counts and denominators behind every ratio above.
    """

    validity: dict[str, Any] = field(default_factory=dict)


def absent_moments(reason: str, n: int) -> GradientMoments:
    """All-``None`` moments for a block whose gradient is absent, stale or masked out."""
    validity = {"n_examples": n, "gradient_present": False, "gradient_absent_reason": reason}
    return GradientMoments(None, None, None, None, None, None, None, None, validity)


def gradient_moments(
    sq_norms: np.ndarray, mean_grad_sq_norm: float, dtype: str = "float32"
) -> GradientMoments:
    """Moments from the per-example squared norms and ``||G||^2``.

    Parameters
    ----------
    sq_norms
        ``||g_i||^2`` for each of the ``n`` examples.
    mean_grad_sq_norm
        ``||sum_i g_i / n||^2``.
    dtype
        The precision both inputs were computed in; it sets the disclosed round-off estimate of
        the covariance trace's cancellation (``validity['covariance_relative_error_estimate']``
        = ``eps * (fisher_trace + mean_grad_sq_norm) / |covariance|``, flagged
        ``covariance_cancellation_suspect`` above 1%). It is the error the subtraction would
        have if both operands were correctly rounded: a floor of the true error, not a bound
        (the float32 reductions forming the operands add to it; at ``cov / fisher = 2e-9`` it
        reads 2.8 where the error is 47), so ``covariance_relative_error_kind`` says
        ``"operand_rounding_floor_not_a_bound"``; measure in float64 when it is flagged.
    """
    sq = np.asarray(sq_norms, dtype=np.float64)
    n = int(sq.size)
    finite = int(np.isfinite(sq).sum())
    validity: dict[str, Any] = {
        "n_examples": n,
        "finite_examples": finite,
        "gradient_present": True,
        "covariance_clipped": False,
        "covariance_raw": None,
        "covariance_roundoff_rtol": COVARIANCE_ROUNDOFF_RTOL,
        "diversity_valid": 0,
        "diversity_numerator": None,
        "diversity_denominator": None,
        "diversity_denominator_rtol": DIVERSITY_DENOMINATOR_RTOL,
    }
    if n == 0 or finite < n or not np.isfinite(mean_grad_sq_norm):
        validity["gradient_absent_reason"] = "non_finite_gradient"
        return GradientMoments(None, None, None, None, None, None, None, None, validity)
    fisher = float(sq.mean())
    msq = float(mean_grad_sq_norm)
    raw = fisher - msq
    validity["covariance_raw"] = raw
    error = cancellation_error(fisher, msq, dtype)
    validity["covariance_computed_dtype"] = dtype
    validity["covariance_relative_error_estimate"] = error
    # what the number is: the error if both operands were correctly rounded, a floor of the true
    # error (the float32 reductions that formed them add to it), never a bound on it
    validity["covariance_relative_error_kind"] = ERROR_ESTIMATE_KIND
    validity["covariance_cancellation_suspect"] = error is None or error > CANCELLATION_FLAG
    covariance: float | None = raw
    if raw < 0.0:
        if raw >= -COVARIANCE_ROUNDOFF_RTOL * fisher:
            covariance, validity["covariance_clipped"] = 0.0, True
        else:
            covariance = None  # not round-off: refuse to present it as a variance
    numerator, denominator = float(sq.sum()), n * n * msq
    validity["diversity_numerator"], validity["diversity_denominator"] = numerator, denominator
    diversity = legacy = None
    if not negligible(msq, fisher, DIVERSITY_DENOMINATOR_RTOL):
        diversity, validity["diversity_valid"] = numerator / denominator, 1
        legacy = fisher / msq
    norms = np.sqrt(np.maximum(sq, 0.0))
    values = np.quantile(norms, list(QUANTILES.values()))  # one sort for all five
    quantiles = {k: float(v) for k, v in zip(QUANTILES, values)}
    return GradientMoments(
        fisher_trace=fisher,
        mean_grad_sq_norm=msq,
        covariance_trace=covariance,
        gradient_diversity=diversity,
        gradient_diversity_legacy_scale=legacy,
        grad_norm_rms=float(np.sqrt(fisher)),
        grad_norm_quantiles=quantiles,
        grad_fro_legacy_scale=float(np.sqrt(msq)),
        validity=validity,
    )
