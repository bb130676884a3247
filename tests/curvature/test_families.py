"""Block diagonals and KFAC summaries against dense float64 parameter-space oracles.

Oracles: per-example CE gradients, logit Jacobians and CE logit Hessians from ``torch.func``
(``grad``, ``jacrev``, ``hessian``), assembled into dense parameter-space EF / GGN / Jacobian-Gram
blocks; KFAC matrices assembled explicitly with ``torch.kron`` from layer-output Jacobians.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, hessian, jacrev

import stepscope as ss
from stepscope.curvature.families import ce_hessian_sqrt, ce_logit_hessian
from stepscope.probe.crossentropy import ce_logit_gradient, softmax_and_complement

CASES = [
    {
        "id": "tanh_mlp_bias_mix",
        "seed": 0,
        "widths": [5, 4, 4, 3],
        "bias": [True, False, True],
        "n": 7,
    },
    {"id": "wide_layer_gram_path", "seed": 1, "widths": [6, 40, 3], "bias": [True, True], "n": 3},
]


def make_model(case: dict) -> nn.Sequential:
    torch.manual_seed(case["seed"])
    w, mods = case["widths"], []
    for i, b in enumerate(case["bias"]):
        mods.append(nn.Linear(w[i], w[i + 1], bias=b))
        if i < len(case["bias"]) - 1:
            mods.append(nn.Tanh())
    return nn.Sequential(*mods)


def make_data(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(case["seed"] + 100)
    x = torch.randn(case["n"], case["widths"][0], generator=g)
    y = torch.randint(0, case["widths"][-1], (case["n"],), generator=g)
    return x, y


def ce_sum(z: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(z.unsqueeze(0), yi.unsqueeze(0), reduction="sum")


def dense_blocks(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Dense per-parameter EF, GGN and Jacobian-Gram blocks (float64, torch.func)."""
    m = copy.deepcopy(model).double()
    params = {k: v.detach() for k, v in m.named_parameters()}
    xd = x.double()

    def logits_fn(p, xi):
        return functional_call(m, p, (xi.unsqueeze(0),)).squeeze(0)

    out = {k: {"empirical_fisher": 0, "ce_ggn": 0, "jacobian_gram": 0} for k in params}
    n = x.shape[0]
    for i in range(n):
        xi, yi = xd[i], y[i]
        g = grad(lambda p, xi=xi, yi=yi: ce_sum(logits_fn(p, xi), yi))(params)
        jac = jacrev(logits_fn)(params, xd[i])
        f = logits_fn(params, xd[i])
        h = hessian(lambda z, yi=yi: ce_sum(z, yi))(f)
        for k in params:
            gv = g[k].reshape(-1)
            jm = jac[k].reshape(f.shape[0], -1)
            out[k]["empirical_fisher"] = out[k]["empirical_fisher"] + torch.outer(gv, gv) / n
            out[k]["ce_ggn"] = out[k]["ce_ggn"] + jm.T @ h @ jm / n
            out[k]["jacobian_gram"] = out[k]["jacobian_gram"] + jm.T @ jm / n
    return out


def explicit_kfac(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, idx: int) -> dict:
    """kron(Bbar, Abar) per family for Sequential layer ``idx``, from torch.func Jacobians."""
    m = copy.deepcopy(model).double()
    xd = x.double()
    a = m[:idx](xd).detach()
    z = m[: idx + 1](xd).detach()
    head = m[idx + 1 :]
    n = x.shape[0]
    abar = a.T @ a / n
    bbars = {"empirical_fisher": 0, "ce_ggn": 0, "jacobian_gram": 0}
    for i in range(n):
        jz = jacrev(lambda zi: head(zi.unsqueeze(0)).squeeze(0))(z[i])  # (C, d_out)
        f = head(z[i].unsqueeze(0)).squeeze(0).detach()
        v = grad(lambda zz, yi=y[i]: ce_sum(zz, yi))(f)
        h = hessian(lambda zz, yi=y[i]: ce_sum(zz, yi))(f)
        b = jz.T @ v
        bbars["empirical_fisher"] = bbars["empirical_fisher"] + torch.outer(b, b) / n
        bbars["ce_ggn"] = bbars["ce_ggn"] + jz.T @ h @ jz / n
        bbars["jacobian_gram"] = bbars["jacobian_gram"] + jz.T @ jz / n
    return {k: (torch.kron(b, abar), abar, b) for k, b in bbars.items()}


