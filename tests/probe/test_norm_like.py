"""Norm layers resolved by behaviour, uncovered parameters listed.

The rule (docs/probe.md): a module with a 1-D ``weight``, an optional ``bias`` of the same shape
and no child parameters is measured when each call's output is ``weight * xhat + bias`` with
``xhat`` its output at ``weight = 1, bias = 0`` (checked at the weight, at 1 and at 2); else its
row is ``None`` with the reason. Checked against the float64 per-example brute force.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stepscope.probe import DenseProbe
from tests.probe.oracle import fisher_and_mean, per_example_gradients

RTOL = 1e-10


class LlamaStyleRMSNorm(nn.Module):
    """``LlamaRMSNorm``: float32 statistics, ``weight * hidden.to(input_dtype)``."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class OnePlusWeightNorm(LlamaStyleRMSNorm):
    """Gemma's ``(1 + weight)`` (weight initialised at 0): not ``weight * xhat``, refused."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__(d, eps)
        nn.init.zeros_(self.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (1.0 + self.weight) * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))


class Net(nn.Module):
    def __init__(self, norm: nn.Module, d: int = 6, classes: int = 3) -> None:
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.norm = norm
        self.cls_token = nn.Parameter(torch.randn(d) * 0.1)  # no rule: listed
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(torch.tanh(self.inp(x)) + self.cls_token))


def measure(model: nn.Module, n: int = 5):
    torch.manual_seed(4)
    x, y = torch.randn(n, 4, dtype=torch.float64), torch.randint(0, 3, (n,))
    return DenseProbe(x, y, size=n).measure(model, step=0, examples_seen=0, epoch=0), x, y


@pytest.mark.parametrize("norm", ["llama", "groupnorm_2d"])
def test_a_norm_like_module_is_measured_exactly(norm):
    torch.manual_seed(5)
    module = LlamaStyleRMSNorm(6) if norm == "llama" else nn.GroupNorm(2, 6)
    model = Net(module).double()
    with torch.no_grad():
        model.norm.weight.uniform_(0.5, 1.5)  # not the all-ones init (w == w**2 there)
    record, x, y = measure(model)
    truth = per_example_gradients(model, x, y)
    layer = record.layers["norm"]
    assert layer.kind == "elementwise_affine"
    for part, block in (("weight", layer), ("bias", layer.bias)):
        if f"norm.{part}" not in truth:
            continue
        fisher, mean_sq = fisher_and_mean(truth[f"norm.{part}"])
        assert block.fisher_trace == pytest.approx(fisher, rel=RTOL, abs=0)
        assert block.mean_grad_sq_norm == pytest.approx(mean_sq, rel=RTOL, abs=0)
    assert record.uncovered_parameters == {
        "cls_token": {
            "module_type": "Net",
            "reason": "no_per_example_rule",
            "detail": record.uncovered_parameters["cls_token"]["detail"],
        }
    }


@pytest.mark.parametrize("weight", [0.0, 1.0])  # at 1: (1 + 1) h == 1 * (2 h); the check at 2 fails
def test_a_module_that_is_not_weight_times_xhat_is_refused_on_its_row(weight):
    model = Net(OnePlusWeightNorm(6)).double()
    nn.init.constant_(model.norm.weight, weight)
    record, _, _ = measure(model)
    norm = record.layers["norm"]
    assert norm.fisher_trace is None
    assert norm.validity["gradient_absent_reason"] == (
        "output_not_linear_in_weight"
        if weight == 1.0
        else "output_not_weight_times_normalised_input"
    )
    assert record.layers["head"].fisher_trace is not None


def test_a_channel_axis_weight_is_refused_on_its_row():
    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv1d(2, 4, 3, padding=1)
            self.norm = nn.GroupNorm(2, 4)  # weight on axis 1 of (n, C, L)
            self.head = nn.Linear(4, 3)

        def forward(self, x):
            return self.head(self.norm(self.conv(x.reshape(-1, 2, 2))).mean(-1))

    record, _, _ = measure(Conv().double())
    assert record.layers["norm"].validity["gradient_absent_reason"] == (
        "weight_not_on_the_last_axis"
    )


def test_parameters_outside_layers_are_listed_as_not_selected():
    torch.manual_seed(6)
    x, y = torch.randn(4, 4), torch.randint(0, 3, (4,))
    model = Net(nn.LayerNorm(6))
    record = DenseProbe(x, y, size=4, layers=["head"]).measure(
        model, step=0, examples_seen=0, epoch=0
    )
    reasons = {k: v["reason"] for k, v in record.uncovered_parameters.items()}
    assert reasons == {
        "inp.weight": "not_selected",
        "inp.bias": "not_selected",
        "norm.weight": "not_selected",
        "norm.bias": "not_selected",
        "cls_token": "no_per_example_rule",
    }
