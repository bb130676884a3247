"""Randomised trace estimates: unbiased, error shrinking like 1/sqrt(samples), honest SE.

The oracle is the trace of the dense float64 matrix (``torch.func.hessian`` / ``jacrev``), and the
exact Rademacher-Hutchinson variance :math:`2(\\|M\\|_F^2 - \\sum_i M_{ii}^2)`.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from stepscope.curvature.estimators import trace
from stepscope.errors import Refusal
from tests.curvature.curvature_testkit import dense_oracle

SEEDS = range(24)
BUDGETS = (2, 8, 32)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3))


def _batch(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, generator=gen), torch.randint(0, 3, (n,), generator=gen)


@pytest.mark.parametrize("kind", ["hessian", "ggn"])
def test_hutchinson_error_shrinks_like_inverse_sqrt_samples_over_seeds(kind: str) -> None:
    model, (x, y) = _model(), _batch()
    m = dense_oracle(model, x, y, kind)
    exact = float(m.trace())
    sample_var = 2.0 * float((m**2).sum() - (m.diagonal() ** 2).sum())
    rmse = []
    for budget in BUDGETS:
        results = [
            trace(model, x, y, kind=kind, samples=budget, seed=s, dtype=torch.float64)
            for s in SEEDS
        ]
        errors = torch.tensor([r.estimate - exact for r in results], dtype=torch.float64)
        rmse.append(float(errors.pow(2).mean().sqrt()))
        # the error matches the exact estimator spread sqrt(Var / m) ...
        assert 0.6 < rmse[-1] / math.sqrt(sample_var / budget) < 1.5
        # ... and the reported standard error is calibrated to it
        mean_se_sq = sum(r.standard_error**2 for r in results) / len(results)
        if budget >= 8:  # a variance from two draws is too noisy to calibrate against
            assert 0.6 < mean_se_sq / (sample_var / budget) < 1.5
        assert all(r.products_used == budget and r.estimated for r in results)
    slope = (math.log(rmse[-1]) - math.log(rmse[0])) / (
        math.log(BUDGETS[-1]) - math.log(BUDGETS[0])
    )
    assert -0.65 < slope < -0.35  # 1/sqrt(samples)


def test_hutchinson_estimate_is_unbiased_over_seeds() -> None:
    model, (x, y) = _model(), _batch()
    exact = float(dense_oracle(model, x, y, "empirical_fisher").trace())
    estimates = torch.tensor(
        [trace(model, x, y, kind="empirical_fisher", samples=8, seed=s).estimate for s in SEEDS],
        dtype=torch.float64,
    )
    standard_error_of_mean = float(estimates.std()) / math.sqrt(len(estimates))
    assert abs(float(estimates.mean()) - exact) < 4 * standard_error_of_mean


def test_hutch_plus_plus_is_exact_when_the_sketch_covers_a_low_rank_matrix() -> None:
    model, (x, y) = _model(), _batch(n=2)  # empirical Fisher of rank <= 2
    exact = float(dense_oracle(model, x, y, "empirical_fisher").trace())
    result = trace(
        model, x, y, kind="empirical_fisher", method="hutch++", samples=9, dtype=torch.float64
    )
    assert result.estimate == pytest.approx(exact, rel=1e-10)
    assert result.products_used == 9 and result.method == "hutch++"


def test_hutch_plus_plus_beats_hutchinson_at_equal_budget_on_a_ggn() -> None:
    model, (x, y) = _model(), _batch()
    exact = float(dense_oracle(model, x, y, "ggn").trace())

    def rmse(method: str) -> float:
        errs = [
            trace(model, x, y, kind="ggn", method=method, samples=12, seed=s).estimate - exact
            for s in range(12)
        ]
        return math.sqrt(sum(e * e for e in errs) / len(errs))

    assert rmse("hutch++") < 0.5 * rmse("hutchinson")


def test_one_sample_has_no_standard_error_rather_than_zero() -> None:
    model, (x, y) = _model(), _batch()
    result = trace(model, x, y, samples=1)
    assert result.standard_error is None and result.samples == 1


def test_result_is_json_ready_and_labelled_an_estimate() -> None:
    model, (x, y) = _model(), _batch()
    payload = json.loads(json.dumps(trace(model, x, y, kind="ggn", samples=5).to_dict()))
    assert payload["quantity"] == "ggn_trace_estimate" and payload["estimated"] is True
    assert payload["probe_distribution"] == "rademacher" and payload["samples"] == 5


def test_global_rng_is_not_consumed_and_seed_reproduces() -> None:
    model, (x, y) = _model(), _batch()
    state = torch.get_rng_state()
    a, b = trace(model, x, y, samples=4, seed=9), trace(model, x, y, samples=4, seed=9)
    assert torch.equal(state, torch.get_rng_state()) and a.estimate == b.estimate


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"samples": 0}, "curvature_input_invalid"),
        ({"samples": 2, "method": "hutch++"}, "curvature_input_invalid"),
        ({"method": "exact"}, "curvature_mode_invalid"),
        ({"kind": "fisher"}, "curvature_mode_invalid"),
    ],
)
def test_bad_arguments_refuse(kwargs: dict, code: str) -> None:
    model, (x, y) = _model(), _batch()
    with pytest.raises(Refusal) as err:
        trace(model, x, y, **kwargs)
    assert err.value.code == code
