"""Factor spectra (small-Gram path, labelled approximate path) and forward capture behaviour."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope.curvature.factors import APPROX_METHOD, EXACT_METHOD, factor_spectrum


def dense_eigs(rows: torch.Tensor, n: int) -> torch.Tensor:
    return torch.linalg.eigvalsh(rows.T @ rows / n).flip(0)


@pytest.mark.parametrize("shape", [(30, 6), (6, 30)], ids=["tall_dxd_path", "wide_gram_path"])
def test_exact_spectrum_matches_dense_covariance(shape):
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(*shape, generator=g, dtype=torch.float64)
    sp = factor_spectrum(rows, n=5, eig_max_dimension=100)
    want = dense_eigs(rows, 5)
    m = min(shape)
    assert sp["method"] == EXACT_METHOD
    assert (sp["dimension"], sp["eigenproblem_dimension"]) == (shape[1], m)
    assert sp["implicit_zero_eigenvalues"] == shape[1] - m
    torch.testing.assert_close(
        torch.tensor(sp["eigenvalues"], dtype=torch.float64), want[:m], rtol=1e-10, atol=1e-12
    )
    assert all(abs(v) < 1e-12 for v in want[m:].tolist())  # the uncounted part really is zero
    assert sp["trace"] == pytest.approx(want.sum().item(), rel=1e-12)
    assert sp["frobenius"] == pytest.approx(want.norm().item(), rel=1e-12)
    w = want.clamp(min=0) / want.clamp(min=0).sum()
    w = w[w > 0]
    assert sp["effective_rank"] == pytest.approx(math.exp(-(w * w.log()).sum().item()), rel=1e-9)
    assert sp["stable_rank"] == pytest.approx(
        (want**2).sum().item() / want[0].item() ** 2, rel=1e-9
    )


def test_large_eigenproblem_uses_labelled_top_k_approximation():
    g = torch.Generator().manual_seed(1)
    # a decaying spectrum so that subspace iteration converges quickly
    rows = torch.randn(80, 60, generator=g, dtype=torch.float64) * torch.logspace(
        0, -3, 60, dtype=torch.float64
    )
    sp = factor_spectrum(rows, n=80, eig_max_dimension=40, seed=3)
    want = dense_eigs(rows, 80)
    assert sp["method"] == APPROX_METHOD and sp["approximate"] is True
    assert sp["converged"] and sp["iterations"] >= 1
    k = sp["top_k"]
    assert len(sp["eigenvalues"]) == k < 60
    torch.testing.assert_close(
        torch.tensor(sp["eigenvalues"][:8], dtype=torch.float64), want[:8], rtol=1e-8, atol=0
    )
    assert sp["effective_rank"] is None and "top-k" in sp["effective_rank_undefined_reason"]
    assert sp["frobenius"] == pytest.approx(want.norm().item(), rel=1e-10)


def test_analysis_logs_largest_eigenproblem_and_labels_fallback():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 30), nn.Tanh(), nn.Linear(30, 3))
    x, y = torch.randn(20, 12), torch.randint(0, 3, (20,))
    exact = ss.analyze_curvature(model, x, y)
    assert exact["metadata"]["largest_eigenproblem_dimension"] == 30  # min(30, 20 * 3 rows)
    assert exact["metadata"]["approximate_eigenproblems"] == []
    approx = ss.analyze_curvature(model, x, y, eig_max_dimension=16)
    labels = {e["factor"] for e in approx["metadata"]["approximate_eigenproblems"]}
    assert "0/ce_ggn/backprop" in labels and "0/activation" not in labels  # d_in 12 <= 16
    kf = approx["layers"]["0"]["ce_ggn"]["kfac"]
    assert kf["approximate_spectrum"] is True and kf["effective_rank"] is None
    ref = exact["layers"]["0"]["ce_ggn"]["kfac"]["top_eigenvalue"]
    assert kf["top_eigenvalue"] == pytest.approx(ref, rel=1e-8)


def test_inplace_relu_does_not_corrupt_captured_preactivations():
    torch.manual_seed(2)
    plain = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3))
    inplace = copy.deepcopy(plain)
    inplace[1] = nn.ReLU(inplace=True)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    a = ss.analyze_curvature(plain, x, y)["layers"]["0"]
    b = ss.analyze_curvature(inplace, x, y)["layers"]["0"]
    assert a == b


@pytest.mark.parametrize(
    "model, x, match",
    [
        (nn.Sequential(nn.Conv1d(1, 2, 3), nn.Flatten(), nn.Linear(4, 3)), (2, 1, 4), "Conv1d"),
        (
            nn.Sequential(nn.Conv2d(2, 2, 3, groups=2), nn.Flatten(), nn.Linear(8, 3)),
            (2, 2, 4, 4),
            "groups=2",
        ),
        (
            nn.Sequential(nn.Conv2d(1, 2, 3, padding="same"), nn.Flatten(), nn.Linear(32, 3)),
            (2, 1, 4, 4),
            "padding",
        ),
        (nn.Sequential(nn.ReLU()), (2, 3), "no nn.Linear"),
    ],
    ids=["conv1d", "grouped_conv2d", "string_padding", "no_linear"],
)
def test_unsupported_models_refuse(model, x, match):
    with pytest.raises(ss.Refusal, match=match) as err:
        ss.analyze_curvature(model, torch.randn(*x), torch.tensor([0, 1]))
    assert err.value.code == "curvature_model_unsupported" and err.value.remedies


class SharedTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        return self.lin(torch.tanh(self.lin(x)))


def test_weight_sharing_refuses_naming_the_module():
    with pytest.raises(ss.Refusal, match="'lin' ran 2 times") as err:
        ss.analyze_curvature(SharedTwice(), torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    assert err.value.code == "curvature_weight_shared" and err.value.remedies
