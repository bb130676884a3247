"""Cross-check against curvlinops on a small MLP (mean-reduced CrossEntropyLoss).

curvlinops conventions: mean reduction gives EF = (1/N) sum g_n g_n^T and
GGN = (1/N) sum J^T H J; ``KFACLinearOperator`` stores ``input_covariances`` (Abar) and
``gradient_covariances`` (Bbar) with the operator equal to ``kron(G, A)``; ``fisher_type="type-2"``
is the exact-GGN KFAC. The Jacobian Gram is built from ``JacobianLinearOperator`` as J^T J / N.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import stepscope as ss

curvlinops = pytest.importorskip("curvlinops")


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 3))
    g = torch.Generator().manual_seed(12)
    x, y = torch.randn(10, 5, generator=g), torch.randint(0, 3, (10,), generator=g)
    out = ss.analyze_curvature(model, x, y)
    ref = copy.deepcopy(model).double()  # curvlinops gets its own copy
    return out, ref, x.double(), y


def dense(op, p: int) -> torch.Tensor:
    return op @ torch.eye(p, dtype=torch.float64)


@pytest.mark.parametrize("layer", ["0", "2", "4"])
@pytest.mark.parametrize(
    "family, fisher_type", [("empirical_fisher", "empirical"), ("ce_ggn", "type-2")]
)
def test_kfac_factors_match_curvlinops(setup, layer, family, fisher_type):
    out, ref, x, y = setup
    lin = ref[int(layer)]
    kfac = curvlinops.KFACLinearOperator(
        ref,
        nn.CrossEntropyLoss(),
        [lin.weight],
        [(x, y)],
        fisher_type=fisher_type,
        check_deterministic=False,
    )
    if hasattr(kfac, "compute_kronecker_factors"):
        kfac.compute_kronecker_factors()
    state = kfac.state_dict()
    (a,) = state["input_covariances"].values()
    (g,) = state["gradient_covariances"].values()
    a_eigs = torch.linalg.eigvalsh(a).flip(0)
    g_eigs = torch.linalg.eigvalsh(g).flip(0)
    ours = out["layers"][layer]
    got_a = torch.tensor(ours["activation_factor"]["eigenvalues"], dtype=torch.float64)
    got_g = torch.tensor(ours[family]["backprop_factor"]["eigenvalues"], dtype=torch.float64)
    torch.testing.assert_close(got_a, a_eigs[: len(got_a)], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(got_g, g_eigs[: len(got_g)], rtol=1e-9, atol=1e-12)
    op = dense(kfac, lin.weight.numel())
    torch.testing.assert_close(op, torch.kron(g, a), rtol=1e-10, atol=1e-13)  # the convention
    k = ours[family]["kfac"]
    assert k["trace"] == pytest.approx(op.trace().item(), rel=1e-9)
    assert k["frobenius"] == pytest.approx(op.norm().item(), rel=1e-9)
    assert k["top_eigenvalue"] == pytest.approx(torch.linalg.eigvalsh(op).max().item(), rel=1e-9)


@pytest.mark.parametrize("layer", ["0", "2", "4"])
def test_block_diagonals_match_curvlinops_dense_operators(setup, layer):
    out, ref, x, y = setup
    lin = ref[int(layer)]
    n = x.shape[0]
    for part in ("weight", "bias"):
        param = getattr(lin, part)
        p = param.numel()
        ops = {
            "empirical_fisher": curvlinops.EFLinearOperator(
                ref, nn.CrossEntropyLoss(), [param], [(x, y)], check_deterministic=False
            ),
            "ce_ggn": curvlinops.GGNLinearOperator(
                ref, nn.CrossEntropyLoss(), [param], [(x, y)], check_deterministic=False
            ),
        }
        jac = dense(
            curvlinops.JacobianLinearOperator(ref, [param], [(x, y)], check_deterministic=False), p
        )
        mats = {k: dense(v, p) for k, v in ops.items()}
        mats["jacobian_gram"] = jac.T @ jac / n
        for fam, mat in mats.items():
            d = torch.diagonal(mat)
            got = out["layers"][layer][fam][part]
            assert got["trace"] == pytest.approx(d.sum().item(), rel=1e-9)
            assert got["diag_max"] == pytest.approx(d.max().item(), rel=1e-9)
            assert got["frobenius"] == pytest.approx(d.norm().item(), rel=1e-9)


@pytest.mark.parametrize(
    "family, fisher_type", [("empirical_fisher", "empirical"), ("ce_ggn", "type-2")]
)
def test_conv2d_kfac_expand_factors_match_curvlinops(family, fisher_type):
    torch.manual_seed(5)
    model = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.Tanh(), nn.Flatten(), nn.Linear(27, 4)
    )
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(5, 2, 5, 5, generator=g), torch.randint(0, 4, (5,), generator=g)
    ours = ss.analyze_curvature(model, x, y)["layers"]["0"]
    ref = copy.deepcopy(model).double()
    kfac = curvlinops.KFACLinearOperator(
        ref,
        nn.CrossEntropyLoss(),
        [ref[0].weight],
        [(x.double(), y)],
        fisher_type=fisher_type,
        kfac_approx="expand",
        check_deterministic=False,
    )
    if hasattr(kfac, "compute_kronecker_factors"):
        kfac.compute_kronecker_factors()
    state = kfac.state_dict()
    (a,) = state["input_covariances"].values()
    (gc,) = state["gradient_covariances"].values()
    got_a = torch.tensor(ours["activation_factor"]["eigenvalues"], dtype=torch.float64)
    got_g = torch.tensor(ours[family]["backprop_factor"]["eigenvalues"], dtype=torch.float64)
    torch.testing.assert_close(
        got_a, torch.linalg.eigvalsh(a).flip(0)[: len(got_a)], rtol=1e-9, atol=1e-12
    )
    torch.testing.assert_close(
        got_g, torch.linalg.eigvalsh(gc).flip(0)[: len(got_g)], rtol=1e-9, atol=1e-12
    )
    op = dense(kfac, ref[0].weight.numel())
    k = ours[family]["kfac"]
    assert k["trace"] == pytest.approx(op.trace().item(), rel=1e-9)
    assert k["frobenius"] == pytest.approx(op.norm().item(), rel=1e-9)
    assert k["top_eigenvalue"] == pytest.approx(torch.linalg.eigvalsh(op).max().item(), rel=1e-9)


class _SequencePool(nn.Module):
    """Linear on (n, T, d) inputs (positions = weight-sharing dimension), mean-pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)).mean(1))


