"""Curvature families, modes, and the cross-entropy output factors they backpropagate.

Each family is a parameter-space matrix of the form

.. math::

    M = \\frac{1}{n} \\sum_{i=1}^{n} J_i^\\top Q_i J_i, \\qquad Q_i = V_i^\\top V_i,

where :math:`J_i` is the Jacobian of example :math:`i`'s logits and :math:`V_i` stacks output
directions. A family is therefore fully described by the per-example output directions
:math:`V_i` (``K`` rows of length ``C``) that :mod:`stepscope.curvature.factors` backpropagates:

- ``empirical_fisher``: :math:`V_i = (p_i - e_{y_i})^\\top`, the gradient of example :math:`i`'s
  cross-entropy with respect to its logits (one direction, observed labels, exact in every mode).
- ``ce_ggn``: :math:`V_i = S_i` with :math:`S_i^\\top S_i = \\operatorname{diag}(p_i) - p_i
  p_i^\\top`, the CE logit Hessian; row :math:`k` is :math:`\\sqrt{p_{ik}}(e_k - p_i)`.
- ``jacobian_gram``: :math:`V_i = I_C` (every output unit).

In ``sampled`` mode the ``C`` rows are replaced by ``samples`` independent per-example Rademacher
combinations :math:`r^\\top V_i / \\sqrt{\\text{samples}}` with :math:`\\mathbb{E}[r r^\\top] = I`,
so :math:`\\mathbb{E}[\\hat Q_i] = Q_i` (unbiased, no :math:`1/C^2` legacy factor).

Numerics: :math:`1 - p_k` is never formed by subtraction where it cancels; it is the sum of the
*other* probabilities (:mod:`stepscope.probe.crossentropy`, the one implementation the probe and
the operators share), so saturated softmax outputs (:math:`p_k` within :math:`10^{-12}` of one)
keep their relative accuracy.

Example
-------
>>> import torch
>>> from stepscope.curvature.families import ce_hessian_sqrt, ce_logit_hessian
>>> logits = torch.tensor([[0.0, -40.0]], dtype=torch.float64)
>>> s = ce_hessian_sqrt(logits)
>>> bool(torch.allclose(s[0].T @ s[0], ce_logit_hessian(logits)[0], rtol=0, atol=1e-30))
True
>>> bool(ce_logit_hessian(logits)[0, 1, 1] > 0)  # p_1 q_1 with p_1 ~ 4e-18: not cancelled to 0
True
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import Tensor

from stepscope.curvature.factors import KfacApprox, kfac_factor_rows

# the one cancellation-free implementation, shared with the probe and the operators
from stepscope.probe.crossentropy import ce_logit_gradient, softmax_and_complement


class CurvatureMode(str, Enum):
    """How the GGN and Jacobian-Gram output directions are chosen."""

    EXACT = "exact"  #: every output direction (C backward passes)
    SAMPLED = "sampled"  #: per-example Rademacher combinations averaged over ``samples``


class CurvatureFamily(str, Enum):
    """The three curvature families (names are the JSON keys); not :class:`stepscope.errors.Family`,
    a refusal code's family."""

    EMPIRICAL_FISHER = "empirical_fisher"
    CE_GGN = "ce_ggn"
    JACOBIAN_GRAM = "jacobian_gram"


def ce_hessian_sqrt(logits: Tensor) -> Tensor:
    """Square-root factors ``S_i`` of the CE logit Hessian, ``S_i^T S_i = diag(p_i) - p_i p_i^T``.

    .. math:: (S_i)_{kc} = \\sqrt{p_{ik}}\\,(\\delta_{kc} - p_{ic}), \\quad (S_i)_{kk} =
        \\sqrt{p_{ik}}\\, q_{ik}

    Returns
    -------
    Tensor
        ``(n, C, C)``; row ``k`` of ``S_i`` is one output direction.
    """
    p, q = softmax_and_complement(logits)
    c = logits.shape[1]
    sqrt_p = p.sqrt()
    s = -sqrt_p.unsqueeze(2) * p.unsqueeze(1)
    idx = torch.arange(c, device=logits.device)
    s[:, idx, idx] = sqrt_p * q
    return s


def ce_logit_hessian(logits: Tensor) -> Tensor:
    """Per-example CE logit Hessians ``diag(p_i) - p_i p_i^T`` with the cancellation-free diagonal.

    .. math:: (H_i)_{kk} = p_{ik} q_{ik}, \\quad (H_i)_{kc} = -p_{ik} p_{ic}

    Returns
    -------
    Tensor
        ``(n, C, C)``.
    """
    p, q = softmax_and_complement(logits)
    h = -p.unsqueeze(2) * p.unsqueeze(1)
    idx = torch.arange(logits.shape[1], device=logits.device)
    h[:, idx, idx] = p * q
    return h


