"""Output-space mismatch: the Lyapunov solution of the mean CE-logit Hessian against the Fisher.

With logits :math:`f_i`, probabilities :math:`p_i` and labels :math:`y_i`,

.. math::

    H = \\frac1n \\sum_i \\big(\\operatorname{diag}(p_i) - p_i p_i^\\top\\big), \\qquad
    F = \\frac1n \\sum_i (p_i - e_{y_i})(p_i - e_{y_i})^\\top .

:math:`H` is singular (the all-ones vector is always in its kernel). Let :math:`U` hold the
eigenvectors of :math:`H` whose eigenvalues exceed ``cutoff = rtol * lambda_max(H)`` (the retained
support, rank :math:`r`). On the support, :math:`H_s = U^\\top H U` (diagonal) and
:math:`F_s = U^\\top F U`, and :math:`L` solves

.. math:: H_s L + L H_s = 2 F_s, \\qquad L_{ab} = \\frac{2 (F_s)_{ab}}{h_a + h_b}.

Reported: support ``cutoff``/``rank``, ``discarded_fisher_mass`` (:math:`\\operatorname{tr} F -
\\operatorname{tr} F_s`, absolute and as a fraction), the relative ``solution_residual``, the
Lyapunov spectrum (eigenvalues of :math:`L`) and the preconditioned-Fisher spectrum (eigenvalues
of :math:`H_s^{-1/2} F_s H_s^{-1/2}`, i.e. of :math:`F H^+` on the support), and

- ``intrinsic_dimension`` of a spectrum = :math:`\\sum\\lambda / \\lambda_{\\max}` (the legacy
  "erank"), ``effective_rank`` = Roy–Vetterli :math:`\\exp` entropy;
- ``rho_ambient`` = :math:`C / \\text{intrinsic\\_dimension}` (legacy ``mismatch/rho`` and
  ``rho_cheap`` convention, ``C`` the number of logits) and ``rho_support`` =
  :math:`r / \\text{intrinsic\\_dimension}`, for both spectra;
- ``lyapunov_to_preconditioned_intrinsic_dimension_ratio`` (legacy ``mismatch/diagonalizability``;
  equal to one when :math:`H` and :math:`F` commute, but not a proof of diagonalisability).

Example
-------
>>> import torch
>>> from stepscope.curvature.output_space import output_space_mismatch
>>> logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 1.0, 0.5]], dtype=torch.float64)
>>> out = output_space_mismatch(logits, torch.tensor([0, 2]))
>>> out["support"]["rank"]
2
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from stepscope.curvature.families import ce_logit_hessian
from stepscope.probe.crossentropy import ce_logit_gradient

#: relative eigenvalue cutoff of H's retained support (times lambda_max(H))
DEFAULT_SUPPORT_RTOL = 1e-10


def _spectrum_summary(eigs: Tensor, ambient: int, support: int) -> dict[str, Any]:
    eigs = eigs.flip(0)
    top = float(eigs[0]) if eigs.numel() else 0.0
    total = float(eigs.sum())
    pos = eigs.clamp(min=0)
    if top > 0:
        intrinsic = total / top
        w = pos[pos > 0] / pos.sum()
        erank = float(torch.exp(-(w * w.log()).sum()))
    else:
        intrinsic, erank = None, None
    return {
        "eigenvalues": eigs.tolist(),
        "trace": total,
        "top_eigenvalue": top,
        "intrinsic_dimension": intrinsic,
        "effective_rank": erank,
        "rho_ambient": ambient / intrinsic if intrinsic else None,
        "rho_support": support / intrinsic if intrinsic else None,
    }


def output_space_mismatch(
    logits: Tensor, labels: Tensor, support_rtol: float = DEFAULT_SUPPORT_RTOL
) -> dict[str, Any]:
    """Mean CE-logit Hessian vs. empirical logit-gradient second moment, on H's support.

    Parameters
    ----------
    logits
        ``(n, C)`` logits (float64 for publication-grade numbers).
    labels
        ``(n,)`` integer labels.
    support_rtol
        Eigenvalues of :math:`H` above ``support_rtol * lambda_max(H)`` are retained.

    Returns
    -------
    dict
        See the module docstring for every key.
    """
    logits = logits.detach()
    n, c = logits.shape
    hess = ce_logit_hessian(logits).mean(0)
    grad = ce_logit_gradient(logits, labels)
    fisher = grad.T @ grad / n
    hess = (hess + hess.T) / 2
    h_eigs, h_vecs = torch.linalg.eigh(hess)
    h_max = float(h_eigs.max())
    cutoff = support_rtol * h_max
    keep = h_eigs > cutoff
    rank = int(keep.sum())
    fisher_trace = float(fisher.trace())
    out: dict[str, Any] = {
        "dimension": c,
        "hessian_eigenvalues": h_eigs.flip(0).tolist(),
        "fisher_eigenvalues": torch.linalg.eigvalsh(fisher).flip(0).tolist(),
        "support": {"rtol": support_rtol, "cutoff": cutoff, "rank": rank},
    }
    if rank == 0:
        out.update(
            lyapunov=None,
            preconditioned_fisher=None,
            undefined_reason="H has no eigenvalue above the support cutoff",
        )
        return out
    u = h_vecs[:, keep]
    h_s = h_eigs[keep]
    f_s = u.T @ fisher @ u
    f_s = (f_s + f_s.T) / 2
    lyap = 2 * f_s / (h_s.unsqueeze(0) + h_s.unsqueeze(1))
    h_mat = torch.diag(h_s)
    resid = h_mat @ lyap + lyap @ h_mat - 2 * f_s
    scale = float((2 * f_s).norm())
    inv_sqrt = h_s.rsqrt()
    precond = inv_sqrt.unsqueeze(1) * f_s * inv_sqrt.unsqueeze(0)
    kept_trace = float(f_s.trace())
    lyap_summary = _spectrum_summary(torch.linalg.eigvalsh((lyap + lyap.T) / 2), c, rank)
    pre_summary = _spectrum_summary(torch.linalg.eigvalsh((precond + precond.T) / 2), c, rank)
    li, pi = lyap_summary["intrinsic_dimension"], pre_summary["intrinsic_dimension"]
    out.update(
        discarded_fisher_mass=fisher_trace - kept_trace,
        discarded_fisher_fraction=(fisher_trace - kept_trace) / fisher_trace
        if fisher_trace > 0
        else None,
        solution_residual=float(resid.norm()) / scale if scale > 0 else None,
        solution_residual_absolute=float(resid.norm()),
        lyapunov=lyap_summary,
        preconditioned_fisher=pre_summary,
        lyapunov_to_preconditioned_intrinsic_dimension_ratio=li / pi if li and pi else None,
        lyapunov_to_preconditioned_effective_rank_ratio=(
            lyap_summary["effective_rank"] / pre_summary["effective_rank"]
            if lyap_summary["effective_rank"] and pre_summary["effective_rank"]
            else None
        ),
    )
    return out
