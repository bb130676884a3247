"""Output-space Lyapunov mismatch against autograd H/F, scipy's Lyapunov solver and hand cases."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import scipy.linalg
import torch
import torch.nn.functional as F
from torch.func import grad, hessian

from stepscope.curvature.output_space import output_space_mismatch


def ce_sum(z: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(z.unsqueeze(0), yi.unsqueeze(0), reduction="sum")


def autograd_h_f(logits: torch.Tensor, labels: torch.Tensor):
    n, c = logits.shape
    h = torch.zeros(c, c, dtype=torch.float64)
    f = torch.zeros(c, c, dtype=torch.float64)
    for i in range(n):
        ce = partial(ce_sum, yi=labels[i])
        h += hessian(ce)(logits[i]) / n
        g = grad(ce)(logits[i])
        f += torch.outer(g, g) / n
    return h.numpy(), f.numpy()


def test_generic_probe_matches_scipy_lyapunov_on_support():
    g = torch.Generator().manual_seed(7)
    logits = torch.randn(9, 4, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, 4, (9,), generator=g)
    out = output_space_mismatch(logits, labels)
    h, f = autograd_h_f(logits, labels)
    evals, evecs = np.linalg.eigh(h)
    keep = evals > 1e-10 * evals.max()
    assert out["support"]["rank"] == int(keep.sum()) == 3  # the all-ones vector is always dropped
    u = evecs[:, keep]
    hs, fs = u.T @ h @ u, u.T @ f @ u
    lyap = scipy.linalg.solve_continuous_lyapunov(hs, 2 * fs)
    want_l = np.sort(np.linalg.eigvalsh((lyap + lyap.T) / 2))[::-1]
    np.testing.assert_allclose(out["lyapunov"]["eigenvalues"], want_l, rtol=1e-9)
    pre = np.sort(np.real(np.linalg.eigvals(np.linalg.solve(hs, fs))))[::-1]
    np.testing.assert_allclose(out["preconditioned_fisher"]["eigenvalues"], pre, rtol=1e-9)
    assert out["solution_residual"] < 1e-12
    assert abs(out["discarded_fisher_mass"]) < 1e-14
    intrinsic = want_l.sum() / want_l.max()
    assert out["lyapunov"]["intrinsic_dimension"] == pytest.approx(intrinsic, rel=1e-9)
    assert out["lyapunov"]["rho_ambient"] == pytest.approx(4 / intrinsic, rel=1e-9)
    assert out["lyapunov"]["rho_support"] == pytest.approx(3 / intrinsic, rel=1e-9)
    pre_intr = pre.sum() / pre.max()
    assert out["lyapunov_to_preconditioned_intrinsic_dimension_ratio"] == pytest.approx(
        intrinsic / pre_intr, rel=1e-9
    )
    np.testing.assert_allclose(out["hessian_eigenvalues"], np.sort(evals)[::-1], atol=1e-15)


def test_two_class_hand_case():
    # p = (1/2, 1/2): H = [[1/4, -1/4], [-1/4, 1/4]] has eigenvalue 1/2 on (1, -1)/sqrt 2;
    # v = (-1/2, 1/2) gives F_s = 1/2, so L = 2 F_s / (2 h) = 1 and H^-1 F = 1.
    out = output_space_mismatch(torch.zeros(1, 2, dtype=torch.float64), torch.tensor([0]))
    assert out["support"]["rank"] == 1
    assert out["lyapunov"]["eigenvalues"] == pytest.approx([1.0], rel=1e-14)
    assert out["preconditioned_fisher"]["eigenvalues"] == pytest.approx([1.0], rel=1e-14)
    assert out["lyapunov"]["rho_ambient"] == pytest.approx(2.0)
    assert out["lyapunov"]["rho_support"] == pytest.approx(1.0)


def test_fisher_mass_outside_support_is_reported_and_undefined_ratios_are_none():
    # class 2 has probability exactly 0 yet is the label: its gradient lies off H's support.
    logits = torch.tensor([[0.0, 0.0, -1000.0]], dtype=torch.float64)
    out = output_space_mismatch(logits, torch.tensor([2]))
    assert out["support"]["rank"] == 1
    assert out["discarded_fisher_mass"] == pytest.approx(1.5, rel=1e-12)
    assert out["discarded_fisher_fraction"] == pytest.approx(1.0, rel=1e-12)
    assert out["lyapunov"]["intrinsic_dimension"] is None
    assert out["lyapunov"]["rho_ambient"] is None
    assert out["lyapunov_to_preconditioned_intrinsic_dimension_ratio"] is None
