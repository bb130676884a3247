"""Tiny models and the brute-force float64 per-example oracle shared by the probe tests.

The oracle never uses the probe's algebra: for every example it runs a float64 copy of the model
on that example alone, calls ``torch.autograd.grad`` of that example's loss with respect to the
parameters and the layer outputs, and reduces the explicit per-example gradients.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class SeqMLP(nn.Module):
    """Linear layers applied to (n, T, d) input: per-example gradients sum over positions."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.inner(x)).mean(1))


def make_model(kind: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "mlp":
        return nn.Sequential(
            nn.Linear(6, 10),
            nn.ReLU(),
            nn.Dropout(0.3),
            nn.Linear(10, 8),
            nn.ReLU(),
            nn.Linear(8, 4),
        )
    if kind == "mlp_nobias":
        return nn.Sequential(nn.Linear(6, 10, bias=False), nn.ReLU(), nn.Linear(10, 4, bias=False))
    if kind == "cnn":
        return nn.Sequential(
            nn.Conv2d(2, 4, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(4, 3, 3, stride=2, bias=False),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3 * 3 * 3, 5),
        )
    if kind == "cnn_same":
        return nn.Sequential(
            nn.Conv2d(2, 3, (2, 3), padding="same", dilation=(1, 2)),
            nn.ReLU(),
            nn.Conv2d(3, 2, 3, padding=1, padding_mode="reflect"),
            nn.Flatten(),
            nn.Linear(2 * 7 * 7, 3),
        )
    if kind == "seq":
        return SeqMLP()
    raise ValueError(kind)


def make_data(kind: str, n: int = 24, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape, classes = {
        "mlp": ((6,), 4),
        "mlp_nobias": ((6,), 4),
        "cnn": ((2, 7, 7), 5),
        "cnn_same": ((2, 7, 7), 3),
        "seq": ((5, 4), 3),
    }[kind]
    x = torch.randn(n, *shape, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def brute_force(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, layer_names: list[str]
) -> dict[str, Any]:
    """Per-layer reference values from an explicit float64 per-example loop."""
    m64 = copy.deepcopy(model).double().eval()
    modules = dict(m64.named_modules())
    n = x.shape[0]
    grads: dict[str, list[np.ndarray]] = {}
    zeros: dict[str, list[int]] = {name: [0, 0, 0, 0] for name in layer_names}
    losses, preds = [], []
    for i in range(n):
        seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        handles = [
            modules[name].register_forward_hook(
                lambda m, a, o, name=name, seen=seen: seen.__setitem__(name, (a[0], o))
            )
            for name in layer_names
        ]
        try:
            logits = m64(x[i : i + 1].double())
        finally:
            for h in handles:
                h.remove()
        loss = F.cross_entropy(logits, y[i : i + 1], reduction="sum")
        losses.append(float(loss.detach()))
        preds.append(int(logits.argmax(1)))
        targets: list[torch.Tensor] = []
        for name in layer_names:
            mod = modules[name]
            targets += [mod.weight] + ([mod.bias] if mod.bias is not None else [])
            targets.append(seen[name][1])
        out = torch.autograd.grad(loss, targets)
        k = 0
        for name in layer_names:
            mod = modules[name]
            grads.setdefault(f"{name}.weight", []).append(out[k].detach().numpy().ravel())
            k += 1
            if mod.bias is not None:
                grads.setdefault(f"{name}.bias", []).append(out[k].detach().numpy().ravel())
                k += 1
            a, b = seen[name][0], out[k]
            k += 1
            zeros[name][0] += int((a == 0).sum())
            zeros[name][1] += a.numel()
            zeros[name][2] += int((b == 0).sum())
            zeros[name][3] += b.numel()
    ref: dict[str, Any] = {"loss": float(np.mean(losses)), "preds": preds, "blocks": {}}
    for key, rows in grads.items():
        g = np.stack(rows)  # (n, P): explicit per-example gradients
        sq = (g**2).sum(1)
        mean = g.mean(0)
        total = g.sum(0)
        norms = np.sqrt(sq)
        ref["blocks"][key] = {
            "fisher_trace": sq.mean(),
            "mean_grad_sq_norm": (mean**2).sum(),
            "covariance_trace": ((g - mean) ** 2).sum(1).mean(),
            "gradient_diversity": sq.sum() / (total**2).sum(),
            "grad_norm_rms": np.sqrt(sq.mean()),
            "grad_fro_legacy_scale": np.sqrt((mean**2).sum()),
            "quantiles": {
                "min": norms.min(),
                "median": np.median(norms),
                "max": norms.max(),
                "q25": np.quantile(norms, 0.25),
                "q75": np.quantile(norms, 0.75),
            },
        }
    ref["zeros"] = {k: (v[0] / v[1], v[2] / v[3]) for k, v in zeros.items()}
    return ref
