"""Directional quotients against per-example torch.func gradients and explicit kron(Bbar, Abar)."""

from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, hessian, jacrev, vmap

import stepscope as ss
from stepscope.curvature.quotients import directional_metrics, gradient_moments


def ce_sum(z: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(z.unsqueeze(0), yi.unsqueeze(0), reduction="sum")


def tiny_mlp(seed: int = 3) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def data(seed: int = 4, n: int = 6):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def oracle(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, idx: int) -> dict:
    m = copy.deepcopy(model).double()
    params = {k: v.detach() for k, v in m.named_parameters()}
    xd = x.double()
    n = x.shape[0]

    def loss(p, xi, yi):
        z = functional_call(m, p, (xi.unsqueeze(0),))
        return F.cross_entropy(z, yi.unsqueeze(0), reduction="sum")

    per_ex = vmap(grad(loss), in_dims=(None, 0, 0))(params, xd, y)[f"{idx}.weight"]  # (n, out, in)
    a = m[:idx](xd).detach()
    z = m[: idx + 1](xd).detach()
    head = m[idx + 1 :]
    abar = a.T @ a / n
    bbar = {"empirical_fisher": 0, "ce_ggn": 0, "jacobian_gram": 0}
    for i in range(n):
        jz = jacrev(lambda zi: head(zi.unsqueeze(0)).squeeze(0))(z[i])
        f = head(z[i].unsqueeze(0)).squeeze(0).detach()
        ce = lambda t, yi=y[i]: F.cross_entropy(t.unsqueeze(0), yi.unsqueeze(0), reduction="sum")  # noqa: E731
        b = jz.T @ grad(ce)(f)
        bbar["empirical_fisher"] = bbar["empirical_fisher"] + torch.outer(b, b) / n
        bbar["ce_ggn"] = bbar["ce_ggn"] + jz.T @ hessian(ce)(f) @ jz / n
        bbar["jacobian_gram"] = bbar["jacobian_gram"] + jz.T @ jz / n
    gvec = per_ex.reshape(n, -1)
    mean = gvec.mean(0)
    sigma = gvec.T @ gvec / n - torch.outer(mean, mean)
    k_ef = torch.kron(bbar["empirical_fisher"], abar)
    out = {}
    for fam, b in bbar.items():
        k = torch.kron(b, abar)
        q_each = torch.einsum("ip,pq,iq->i", gvec, k, gvec)
        q_mean = mean @ k @ mean
        out[fam] = {
            "q_mean": q_mean.item(),
            "rq_mean": (q_mean / mean.dot(mean)).item(),
            "rq_each": (q_each / (gvec**2).sum(1)).tolist(),
            "cov": torch.trace(k @ sigma).item(),
            "fact": torch.trace(k @ k_ef).item(),
            "norm_mean": q_each.sqrt().mean().item(),
        }
    out["sigma_trace"] = sigma.trace().item()
    out["g2"] = mean.dot(mean).item()
    out["per_sq"] = (gvec**2).sum(1).mean().item()
    return out


@pytest.mark.parametrize("idx", [0, 2])
def test_directional_quotients_match_explicit_kfac(idx):
    model = tiny_mlp()
    x, y = data()
    out = ss.analyze_curvature(model, x, y)["directional"][str(idx)]
    want = oracle(model, x, y, idx)
    mom = out["gradient_moments"]
    assert mom["covariance_trace"] == pytest.approx(want["sigma_trace"], rel=1e-9)
    assert mom["mean_gradient_sq_norm"] == pytest.approx(want["g2"], rel=1e-9)
    assert mom["gradient_diversity"] == pytest.approx(
        want["per_sq"] / (x.shape[0] * want["g2"]), rel=1e-9
    )
    assert mom["simple_noise_scale"] == pytest.approx(want["sigma_trace"] / want["g2"], rel=1e-9)
    for fam in ("empirical_fisher", "ce_ggn", "jacobian_gram"):
        got, w = out[fam], want[fam]
        assert got["mean_gradient_quadratic_form"] == pytest.approx(w["q_mean"], rel=1e-9)
        assert got["mean_gradient_rayleigh_quotient"] == pytest.approx(w["rq_mean"], rel=1e-9)
        each = torch.tensor(w["rq_each"], dtype=torch.float64)
        pe = got["per_example_rayleigh_quotient"]
        assert pe["mean"] == pytest.approx(each.mean().item(), rel=1e-9)
        assert pe["max"] == pytest.approx(each.max().item(), rel=1e-9)
        assert pe["valid_count"] == pe["total_count"] == x.shape[0]
        assert got["covariance_contraction"] == pytest.approx(w["cov"], rel=1e-8)
        assert got["covariance_contraction_ratio"] == pytest.approx(
            w["cov"] / w["q_mean"], rel=1e-8
        )
        assert got["factorized_noise_contraction"] == pytest.approx(w["fact"], rel=1e-9)
        assert got["factorized_noise_contraction_centered"] == pytest.approx(
            w["fact"] - w["q_mean"], rel=1e-8
        )
        assert got["weighted_gradient_norm_mean"] == pytest.approx(w["norm_mean"], rel=1e-9)


def test_zero_mean_gradient_gives_none_with_validity():
    a = torch.ones(2, 3, dtype=torch.float64)
    b = torch.tensor([[1.0, 2.0], [-1.0, -2.0]], dtype=torch.float64)
    mom = gradient_moments(a, b)
    assert mom["mean_gradient_zero"] and mom["gradient_diversity"] is None
    assert mom["simple_noise_scale"] is None
    d = directional_metrics(a, b, b.unsqueeze(0), b)
    assert d["mean_gradient_rayleigh_quotient"] is None
    assert d["covariance_contraction_ratio"] is None
    assert d["validity"]["mean_gradient_zero"]
    assert d["covariance_contraction"] > 0  # the spread is still measured


def test_zero_per_example_gradients_are_counted_invalid():
    a = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.5, 1.0]], dtype=torch.float64)
    b = torch.tensor([[1.0], [3.0], [2.0]], dtype=torch.float64)
    d = directional_metrics(a, b, b.unsqueeze(0), b)
    pe = d["per_example_rayleigh_quotient"]
    assert (pe["valid_count"], pe["total_count"]) == (2, 3)


