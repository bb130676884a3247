"""Independent float64 brute force for the probe and curvature verification tests.

Nothing here uses stepscope. The cross-entropy is written as
``-log p_y = log1p(sum_{j != y} exp(z_j - z_y))``, whose autograd derivatives never form
``1 - p_y`` (so a confident prediction keeps its tiny gradient), and every per-example gradient
comes from its own ``torch.autograd.grad`` call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn


def stable_ce(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-row cross-entropy ``log1p(sum_{j != y} exp(z_j - z_y))`` (cancellation-free autograd)."""
    z = logits - logits.gather(1, labels.reshape(-1, 1))
    others = torch.ones_like(z, dtype=torch.bool).scatter(1, labels.reshape(-1, 1), False)
    return torch.log1p((z.exp() * others).sum(1))


def scored_rows(out: Tensor, y: Tensor, next_token: bool) -> tuple[Tensor, Tensor]:
    """``(rows, labels)`` of the scored targets of one example's output (``-100`` dropped)."""
    if y.dim() == 0:
        return out.reshape(1, -1), y.reshape(1)
    if next_token:
        out, y = out[:-1], y[1:]
    keep = y != -100
    return out[keep], y[keep]


def per_example_gradients(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    *,
    call: Callable[[nn.Module, Tensor], Tensor] | None = None,
    next_token: bool = False,
) -> dict[str, Tensor]:
    """``name -> (n, *shape)`` per-example gradients of each example's summed CE, one
    ``autograd.grad`` per example (the example run alone: batch of one).

    ``call(model, x_i)`` returns the logits of a batch of one (default ``model(x_i)``).
    """
    call = call or (lambda m, xi: m(xi))
    names = [k for k, p in model.named_parameters() if p.requires_grad]
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    rows: dict[str, list[Tensor]] = {k: [] for k in names}
    for i in range(x.shape[0]):
        out = call(model, x[i : i + 1])[0]
        logits, labels = scored_rows(out, y[i], next_token)
        loss = stable_ce(logits, labels).sum()
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for k, p, g in zip(names, params, grads):
            rows[k].append(torch.zeros_like(p) if g is None else g.detach())
    return {k: torch.stack(v) for k, v in rows.items()}


def fisher_and_mean(per_example: Tensor) -> tuple[float, float]:
    """``(mean_i ||g_i||^2, ||mean_i g_i||^2)`` of ``(n, ...)`` per-example gradients."""
    flat = per_example.reshape(per_example.shape[0], -1)
    return float(flat.square().sum(1).mean()), float(flat.mean(0).square().sum())