def erank(eigs: torch.Tensor) -> float:
    w = eigs.clamp(min=0)
    w = w[w > 1e-300] / w.sum()
    return math.exp(-(w * w.log()).sum().item())


@pytest.fixture(scope="module", params=CASES, ids=[c["id"] for c in CASES])
def analysed(request):
    case = request.param
    model = make_model(case)
    x, y = make_data(case)
    return case, model, x, y, ss.analyze_curvature(model, x, y)


def test_weight_and_bias_diagonals_match_dense_blocks(analysed):
    _, model, x, y, out = analysed
    dense = dense_blocks(model, x, y)
    for idx, lin in enumerate(model):
        if not isinstance(lin, nn.Linear):
            continue
        layer = out["layers"][str(idx)]
        for fam in ("empirical_fisher", "ce_ggn", "jacobian_gram"):
            for part in ("weight", "bias"):
                key = f"{idx}.{part}"
                got = layer[fam][part]
                if key not in dense:
                    assert got is None
                    continue
                d = torch.diagonal(dense[key][fam])
                want = {
                    "diag_max": d.max(),
                    "frobenius": d.norm(),
                    "trace": d.sum(),
                    "average": d.mean(),
                }
                for k, v in want.items():
                    assert got[k] == pytest.approx(v.item(), rel=1e-9, abs=1e-14), (key, fam, k)


def test_kfac_summaries_match_explicit_kronecker_products(analysed):
    _, model, x, y, out = analysed
    dense = dense_blocks(model, x, y)
    for idx, lin in enumerate(model):
        if not isinstance(lin, nn.Linear):
            continue
        kf = explicit_kfac(model, x, y, idx)
        layer = out["layers"][str(idx)]
        a_eigs = torch.linalg.eigvalsh(kf["jacobian_gram"][1]).flip(0)
        got_a = layer["activation_factor"]["eigenvalues"]
        assert torch.allclose(
            torch.tensor(got_a, dtype=torch.float64), a_eigs[: len(got_a)], rtol=1e-9, atol=1e-12
        )
        assert layer["activation_factor"]["implicit_zero_eigenvalues"] == len(a_eigs) - len(got_a)
        for fam, (kron, _, bbar) in kf.items():
            eigs = torch.linalg.eigvalsh(kron)
            got = layer[fam]["kfac"]
            assert got["trace"] == pytest.approx(kron.trace().item(), rel=1e-9)
            assert got["frobenius"] == pytest.approx(kron.norm().item(), rel=1e-9)
            assert got["top_eigenvalue"] == pytest.approx(eigs.max().item(), rel=1e-9)
            assert got["stable_rank"] == pytest.approx(
                (eigs**2).sum().item() / eigs.max().item() ** 2, rel=1e-8
            )
            assert got["effective_rank"] == pytest.approx(erank(eigs), rel=1e-6)
            block_diag = torch.diagonal(dense[f"{idx}.weight"][fam])
            want_err = (torch.diagonal(kron) - block_diag).abs().mean() / block_diag.abs().mean()
            assert got["relative_diagonal_error"] == pytest.approx(want_err.item(), rel=1e-8)
            b_eigs = torch.linalg.eigvalsh(bbar).flip(0)
            got_b = torch.tensor(layer[fam]["backprop_factor"]["eigenvalues"], dtype=torch.float64)
            assert torch.allclose(got_b, b_eigs[: len(got_b)], rtol=1e-9, atol=1e-12)


def test_empirical_fisher_kfac_differs_from_exact_block():
    """KFAC is an approximation: on a generic MLP its diagonal error is strictly positive."""
    model = make_model(CASES[0])
    x, y = make_data(CASES[0])
    out = ss.analyze_curvature(model, x, y)
    assert out["layers"]["0"]["empirical_fisher"]["kfac"]["relative_diagonal_error"] > 1e-3


