"""The dense float64 oracle the curvature tests compare against (built without the operators).

The Hessian is ``torch.func.hessian`` of the mean cross-entropy over a flat parameter vector, the
GGN comes from the full logit Jacobian (``jacrev``) and the softmax Hessian, the empirical Fisher
from the full per-example-loss Jacobian.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, hessian, jacrev


def dense_oracle(model: nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """The dense float64 matrix of ``kind`` (``hessian``, ``ggn``, ``empirical_fisher``) of the
    mean cross-entropy over the trainable parameters, in eval mode."""
    model = copy.deepcopy(model).double().eval()
    x = x.double()
    named = [(n, p.detach()) for n, p in model.named_parameters() if p.requires_grad]
    theta0 = torch.cat([p.reshape(-1) for _, p in named])

    def logits(theta: torch.Tensor) -> torch.Tensor:
        params, i = {}, 0
        for n, p in named:
            params[n] = theta[i : i + p.numel()].reshape(p.shape)
            i += p.numel()
        return functional_call(model, params, (x,))

    n = x.shape[0]
    if kind == "hessian":
        return hessian(lambda t: F.cross_entropy(logits(t), y))(theta0)
    if kind == "ggn":
        jac = jacrev(logits)(theta0)  # (n, C, P)
        p = torch.softmax(logits(theta0), dim=1)
        lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
        return torch.einsum("ncp,ncd,ndq->pq", jac, lam, jac) / n
    per_example = jacrev(lambda t: F.cross_entropy(logits(t), y, reduction="none"))(theta0)
    return per_example.T @ per_example / n