def test_centered_factorized_noise_can_be_negative_and_is_not_clipped():
    # a small empirical-Fisher factor makes tr(K K_F) smaller than q(G): centred value < 0
    a = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64)
    b = torch.tensor([[1.0], [1.0]], dtype=torch.float64)
    fam = torch.tensor([[[1.0], [1.0]]], dtype=torch.float64)
    d = directional_metrics(a, b, fam, torch.tensor([[1.0], [1.0]], dtype=torch.float64) * 0.1)
    assert d["factorized_noise_contraction_centered"] < 0


def test_conv2d_directional_quotients_match_explicit_patches_and_kron():
    """Conv2d: per-example gradients from torch.func; patches sliced by hand; kron(Bbar, Abar)."""
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.Tanh(), nn.Flatten(), nn.Linear(27, 4)
    )
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(5, 2, 5, 5, generator=g), torch.randint(0, 4, (5,), generator=g)
    out = ss.analyze_curvature(model, x, y)["directional"]["0"]
    m = copy.deepcopy(model).double()
    xd, n = x.double(), x.shape[0]
    params = {k: v.detach() for k, v in m.named_parameters()}

    def loss(p, xi, yi):
        z = functional_call(m, p, (xi.unsqueeze(0),))
        return F.cross_entropy(z, yi.unsqueeze(0), reduction="sum")

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(params, xd, y)["0.weight"].reshape(n, -1)
    xpad = F.pad(xd, (1, 1, 1, 1))
    patches = torch.stack(
        [
            xpad[:, :, 2 * r : 2 * r + 3, 2 * c : 2 * c + 3].reshape(n, -1)
            for r in range(3)
            for c in range(3)
        ],
        dim=1,
    )  # (n, 9, 18)
    abar = torch.einsum("npd,npe->de", patches, patches) / (n * 9)
    z = m[0](xd).detach()
    head = m[1:]
    bbar = {"empirical_fisher": 0, "ce_ggn": 0, "jacobian_gram": 0}
    for i in range(n):
        jz = jacrev(lambda zi: head(zi.unsqueeze(0)).squeeze(0))(z[i]).reshape(4, 3, 9)
        f = head(z[i].unsqueeze(0)).squeeze(0).detach()
        ce = partial(ce_sum, yi=y[i])
        v = grad(ce)(f)
        h = hessian(ce)(f)
        for p in range(9):
            jp = jz[:, :, p]  # (C, c_out)
            b = jp.T @ v
            bbar["empirical_fisher"] = bbar["empirical_fisher"] + torch.outer(b, b) / n
            bbar["ce_ggn"] = bbar["ce_ggn"] + jp.T @ h @ jp / n
            bbar["jacobian_gram"] = bbar["jacobian_gram"] + jp.T @ jp / n
    mean = grads.mean(0)
    sigma = grads.T @ grads / n - torch.outer(mean, mean)
    k_ef = torch.kron(bbar["empirical_fisher"], abar)
    assert out["gradient_moments"]["covariance_trace"] == pytest.approx(
        sigma.trace().item(), rel=1e-9
    )
    for fam, b in bbar.items():
        k = torch.kron(b, abar)
        q_mean = (mean @ k @ mean).item()
        q_each = torch.einsum("ip,pq,iq->i", grads, k, grads)
        got = out[fam]
        assert got["mean_gradient_quadratic_form"] == pytest.approx(q_mean, rel=1e-9)
        assert got["mean_gradient_rayleigh_quotient"] == pytest.approx(
            q_mean / mean.dot(mean).item(), rel=1e-9
        )
        rq = q_each / (grads**2).sum(1)
        assert got["per_example_rayleigh_quotient"]["mean"] == pytest.approx(
            rq.mean().item(), rel=1e-9
        )
        assert got["covariance_contraction"] == pytest.approx(
            torch.trace(k @ sigma).item(), rel=1e-8
        )
        assert got["factorized_noise_contraction"] == pytest.approx(
            torch.trace(k @ k_ef).item(), rel=1e-9
        )
