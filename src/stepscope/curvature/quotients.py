"""Directional metrics: KFAC quadratic forms along actual per-example CE weight gradients.

For a layer, :math:`g_i = b_i a_i^\\top` is example :math:`i`'s weight gradient of its summed CE
(``b_i`` the empirical-Fisher backprop row; for Conv2d :math:`g_i = \\sum_p b_{ip} a_{ip}^\\top`,
formed explicitly), :math:`G = \\frac1n \\sum_i g_i` the mean gradient and
:math:`\\Sigma = \\frac1n\\sum_i g_i g_i^\\top - G G^\\top` the (population-normalised) empirical
covariance. Each family's KFAC quadratic form is

.. math:: q(X) = \\langle X, \\bar B X \\bar A \\rangle = \\operatorname{vec}(X)^\\top
    (\\bar B \\otimes \\bar A) \\operatorname{vec}(X).

Reported per family (for Linear through ``n``-sized Grams, never a ``d x d`` parameter matrix):

- ``mean_gradient_quadratic_form`` :math:`q(G)`; ``mean_gradient_rayleigh_quotient``
  :math:`q(G)/\\lVert G\\rVert^2` (legacy ``hess_curv``/``jac_curv``).
- ``per_example_rayleigh_quotient``: mean/median/max over :math:`i` of
  :math:`q(g_i)/\\lVert g_i\\rVert^2` with valid/total counts (legacy ``*_curv_grad``).
- ``weighted_gradient_norm_mean`` :math:`\\frac1n\\sum_i \\sqrt{q(g_i)}` and
  ``weighted_gradient_sq_norm_mean`` :math:`\\frac1n\\sum_i q(g_i) = \\operatorname{tr}(K F_{emp})`.
- ``covariance_contraction`` :math:`\\operatorname{tr}(K\\Sigma) = \\frac1n\\sum_i q(g_i) - q(G)`
  (keeps the activation/backprop dependence of the per-example gradients).
- ``factorized_noise_contraction`` :math:`\\operatorname{tr}(\\bar B \\bar B_F)\\operatorname{tr}
  (\\bar A^2) = \\operatorname{tr}(K\\,K_F)` (KFAC of the empirical Fisher, legacy ``hess_noise``),
  and ``factorized_noise_contraction_centered`` (minus :math:`q(G)`; may be negative, not clipped).
- ``*_ratio``: the above divided by :math:`q(G)`; ``None`` when :math:`q(G)` is negligible
  against :math:`\\frac1n\\sum_i q(g_i)` (the shared rule of :mod:`stepscope.denominators`, the
  same the dense probe applies); ratios over :math:`\\lVert G\\rVert^2` likewise against
  :math:`\\frac1n\\sum_i\\lVert g_i\\rVert^2`. ``validity`` counts the undefined ones.

Example
-------
>>> import torch
>>> from stepscope.curvature.quotients import gradient_moments
>>> a = torch.ones(2, 1, dtype=torch.float64); b = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
>>> gradient_moments(a, b)["gradient_diversity"] is None  # mean gradient is zero
True
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from stepscope.curvature.factors import KfacApprox, kfac_factor_rows
from stepscope.denominators import cancellation_error, safe_ratio

_ratio = safe_ratio  # (numerator, denominator, scale of the denominator's terms)


def gradient_moments(inputs: Tensor, ef_backprop: Tensor) -> dict[str, Any]:
    """Per-layer moments of the per-example weight gradients :math:`g_i = b_i a_i^\\top`.

    .. math::

        \\text{diversity} = \\frac{\\sum_i \\lVert g_i\\rVert^2}{\\lVert\\sum_i g_i\\rVert^2}
        \\ (\\text{Yin et al.; the seed's legacy scale is } n\\times),\\qquad
        \\text{simple noise scale} = \\frac{\\operatorname{tr}\\Sigma}{\\lVert G\\rVert^2}
        \\ (\\text{McCandlish et al.})

    Parameters
    ----------
    inputs
        ``(n, d_in)`` activations ``a_i``.
    ef_backprop
        ``(n, d_out)`` per-example summed-CE backprop rows ``b_i``.
    """
    n = inputs.shape[0]
    sq = (inputs * inputs).sum(1) * (ef_backprop * ef_backprop).sum(1)
    mean_grad = ef_backprop.T @ inputs / n
    return _moments_summary(sq, float((mean_grad * mean_grad).sum()), n)


def _moments_summary(sq: Tensor, g2: float, n: int) -> dict[str, Any]:
    per_sq_mean = float(sq.mean())
    cov_trace = per_sq_mean - g2
    norms = sq.sqrt()
    return {
        "mean_gradient_frobenius": g2**0.5,
        "mean_gradient_sq_norm": g2,
        "per_example_sq_norm_mean": per_sq_mean,
        "per_example_norm": {
            "min": float(norms.min()),
            "median": float(norms.median()),
            "max": float(norms.max()),
            "mean": float(norms.mean()),
        },
        "covariance_trace": cov_trace,
        "covariance_relative_error_estimate": cancellation_error(per_sq_mean, g2, "float64"),
        "gradient_diversity": _ratio(per_sq_mean, n * g2, n * per_sq_mean),
        "gradient_diversity_legacy_scale": _ratio(per_sq_mean, g2, per_sq_mean),
        "simple_noise_scale": _ratio(cov_trace, g2, per_sq_mean),
        "mean_gradient_zero": g2 == 0,
    }


def directional_metrics(
    inputs: Tensor, ef_backprop: Tensor, family_backprop: Tensor, ef_rows: Tensor
) -> dict[str, Any]:
    """One family's directional quotients along the actual CE gradients of one layer.

    Parameters
    ----------
    inputs
        ``(n, d_in)`` activations.
    ef_backprop
        ``(n, d_out)`` empirical-Fisher backprop rows (the per-example CE gradient factors).
    family_backprop
        ``(K, n, d_out)`` the family's backprop rows, defining :math:`\\bar B`.
    ef_rows
        ``(n, d_out)`` rows defining the empirical-Fisher factor :math:`\\bar B_F` (normally
        ``ef_backprop`` itself).
    """
    n = inputs.shape[0]
    rows = family_backprop.reshape(-1, family_backprop.shape[-1])  # (K n, d_out)
    a_gram = inputs @ inputs.T  # (n, n): a_i . a_j
    # per-example factors: b_i^T Bbar b_i = |rows b_i|^2 / n ; a_i^T Abar a_i = |A a_i|^2 / n
    rows_ef = rows @ ef_backprop.T  # (K n, n)
    b_quad = (rows_ef**2).sum(0) / n
    a_quad = (a_gram * a_gram).sum(0) / n
    q_each = b_quad * a_quad
    sq_each = a_gram.diagonal() * (ef_backprop * ef_backprop).sum(1)
    # G A^T = (1/n) B^T (A A^T): never form the d_out x d_in mean gradient here
    grad_a = ef_backprop.T @ a_gram / n  # (d_out, n)
    q_mean = float(((rows @ grad_a) ** 2).sum() / n**2)  # q(G) = |rows G A^T|_F^2 / n^2
    mean_grad = ef_backprop.T @ inputs / n  # summed squares keep |G|^2 >= 0 and exact-zero-aware
    g2 = float((mean_grad * mean_grad).sum())
    rows_f = rows_ef if ef_rows is ef_backprop else rows @ ef_rows.T
    fact = float((rows_f**2).sum() / n**2) * float((a_gram * a_gram).sum() / n**2)
    return _directional_summary(q_each, sq_each, q_mean, g2, fact)


def _directional_summary(
    q_each: Tensor, sq_each: Tensor, q_mean: float, g2: float, fact: float
) -> dict[str, Any]:
    n = q_each.shape[0]
    valid = sq_each > 0
    quotients = q_each[valid] / sq_each[valid]
    q_each_mean = float(q_each.mean())
    sq_mean = float(sq_each.mean())
    cov = q_each_mean - q_mean
    fact_centered = fact - q_mean
    q_scale = float(q_each.abs().mean())
    ratios = {
        "covariance_contraction_ratio": _ratio(cov, q_mean, q_scale),
        "factorized_noise_ratio": _ratio(fact, q_mean, q_scale),
        "factorized_noise_centered_ratio": _ratio(fact_centered, q_mean, q_scale),
    }
    return {
        "mean_gradient_quadratic_form": q_mean,
        "mean_gradient_rayleigh_quotient": _ratio(q_mean, g2, sq_mean),
        "per_example_rayleigh_quotient": {
            "mean": float(quotients.mean()) if quotients.numel() else None,
            "median": float(quotients.median()) if quotients.numel() else None,
            "max": float(quotients.max()) if quotients.numel() else None,
            "valid_count": int(valid.sum()),
            "total_count": n,
        },
        "weighted_gradient_norm_mean": float(q_each.clamp(min=0).sqrt().mean()),
        "weighted_gradient_sq_norm_mean": q_each_mean,
        "covariance_contraction": cov,
        "covariance_contraction_ratio": ratios["covariance_contraction_ratio"],
        "factorized_noise_contraction": fact,
        "factorized_noise_contraction_centered": fact_centered,
        "factorized_noise_ratio": ratios["factorized_noise_ratio"],
        "factorized_noise_centered_ratio": ratios["factorized_noise_centered_ratio"],
        "validity": {
            "mean_gradient_quadratic_form_zero": q_mean == 0,
            "mean_gradient_zero": g2 == 0,
            "ratios_undefined_negligible_denominator": sum(v is None for v in ratios.values()),
        },
    }


def directional_metrics_explicit(
    grads: Tensor, abar: Tensor, bbar: Tensor, bbar_f: Tensor
) -> dict[str, Any]:
    """:func:`directional_metrics` from explicit per-example gradients and factor matrices.

    Used for Conv2d layers, whose per-example gradients :math:`g_i = \\sum_p b_{ip} a_{ip}^\\top`
    are not rank one. ``grads`` is ``(n, d_out, D)``; ``abar``, ``bbar``, ``bbar_f`` are the
    (small) factor matrices; :math:`q(X) = \\sum (\\bar B X) \\odot (X \\bar A)`.
    """
    mean_grad = grads.mean(0)
    q_each = ((bbar @ grads) * (grads @ abar)).sum(dim=(1, 2))
    q_mean = float(((bbar @ mean_grad) * (mean_grad @ abar)).sum())
    sq_each = (grads * grads).sum(dim=(1, 2))
    fact = float((bbar * bbar_f).sum()) * float((abar * abar).sum())
    return _directional_summary(q_each, sq_each, q_mean, float((mean_grad**2).sum()), fact)


def layer_directional(
    inputs: Tensor,
    family_backprops: dict[str, Tensor],
    ef_key: str,
    approx: KfacApprox = KfacApprox.EXPAND,
) -> dict[str, Any]:
    """Gradient moments plus each family's directional metrics for one layer.

    Parameters
    ----------
    inputs
        ``(n, P, D)`` activations (``P = 1`` for Linear).
    family_backprops
        Family name -> ``(K, n, P, d_out)`` backprop rows.
    ef_key
        The empirical-Fisher family name (its single row per position is the CE gradient factor).
    approx
        The KFAC convention of the factors :math:`\\bar A, \\bar B` with positions
        (:func:`~stepscope.curvature.factors.kfac_factor_rows`, the analysis's ``kfac_approx``);
        the per-example gradients are exact either way.
    """
    n, positions = inputs.shape[0], inputs.shape[1]
    if positions == 1:  # rank-one per-example gradients: n x n Grams only
        a = inputs[:, 0]
        ef = family_backprops[ef_key][0, :, 0]
        out: dict[str, Any] = {"gradient_moments": gradient_moments(a, ef)}
        for name, rows in family_backprops.items():
            out[name] = directional_metrics(a, ef, rows[:, :, 0], ef)
        return out
    ef_b = family_backprops[ef_key][0]  # (n, P, d_out)
    grads = torch.einsum("npo,npd->nod", ef_b, inputs)
    a_rows, a_norm, _ = kfac_factor_rows(inputs, family_backprops[ef_key], approx)
    abar = a_rows.T @ a_rows / a_norm
    bbars = {}
    for name, rows in family_backprops.items():
        flat = kfac_factor_rows(inputs, rows, approx)[2]
        bbars[name] = flat.T @ flat / n
    mean_grad = grads.mean(0)
    out = {
        "gradient_moments": _moments_summary(
            (grads * grads).sum(dim=(1, 2)), float((mean_grad**2).sum()), n
        )
    }
    for name in family_backprops:
        out[name] = directional_metrics_explicit(grads, abar, bbars[name], bbars[ef_key])
    return out
