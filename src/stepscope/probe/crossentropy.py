"""Cancellation-free cross-entropy derivatives in logit space: the one implementation.

The dense probe, the curvature operators (:mod:`stepscope.curvature.products`) and the offline
analysis (:mod:`stepscope.curvature.families`) all differentiate the softmax cross-entropy through
these functions, never through ``F.cross_entropy``'s backward: torch forms ``p_y - 1``, which is
exactly 0 once ``p_y`` rounds to 1 (a float64 margin of about 37, float32 about 17), although the
true derivative ``-sum_{j != y} p_j`` is a perfectly representable tiny number.

Rule: ``1 - p_k`` is never formed by subtraction where it could cancel. Only the largest
probability of a row can exceed 1/2, so ``q_k = 1 - p_k`` is accurate for every other entry and
the row's argmax gets the sum of the *other* probabilities instead; ``O(C)`` work and memory per
row (a 50,257-token vocabulary included).

- :func:`softmax_and_complement`: ``p`` and ``q = 1 - p``.
- :func:`ce_logit_gradient`: ``p - e_y`` with the label entry ``-q_y``.
- :func:`ce_hessian_product`: ``(diag(p) - p p^T) u`` written as
  ``p_k ((u_k - u_m) + sum_{j != m} p_j (u_m - u_j))`` with ``m`` the row's argmax: no
  ``u - <p, u>`` difference of nearly equal numbers.
- :func:`stable_cross_entropy`: the loss itself in a form whose autograd (first and second
  derivatives: the Hessian operator's double backward) does not cancel either.
- :func:`underflowed_targets`: rows whose label derivative is exactly 0 in the working dtype
  (every other probability underflowed): the true value is below what the dtype resolves.

Example
-------
>>> import torch
>>> z = torch.tensor([[40.0, 0.0, 0.0]], dtype=torch.float64)
>>> g = ce_logit_gradient(z, torch.tensor([0]))
>>> f"{float(g[0, 0]):.4e}"  # F.cross_entropy's backward gives 0.0 here
'-8.4967e-18'
"""

from __future__ import annotations

import torch
from torch import Tensor


def softmax_and_complement(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax probabilities ``p`` and ``q = 1 - p`` without cancellation.

    .. math:: q_{ik} = \\sum_{j \\ne k} p_{ij}

    computed as the sum of the other entries for the row's argmax and as ``1 - p_{ik}`` (at most
    1/2, so exact to rounding) for every other entry.

    Parameters
    ----------
    logits
        ``(n, C)`` logits.

    Returns
    -------
    tuple of Tensor
        ``(p, q)``, both ``(n, C)``.
    """
    p = torch.softmax(logits, dim=1)
    top = p.argmax(dim=1, keepdim=True)
    others = p.scatter(1, top, 0.0).sum(dim=1, keepdim=True)
    q = (1.0 - p).scatter(1, top, others)
    return p, q


def ce_logit_gradient(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-row gradient of the summed cross-entropy with respect to the logits.

    .. math:: \\nabla_{f_i} \\ell_i = p_i - e_{y_i},\\quad (p_i - e_{y_i})_{y_i} = -\\sum_{j\\ne
        y_i} p_{ij}

    Parameters
    ----------
    logits
        ``(n, C)`` logits (detached or not; the result is a plain value).
    labels
        ``(n,)`` int64 class ids.

    Returns
    -------
    Tensor
        ``(n, C)``.
    """
    p = torch.softmax(logits.detach(), dim=1)
    index = labels.reshape(-1, 1)
    others = p.scatter(1, index, 0.0).sum(dim=1, keepdim=True)
    return p.scatter(1, index, -others)


def ce_hessian_product(probs: Tensor, u: Tensor) -> Tensor:
    """``(diag(p_i) - p_i p_i^T) u_i`` for every row, cancellation-free.

    .. math:: \\big((\\operatorname{diag}(p) - p p^\\top) u\\big)_k
        = p_k \\Big((u_k - u_m) + \\sum_{j \\ne m} p_j (u_m - u_j)\\Big),
        \\quad m = \\arg\\max_j p_j

    Parameters
    ----------
    probs
        ``(n, C)`` softmax probabilities (fixed).
    u
        ``(n, C)`` logit-space vectors.
    """
    top = probs.argmax(dim=1, keepdim=True)
    u_top = u.gather(1, top)
    rest = (probs.scatter(1, top, 0.0) * (u_top - u)).sum(dim=1, keepdim=True)
    return probs * ((u - u_top) + rest)


def stable_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-row cross-entropy whose autograd derivatives (first and second) never cancel.

    .. math:: \\ell = (z_m - z_y) + \\log\\big(1 + \\sum_{j \\ne m} e^{z_j - z_m}\\big),
        \\quad m = \\arg\\max_j z_j

    (``m`` chosen without gradient; no exponent overflows). Its backward gives
    ``-sum_{j != y} p_j`` for a confident label, where ``F.cross_entropy``'s gives 0, and double
    backward the cancellation-free CE Hessian; the Hessian operator differentiates it.

    Returns
    -------
    Tensor
        ``(n,)`` losses.
    """
    top = logits.detach().argmax(dim=1, keepdim=True)
    shifted = logits - logits.gather(1, top)
    rest = shifted.exp().scatter(1, top, 0.0).sum(dim=1)
    return torch.log1p(rest) - shifted.gather(1, labels.reshape(-1, 1)).squeeze(1)


def underflowed_targets(logits: Tensor, labels: Tensor) -> Tensor:
    """Count of rows whose label derivative ``-q_y`` is exactly 0 in the logits' dtype.

    For finite logits the true value is never 0: a 0 means every other probability underflowed,
    so the row's gradient (and every quantity built from it) is below what the dtype resolves.
    """
    return (ce_logit_gradient(logits, labels).gather(1, labels.reshape(-1, 1)) == 0).sum()


__all__ = [
    "ce_hessian_product",
    "ce_logit_gradient",
    "softmax_and_complement",
    "stable_cross_entropy",
    "underflowed_targets",
]
