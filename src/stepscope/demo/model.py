"""The reference model: a Ciresan-style deep MLP (see ``docs/LEGACY_METRICS.md``).

Widths 784-2500-2000-1500-1000-500-10 with a ReLU after every Linear, *including the last* when
``final_relu=True`` (the legacy study's logits passed through a ReLU, the source of dead classes),
and optional Dropout after each hidden layer. ``width_scale`` shrinks the hidden widths so a CPU run
takes seconds; ``residual=True`` adds identity skips around equal-width hidden pairs.

Example
-------
>>> m = ciresan_mlp(n_inputs=784, width_scale=0.05)
>>> sum(p.numel() for p in m.parameters()) < 200_000
True
"""

from __future__ import annotations

import torch
from torch import nn

CIRESAN_WIDTHS: tuple[int, ...] = (2500, 2000, 1500, 1000, 500)


class Residual(nn.Module):
    """``x + block(x)`` for a width-preserving block, with optional stochastic depth.

    With ``survival < 1`` the block runs in training with probability ``survival`` (drawn from
    the global RNG, like dropout) and its output is scaled by ``1 / survival``; a skipped block
    returns ``x`` untouched. ``last_active`` says whether the block ran in the last forward, so a
    training loop can log the branch activity (``collector.log_mask``). Eval always runs it.
    """

    def __init__(self, block: nn.Module, survival: float = 1.0) -> None:
        super().__init__()
        if not 0.0 < survival <= 1.0:
            raise ValueError(f"survival probability must be in (0, 1], got {survival}")
        self.block, self.survival, self.last_active = block, survival, True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.survival < 1.0:
            self.last_active = bool(torch.rand(()) < self.survival)
            return x + self.block(x) / self.survival if self.last_active else x
        self.last_active = True
        return x + self.block(x)


def ciresan_mlp(
    n_inputs: int = 784,
    n_classes: int = 10,
    width_scale: float = 1.0,
    final_relu: bool = False,
    dropout: float = 0.0,
    residual: bool = False,
    survival: float = 1.0,
) -> nn.Sequential:
    """Build the reference MLP.

    Parameters
    ----------
    n_inputs, n_classes
        Input features and output classes.
    width_scale
        Multiplies every hidden width (rounded, at least 8).
    final_relu
        Put a ReLU after the last Linear too (the legacy study's choice).
    dropout
        Dropout probability after each hidden ReLU (0 disables).
    residual
        Add one extra width-preserving hidden block with an identity skip after each hidden layer.
    survival
        Stochastic-depth survival probability of those residual blocks (1: always run).
    """
    widths = [max(8, round(w * width_scale)) for w in CIRESAN_WIDTHS]
    layers: list[nn.Module] = []
    prev = n_inputs
    for w in widths:
        layers += [nn.Linear(prev, w), nn.ReLU()]
        if residual:
            layers.append(Residual(nn.Sequential(nn.Linear(w, w), nn.ReLU()), survival))
        if dropout > 0:
            layers.append(nn.Dropout(dropout))
        prev = w
    layers.append(nn.Linear(prev, n_classes))
    if final_relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)
