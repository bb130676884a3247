"""Top eigenvalues (Lanczos, power) against dense float64 eigendecompositions, and PyHessian."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from stepscope.curvature.eigen import top_eigenvalues
from stepscope.errors import Refusal
from tests.curvature.curvature_testkit import dense_oracle

KINDS = ["hessian", "ggn", "empirical_fisher"]


def _model(seed: int = 0, width: int = 5) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, width), nn.Tanh(), nn.Linear(width, 3))


def _batch(n: int = 8, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=gen), torch.randint(0, 3, (n,), generator=gen)


@pytest.mark.parametrize("kind", KINDS)
def test_lanczos_top_k_match_dense_eigenvalues_to_1e8_and_converge(kind: str) -> None:
    model, (x, y) = _model(), _batch()
    oracle = torch.linalg.eigvalsh(dense_oracle(model, x, y, kind)).flip(0)
    result = top_eigenvalues(model, x, y, k=3, kind=kind, tol=1e-10, dtype=torch.float64)
    assert result.converged == (True, True, True) and result.which == "largest_algebraic"
    torch.testing.assert_close(
        torch.tensor(result.values, dtype=torch.float64), oracle[:3], rtol=1e-8, atol=0.0
    )
    scale = float(oracle.abs().max())
    assert all(r <= 1e-10 * scale * 1.0001 for r in result.residual_norms)
    assert result.products_used == result.iterations[0] + 3  # Krylov steps + residual checks


@pytest.mark.parametrize("kind", KINDS)
def test_power_iteration_finds_largest_magnitude_eigenvalue(kind: str) -> None:
    model, (x, y) = _model(), _batch()
    oracle = torch.linalg.eigvalsh(dense_oracle(model, x, y, kind))
    largest = float(oracle[oracle.abs().argmax()])
    result = top_eigenvalues(
        model, x, y, kind=kind, method="power", tol=1e-9, max_iter=3000, dtype=torch.float64
    )
    assert result.converged == (True,) and result.which == "largest_magnitude"
    assert result.values[0] == pytest.approx(largest, rel=1e-8)
    assert result.products_used == result.iterations[0]  # the residual comes with the product


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_every_value_lies_within_its_residual_of_a_true_eigenvalue(method: str) -> None:
    model, (x, y) = _model(3), _batch(seed=4)
    oracle = torch.linalg.eigvalsh(dense_oracle(model, x, y, "hessian"))
    result = top_eigenvalues(
        model, x, y, k=3, method=method, max_iter=4, tol=1e-12, dtype=torch.float64
    )
    for value, residual in zip(result.values, result.residual_norms):
        gap = float((oracle - value).abs().min())
        assert gap <= residual * (1 + 1e-9) + 1e-14


@pytest.mark.parametrize("method", ["lanczos", "power"])
def test_too_few_iterations_are_reported_unconverged_never_converged(method: str) -> None:
    model, (x, y) = _model(), _batch()
    result = top_eigenvalues(model, x, y, k=2, method=method, max_iter=2, tol=1e-12)
    assert result.converged == (False, False) and not result.all_converged
    assert all(r > 1e-12 * abs(v) for r, v in zip(result.residual_norms, result.values))
    with pytest.raises(Refusal) as err:
        top_eigenvalues(
            model, x, y, k=2, method=method, max_iter=2, tol=1e-12, require_converged=True
        )
    assert err.value.code == "curvature_not_converged"


def test_lanczos_finds_repeated_zero_eigenvalues_of_a_low_rank_fisher() -> None:
    model, (x, y) = _model(), _batch(n=2)  # empirical Fisher of rank <= 2 over 43 parameters
    oracle = torch.linalg.eigvalsh(dense_oracle(model, x, y, "empirical_fisher")).flip(0)
    result = top_eigenvalues(
        model, x, y, k=5, kind="empirical_fisher", tol=1e-10, dtype=torch.float64
    )
    assert all(result.converged)
    torch.testing.assert_close(
        torch.tensor(result.values, dtype=torch.float64), oracle[:5], rtol=1e-8, atol=1e-12
    )


def test_random_start_uses_a_private_generator_and_is_reproducible() -> None:
    model, (x, y) = _model(), _batch()
    state = torch.get_rng_state()
    a = top_eigenvalues(model, x, y, max_iter=3, tol=1e-12, seed=5)
    b = top_eigenvalues(model, x, y, max_iter=3, tol=1e-12, seed=5)
    c = top_eigenvalues(model, x, y, max_iter=3, tol=1e-12, seed=6)
    assert torch.equal(state, torch.get_rng_state())
    assert a.values == b.values and a.values != c.values


def test_result_is_json_ready_with_evidence_per_value() -> None:
    model, (x, y) = _model(), _batch()
    payload = json.loads(json.dumps(top_eigenvalues(model, x, y, k=2, kind="ggn").to_dict()))
    assert payload["quantity"] == "ggn_top_eigenvalues" and payload["estimated"] is True
    assert len(payload["values"]) == len(payload["residual_norms"]) == len(payload["converged"])
    assert "residual" in payload["criterion"]


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"k": 0}, "curvature_input_invalid"),
        ({"k": 44}, "curvature_input_invalid"),
        ({"max_iter": 0}, "curvature_input_invalid"),
        ({"tol": 0.0}, "curvature_input_invalid"),
        ({"method": "arnoldi"}, "curvature_mode_invalid"),
        ({"kind": "fisher"}, "curvature_mode_invalid"),
    ],
)
def test_bad_arguments_refuse(kwargs: dict, code: str) -> None:
    model, (x, y) = _model(), _batch()
    with pytest.raises(Refusal) as err:
        top_eigenvalues(model, x, y, **kwargs)
    assert err.value.code == code


def test_top_hessian_eigenvalue_agrees_with_pyhessian() -> None:
    try:
        from pyhessian import hessian as pyhessian_hessian
    except Exception as exc:  # not installable everywhere; the benchmark reports the same
        pytest.skip(f"pyhessian does not import here: {exc!r}")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 4))
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(32, 10, generator=gen), torch.randint(0, 4, (32,), generator=gen)
    ours = top_eigenvalues(model, x, y, k=1, tol=1e-5, max_iter=200)
    theirs_model = copy.deepcopy(model)  # PyHessian leaves graphs in .grad and sets eval()
    torch.manual_seed(0)  # PyHessian draws its start vector from the global RNG
    comp = pyhessian_hessian(theirs_model, nn.CrossEntropyLoss(), data=(x, y), cuda=False)
    theirs, _ = comp.eigenvalues(maxIter=1000, tol=1e-7, top_n=1)
    assert ours.converged == (True,)
    assert ours.values[0] == pytest.approx(theirs[0], rel=1e-4)