def test_saturated_softmax_factors_keep_relative_accuracy():
    import mpmath

    mpmath.mp.dps = 50
    logits = torch.tensor([[0.0, -40.0, -45.0], [60.0, 0.0, 1.0]], dtype=torch.float64)
    labels = torch.tensor([0, 0])
    p, q = softmax_and_complement(logits)
    assert 1 - p[0, 0].item() < 1e-12  # genuinely saturated
    for i, row in enumerate(logits.tolist()):
        ex = [mpmath.e ** mpmath.mpf(v) for v in row]
        tot = sum(ex)
        for k in range(3):
            pk = ex[k] / tot
            assert q[i, k].item() == pytest.approx(float(1 - pk), rel=1e-13)
            hk = pk * (1 - pk)
            assert ce_logit_hessian(logits)[i, k, k].item() == pytest.approx(float(hk), rel=1e-13)
        g = ce_logit_gradient(logits, labels)[i, 0].item()
        assert g == pytest.approx(float(ex[0] / tot - 1), rel=1e-13)
    s = ce_hessian_sqrt(logits)
    assert torch.allclose(s.transpose(1, 2) @ s, ce_logit_hessian(logits), rtol=1e-12, atol=1e-300)


def test_saturated_probe_gives_finite_accurate_analysis():
    """p_y within 1e-12 of one: float64 `1 - p` would give exact zeros; mpmath is the oracle."""
    import mpmath

    mpmath.mp.dps = 50
    model = make_model(CASES[0])
    with torch.no_grad():
        model[-1].weight.mul_(0.01)
        model[-1].bias.copy_(torch.tensor([40.0, 0.0, 2.0]))
    x, _ = make_data(CASES[0])
    y = torch.zeros(x.shape[0], dtype=torch.int64)
    m64 = copy.deepcopy(model).double()
    a = m64[:4](x.double()).detach()
    logits = m64(x.double()).detach()
    assert (1 - torch.softmax(logits, 1)[:, 0]).max() < 1e-12
    naive = torch.softmax(logits, 1)[:, 0] - 1  # what a `p - 1` implementation sees
    assert (naive == 0).any()
    out = ss.analyze_curvature(model, x, y)
    ef_trace, ggn_trace = mpmath.mpf(0), mpmath.mpf(0)
    for i, row in enumerate(logits.tolist()):
        ex = [mpmath.e ** mpmath.mpf(v) for v in row]
        p = [e / sum(ex) for e in ex]
        v = [p[0] - 1, *p[1:]]
        a2 = mpmath.mpf(float((a[i] ** 2).sum()))
        ef_trace += sum(t * t for t in v) * a2
        ggn_trace += sum(pk * (1 - pk) for pk in p) * a2
    n = x.shape[0]
    got = out["layers"]["4"]
    assert got["empirical_fisher"]["weight"]["trace"] == pytest.approx(
        float(ef_trace / n), rel=1e-9
    )
    assert got["ce_ggn"]["weight"]["trace"] == pytest.approx(float(ggn_trace / n), rel=1e-9)
    assert got["empirical_fisher"]["weight"]["trace"] > 0


def conv_model() -> nn.Sequential:
    torch.manual_seed(5)
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.Tanh(), nn.Flatten(), nn.Linear(27, 4)
    )


def test_conv2d_weight_and_bias_diagonals_match_dense_blocks():
    """Conv2d blocks: per-example gradients sum over output positions (exact diagonal)."""
    model = conv_model()
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(5, 2, 5, 5, generator=g), torch.randint(0, 4, (5,), generator=g)
    out = ss.analyze_curvature(model, x, y)
    dense = dense_blocks(model, x, y)
    assert out["metadata"]["layer_shapes"]["0"]["positions"] == 9
    for layer in ("0", "3"):
        for fam in ("empirical_fisher", "ce_ggn", "jacobian_gram"):
            for part in ("weight", "bias"):
                d = torch.diagonal(dense[f"{layer}.{part}"][fam])
                got = out["layers"][layer][fam][part]
                assert got["trace"] == pytest.approx(d.sum().item(), rel=1e-9), (layer, fam, part)
                assert got["diag_max"] == pytest.approx(d.max().item(), rel=1e-9)
                assert got["frobenius"] == pytest.approx(d.norm().item(), rel=1e-9)
