"""Confident softmax: the probe and the operators give the true tiny numbers.

``Linear(3, 3)`` with weight ``40 I`` on ``x = I``, ``y = [0, 1, 2]``: every ``p_y`` rounds to 1 in
float64, so torch's cross-entropy backward (``p_y - 1``) returns 0 for the label entry. The
brute force (tests/probe/oracle.py) differentiates ``log1p(sum_{j != y} exp(z_j - z_y))``, which
never forms ``1 - p_y``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope.curvature.products import make_operator
from stepscope.probe import DenseProbe
from tests.probe.oracle import fisher_and_mean, per_example_gradients, stable_ce

RTOL = 1e-10


def confident(margin: float = 40.0, dtype: torch.dtype = torch.float64) -> nn.Linear:
    lin = nn.Linear(3, 3).to(dtype)
    with torch.no_grad():
        lin.weight.copy_(margin * torch.eye(3, dtype=dtype))
        lin.bias.zero_()
    return lin


def batch(dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.eye(3, dtype=dtype), torch.tensor([0, 1, 2])


def dense_matrices(model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """Brute-force float64 empirical Fisher and CE-GGN of the mean loss, ``(P, P)``."""
    grads = per_example_gradients(model, x, y)
    g = torch.cat([t.reshape(x.shape[0], -1) for t in grads.values()], 1)
    n = x.shape[0]
    fisher = g.T @ g / n
    params = dict(model.named_parameters())
    names = list(params)

    def logits_of(flat: torch.Tensor, i: int) -> torch.Tensor:
        chunks = torch.split(flat, [p.numel() for p in params.values()])
        ps = {k: c.reshape(params[k].shape) for k, c in zip(names, chunks)}
        return torch.func.functional_call(model, ps, (x[i : i + 1],))[0]

    theta = torch.cat([p.detach().reshape(-1) for p in params.values()])
    ggn = torch.zeros(theta.numel(), theta.numel(), dtype=torch.float64)
    for i in range(n):
        jac = torch.autograd.functional.jacobian(lambda t, i=i: logits_of(t, i), theta)
        z = logits_of(theta, i).detach()
        hess = torch.autograd.functional.hessian(
            lambda v, i=i: stable_ce(v.reshape(1, -1), y[i : i + 1]).sum(), z
        )
        ggn += jac.T @ hess @ jac / n
    return fisher, ggn


def test_probe_fisher_trace_of_a_confident_softmax_is_the_true_tiny_value():
    model = confident()
    x, y = batch()
    record = DenseProbe(x, y, size=3).measure(model, step=0, examples_seen=0, epoch=0)
    truth = per_example_gradients(model, x, y)
    for part, block in (("weight", record.layers[""]), ("bias", record.layers[""].bias)):
        fisher, mean_sq = fisher_and_mean(truth[part])
        assert fisher > 0  # 1.08e-34 for the weight: not 0, not a third of it
        assert block.fisher_trace == pytest.approx(fisher, rel=RTOL, abs=0)
        assert block.mean_grad_sq_norm == pytest.approx(mean_sq, rel=RTOL, abs=0)
    assert record.model.logit_gradient_underflow_targets == 0


def test_float32_probe_is_accurate_at_margin_40_and_flags_underflow_beyond_the_dtype():
    x, y = batch(torch.float32)
    record = DenseProbe(x, y, size=3).measure(
        confident(40.0, torch.float32), step=0, examples_seen=0, epoch=0
    )
    fisher, _ = fisher_and_mean(per_example_gradients(confident(40.0), *batch())["weight"])
    assert record.layers[""].fisher_trace == pytest.approx(fisher, rel=1e-5, abs=0)
    assert record.model.logit_gradient_underflow_targets == 0
    # margin 120: exp(-120) underflows in float32 (not in float64): every target flagged
    record = DenseProbe(x, y, size=3).measure(
        confident(120.0, torch.float32), step=0, examples_seen=0, epoch=0
    )
    assert record.model.logit_gradient_underflow_targets == 3
    record = DenseProbe(*batch(), size=3).measure(
        confident(120.0), step=0, examples_seen=0, epoch=0
    )
    assert record.model.logit_gradient_underflow_targets == 0


@pytest.mark.parametrize("kind", ["empirical_fisher", "ggn", "hessian"])
def test_operators_match_the_dense_brute_force_at_high_confidence(kind):
    model = confident()
    x, y = batch()
    fisher, ggn = dense_matrices(model, x, y)
    truth = fisher if kind == "empirical_fisher" else ggn  # a linear model: Hessian == GGN
    op = make_operator(model, x, y, kind=kind)
    columns = torch.stack([op.matvec_flat(e) for e in torch.eye(op.dim, dtype=torch.float64)], 1)
    assert float(truth.abs().max()) > 0
    assert torch.allclose(columns, truth, rtol=RTOL, atol=RTOL * float(truth.abs().max()))
    # the top eigenvalue (the symmetric batch makes the next ones multiple: Lanczos finds one copy)
    top = ss.curvature.top_eigenvalues(model, x, y, k=1, kind=kind, tol=1e-9)
    dense = torch.linalg.eigvalsh(truth).flip(0)[:1]
    assert all(top.converged)
    assert top.values == pytest.approx(dense.tolist(), rel=1e-8, abs=0)


def test_hutchinson_trace_of_the_confident_empirical_fisher_is_not_zero():
    model = confident()
    x, y = batch()
    fisher, _ = dense_matrices(model, x, y)
    est = ss.curvature.trace(model, x, y, kind="empirical_fisher", samples=64)
    truth = float(torch.trace(fisher))
    assert est.estimate > 0 and est.standard_error is not None
    assert abs(est.estimate - truth) <= 6 * est.standard_error


def test_mean_gradient_direction_uses_the_cancellation_free_gradient():
    model = confident()
    x, y = batch()
    _, ggn = dense_matrices(model, x, y)
    grads = per_example_gradients(model, x, y)
    g = torch.cat([t.mean(0).reshape(-1) for t in grads.values()])
    result = ss.curvature.directional(model, x, y, "mean_gradient", kind="ggn")
    assert result.direction_norm == pytest.approx(float(g.norm()), rel=RTOL, abs=0)
    assert result.value == pytest.approx(float(g @ ggn @ g / (g @ g)), rel=1e-8, abs=0)