def rademacher(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """Independent +-1 entries drawn from a private generator (global RNG untouched)."""
    bits = torch.randint(0, 2, shape, generator=generator)
    return (2 * bits - 1).to(dtype)


def output_directions(
    family: CurvatureFamily,
    logits: Tensor,
    labels: Tensor,
    mode: CurvatureMode,
    samples: int,
    generator: torch.Generator,
) -> Tensor:
    """The per-example output directions ``V`` of a family, shape ``(K, n, C)``.

    ``K`` is 1 for the empirical Fisher, ``C`` in exact mode and ``samples`` in sampled mode
    (each sampled direction already carries the :math:`1/\\sqrt{\\text{samples}}` weight).
    """
    n, c = logits.shape
    if family is CurvatureFamily.EMPIRICAL_FISHER:
        return ce_logit_gradient(logits, labels).unsqueeze(0)
    if mode is CurvatureMode.EXACT:
        if family is CurvatureFamily.JACOBIAN_GRAM:
            eye = torch.eye(c, dtype=logits.dtype, device=logits.device)
            return eye.unsqueeze(1).expand(c, n, c)
        return ce_hessian_sqrt(logits).permute(1, 0, 2)
    r = rademacher((samples, n, c), generator, logits.dtype).to(logits.device)
    scale = float(samples) ** -0.5
    if family is CurvatureFamily.JACOBIAN_GRAM:
        return r * scale
    s = ce_hessian_sqrt(logits)  # (n, C, C): rows are directions
    return torch.einsum("snk,nkc->snc", r, s) * scale


#: how each family's directions were chosen, per mode (goes into the output metadata)
ESTIMATOR_LABELS: dict[CurvatureMode, dict[CurvatureFamily, str]] = {
    CurvatureMode.EXACT: {
        CurvatureFamily.EMPIRICAL_FISHER: "exact: observed-label CE logit gradient",
        CurvatureFamily.CE_GGN: "exact: all C square-root CE-Hessian rows sqrt(p_k)(e_k - p)",
        CurvatureFamily.JACOBIAN_GRAM: "exact: all C output units",
    },
    CurvatureMode.SAMPLED: {
        CurvatureFamily.EMPIRICAL_FISHER: "exact: observed-label CE logit gradient",
        CurvatureFamily.CE_GGN: "unbiased estimate: per-example Rademacher combinations of the "
        "square-root CE-Hessian rows, averaged over `samples`",
        CurvatureFamily.JACOBIAN_GRAM: "unbiased estimate: per-example Rademacher combinations of the "
        "output units, averaged over `samples`",
    },
}


def place_directions(directions: Tensor, keep: Tensor, per_position: bool) -> Tensor:
    """Token-target directions: per-row directions ``(K, m, C)`` placed at the scored positions.

    One example's output is its ``(T, C)`` logits and its loss the sum over scored positions, so
    its CE Hessian is block diagonal over positions. ``per_position=False`` (the empirical-Fisher
    gradient, sampled combinations with independent signs per position) gives ``(K, n, T, C)``;
    ``per_position=True`` (exact modes: every output direction of every position) gives
    ``(T * K, n, T, C)`` with direction ``(t, k)`` non-zero only at position ``t``.

    Parameters
    ----------
    directions
        ``(K, m, C)``: one block per scored row, rows in ``keep.nonzero()`` order.
    keep
        ``(n, T)`` bool mask of scored positions.
    """
    k, _, c = directions.shape
    n, t = keep.shape
    if not per_position:
        out = directions.new_zeros(k, n, t, c)
        out[:, keep] = directions
        return out
    out = directions.new_zeros(t, k, n, t, c)
    rows, cols = keep.nonzero(as_tuple=True)
    out[cols, :, rows, cols, :] = directions.permute(1, 0, 2)
    return out.reshape(t * k, n, t, c)


def _diag_summary(diag: Tensor) -> dict[str, float]:
    return {
        "diag_max": float(diag.max()),
        "frobenius": float(diag.norm()),
        "trace": float(diag.sum()),
        "average": float(diag.mean()),
    }


def block_metrics(
    inputs: Tensor,
    backprop: Tensor,
    has_bias: bool,
    activation_spectrum: dict,
    backprop_spectrum: dict,
    approx: KfacApprox = KfacApprox.EXPAND,
) -> dict:
    """Diagonal and KFAC summaries of one family's weight (and bias) block.

    With per-example, per-direction weight gradients :math:`g_{ik} = \\sum_p B_{ikp} a_{ip}^\\top`
    (one position ``p`` for Linear, the output positions of a Conv2d), the exact weight-block
    diagonal is :math:`D = \\frac1n\\sum_{i,k} g_{ik}^{\\odot 2}` (for Linear
    :math:`D_{oj} = \\frac{1}{n}\\sum_{i,k} B_{iko}^2 a_{ij}^2`), and KFAC is
    :math:`\\bar B \\otimes \\bar A` with :math:`\\bar A = \\frac{1}{nP}\\sum_{i,p} a_{ip}a_{ip}^\\top`,
    :math:`\\bar B = \\frac1n\\sum_{i,k,p} B_{ikp}B_{ikp}^\\top` (KFAC-expand; ``approx=reduce``
    uses the reduce factors of :mod:`stepscope.curvature.factors`):

    - ``weight``/``bias``: ``diag_max`` = max D, ``frobenius`` = ‖D‖₂ (of the diagonal),
      ``trace`` = Σ D, ``average`` = mean D (bias: :math:`\\frac1n\\sum_{ik} (\\sum_p B_{ikp})^2`).
    - ``kfac``: ``trace`` = tr Ā tr B̄, ``frobenius`` = ‖Ā‖_F ‖B̄‖_F, ``top_eigenvalue`` =
      λmax(Ā) λmax(B̄), ``effective_rank`` = erank(Ā) erank(B̄) (entropy is additive over a
      Kronecker product), ``stable_rank`` = srank(Ā) srank(B̄), ``relative_diagonal_error`` =
      mean |diag(B̄) diag(Ā)ᵀ - D| / mean |D|.

    Parameters
    ----------
    inputs
        ``(n, P, D)`` activations (patches).
    backprop
        ``(K, n, P, d_out)`` backprop rows of the family.
    has_bias
        Whether the layer has a bias (else ``bias`` is ``None``).
    activation_spectrum, backprop_spectrum
        From :func:`stepscope.curvature.factors.factor_spectrum`, of the ``approx`` factors.
    approx
        The KFAC convention of the factors (``expand`` or ``reduce``).
    """
    n, positions = inputs.shape[0], inputs.shape[1]
    if positions == 1:
        b_sq = (backprop[:, :, 0] ** 2).sum(dim=0)  # (n, d_out)
        diag_w = b_sq.T @ (inputs[:, 0] ** 2) / n
    else:
        diag_w = inputs.new_zeros(backprop.shape[-1], inputs.shape[-1])
        for k in range(backprop.shape[0]):  # one direction at a time bounds the memory
            g = torch.einsum("npo,npd->nod", backprop[k], inputs)
            diag_w += (g * g).sum(dim=0)
        diag_w /= n
    bias_diag = (backprop.sum(dim=2) ** 2).sum(dim=(0, 1)) / n
    a_rows, a_norm, b_rows = kfac_factor_rows(inputs, backprop, approx)
    b_diag = (b_rows * b_rows).sum(dim=0) / n
    a_diag = (a_rows * a_rows).sum(dim=0) / a_norm
    kfac_diag = torch.outer(b_diag, a_diag)
    mean_abs = diag_w.abs().mean()
    a_sp, b_sp = activation_spectrum, backprop_spectrum

    def product(key: str) -> float | None:
        x, y = a_sp.get(key), b_sp.get(key)
        return None if x is None or y is None else x * y

    kfac = {
        "trace": a_sp["trace"] * b_sp["trace"],
        "frobenius": a_sp["frobenius"] * b_sp["frobenius"],
        "top_eigenvalue": a_sp["top_eigenvalue"] * b_sp["top_eigenvalue"],
        "effective_rank": product("effective_rank"),
        "stable_rank": product("stable_rank"),
        "relative_diagonal_error": (
            float((kfac_diag - diag_w).abs().mean() / mean_abs) if mean_abs > 0 else None
        ),
        "approximate_spectrum": bool(a_sp.get("approximate") or b_sp.get("approximate")),
    }
    return {
        "weight": _diag_summary(diag_w),
        "bias": _diag_summary(bias_diag) if has_bias else None,
        "kfac": kfac,
        "backprop_factor": b_sp,
    }