@pytest.mark.parametrize("approx", ["expand", "reduce"])
@pytest.mark.parametrize(
    "family, fisher_type", [("empirical_fisher", "empirical"), ("ce_ggn", "type-2")]
)
def test_sequence_kfac_conventions_match_curvlinops(approx, family, fisher_type):
    torch.manual_seed(0)
    model = _SequencePool().double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 4, 5, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (8,), generator=g)
    out = ss.analyze_curvature(model, x, y, kfac_approx=approx, include_directional=False)
    ref = copy.deepcopy(model)
    kfac = curvlinops.KFACLinearOperator(
        ref,
        nn.CrossEntropyLoss(),
        [ref.a.weight],
        [(x, y)],
        fisher_type=fisher_type,
        kfac_approx=approx,
        check_deterministic=False,
    )
    if hasattr(kfac, "compute_kronecker_factors"):
        kfac.compute_kronecker_factors()
    state = kfac.state_dict()
    (a,) = state["input_covariances"].values()
    (b,) = state["gradient_covariances"].values()
    ours = out["layers"]["a"]
    assert out["metadata"]["layer_shapes"]["a"]["positions"] == 4
    got_a = torch.tensor(ours["activation_factor"]["eigenvalues"], dtype=torch.float64)
    got_b = torch.tensor(ours[family]["backprop_factor"]["eigenvalues"], dtype=torch.float64)
    a_eigs, b_eigs = torch.linalg.eigvalsh(a).flip(0), torch.linalg.eigvalsh(b).flip(0)
    torch.testing.assert_close(got_a, a_eigs[: len(got_a)], rtol=1e-10, atol=1e-13)
    torch.testing.assert_close(got_b, b_eigs[: len(got_b)], rtol=1e-10, atol=1e-13)
    assert ours[family]["kfac"]["trace"] == pytest.approx(float(a.trace() * b.trace()), rel=1e-10)
