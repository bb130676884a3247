"""Per-example norm algebra and the host-side moment conventions (round-off, None + validity)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.probe.moments import (
    COVARIANCE_ROUNDOFF_RTOL,
    gradient_moments,
    per_example_sq_norms,
)
from stepscope.probe.sequence import DenseUse, KroneckerUse, parameter_sq_norms_and_sum


def _explicit(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # one explicit outer-product sum per example, float64
    return torch.stack(
        [
            sum(torch.outer(b[i, :, p], a[i, :, p]) for p in range(a.shape[2])).square().sum()
            for i in range(a.shape[0])
        ]
    )


@pytest.mark.parametrize("method", ["outer", "gram", "auto"])
def test_positional_sq_norms_match_explicit_per_example_sums(method):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(5, 7, 9, generator=g, dtype=torch.float64)
    b = torch.randn(5, 3, 9, generator=g, dtype=torch.float64)
    expected = _explicit(a, b)
    torch.testing.assert_close(per_example_sq_norms(a, b, method), expected)
    # and the factor-norm product is a different number once positions exist
    product = a.square().sum((1, 2)) * b.square().sum((1, 2))
    assert not torch.allclose(product, expected, rtol=1e-2)


def test_unknown_method_is_a_programming_error():
    a = torch.ones(1, 2, 3)
    with pytest.raises(ValueError):
        per_example_sq_norms(a, a, "fast")


def test_block_mean_gradient_and_bias_match_explicit_loop():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    b = torch.randn(4, 2, 5, generator=g, dtype=torch.float64)
    use = KroneckerUse(left=b.transpose(1, 2), right=a.transpose(1, 2))
    sq, total = parameter_sq_norms_and_sum([use], torch.Size([2, 6]))
    per_example = torch.stack([b[i] @ a[i].T for i in range(4)])
    torch.testing.assert_close(total, per_example.sum(0).reshape(-1))
    torch.testing.assert_close(sq, per_example.square().sum((1, 2)))
    bias_sq, bias_sum = parameter_sq_norms_and_sum([DenseUse(b.sum(2))], torch.Size([2]))
    torch.testing.assert_close(bias_sum, b.sum(2).sum(0))
    torch.testing.assert_close(bias_sq, b.sum(2).square().sum(1))


def test_roundoff_negative_covariance_is_clipped_and_recorded():
    sq = np.array([2.0, 2.0])
    m = gradient_moments(sq, 2.0 * (1 + COVARIANCE_ROUNDOFF_RTOL / 10))
    assert m.covariance_trace == 0.0 and m.validity["covariance_clipped"] is True
    assert m.validity["covariance_raw"] < 0


def test_negative_covariance_beyond_roundoff_is_none_not_clipped():
    m = gradient_moments(np.array([1.0, 1.0]), 1.5)
    assert m.covariance_trace is None and m.validity["covariance_clipped"] is False
    assert m.validity["covariance_raw"] == pytest.approx(-0.5)


def test_non_finite_per_example_norms_make_every_moment_none():
    m = gradient_moments(np.array([1.0, np.inf, 2.0]), 1.0)
    assert m.fisher_trace is None and m.grad_norm_quantiles is None
    assert m.validity["finite_examples"] == 2 and m.validity["n_examples"] == 3


def test_negligible_denominator_gives_none_diversity_with_counts():
    m = gradient_moments(np.array([1.0, 1.0]), 1e-9)
    assert m.gradient_diversity is None and m.validity["diversity_valid"] == 0
    assert m.validity["diversity_denominator"] == pytest.approx(4e-9)
    ok = gradient_moments(np.array([1.0, 3.0]), 1.0)
    assert ok.gradient_diversity == pytest.approx(4.0 / 4.0) and ok.validity["diversity_valid"] == 1


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 4),
    d=st.integers(1, 5),
    o=st.integers(1, 5),
    positions=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_outer_and_gram_agree_with_explicit_sums_for_any_shape(n, d, o, positions, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, d, positions, generator=g, dtype=torch.float64)
    b = torch.randn(n, o, positions, generator=g, dtype=torch.float64)
    expected = _explicit(a, b)
    torch.testing.assert_close(per_example_sq_norms(a, b, "outer"), expected)
    torch.testing.assert_close(per_example_sq_norms(a, b, "gram"), expected)


def test_the_float32_cancellation_number_is_named_a_floor_not_a_bound():
    """At cov/fisher = 2e-9 the estimate (2.8) is below the true error (47)."""
    import numpy as np

    from stepscope.probe.moments import gradient_moments

    sq = np.full(8, 1.0)
    sq[0] += 8 * 2e-9  # covariance 2e-9 of a fisher trace of 1
    m = gradient_moments(sq, 1.0, dtype="float32")
    assert m.validity["covariance_relative_error_kind"] == "operand_rounding_floor_not_a_bound"
    assert m.validity["covariance_cancellation_suspect"] is True
