"""The shared negligible-denominator rule, the covariance cancellation disclosure, and both
gradient-diversity conventions, checked against float64 brute force (per-example autograd)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope.denominators import (
    NEGLIGIBLE_RTOL,
    RULE,
    cancellation_error,
    negligible,
    safe_ratio,
)
from stepscope.probe import LEGACY_NAMES


def _balanced_zero_gradient_probe() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Each input twice, once per label, through a zero last layer: the last layer's per-example
    gradients cancel in pairs, so its mean gradient is zero up to round-off."""
    torch.manual_seed(0)
    x = torch.randn(32, 6)
    x = torch.cat([x, x])
    y = torch.cat([torch.zeros(32, dtype=torch.long), torch.ones(32, dtype=torch.long)])
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))
    with torch.no_grad():
        model[2].weight.zero_()
        model[2].bias.zero_()
    return model, x, y


def test_probe_and_analysis_share_one_rule_for_a_round_off_mean_gradient():
    model, x, y = _balanced_zero_gradient_probe()
    out = ss.analyze_curvature(model, x, y)
    moments = out["directional"]["2"]["gradient_moments"]
    # the mean gradient is round-off: far below the rule's threshold, yet not exactly zero
    assert 0 < moments["mean_gradient_sq_norm"] < NEGLIGIBLE_RTOL * moments["per_example_sq_norm_mean"]
    assert moments["gradient_diversity"] is None
    assert moments["gradient_diversity_legacy_scale"] is None
    assert moments["simple_noise_scale"] is None
    for fam in ("empirical_fisher", "ce_ggn", "jacobian_gram"):
        d = out["directional"]["2"][fam]
        assert d["covariance_contraction_ratio"] is None
        assert d["validity"]["ratios_undefined_negligible_denominator"] == 3
    undefined = out["metadata"]["undefined_values"]["paths"]
    assert "directional.2.gradient_moments.gradient_diversity" in undefined
    assert out["metadata"]["negligible_denominator"] == RULE
    rec = ss.DenseProbe(x, y, indices=range(64)).measure(model, step=0, examples_seen=0, epoch=0)
    assert rec.layers["2"].gradient_diversity is None
    assert rec.layers["2"].validity["diversity_valid"] == 0


def test_rule_is_relative_to_the_scale_of_the_terms():
    assert negligible(1e-7, 1.0) and not negligible(1e-5, 1.0)
    assert negligible(1e-7 * 1e30, 1e30) and not negligible(1e-5 * 1e-30, 1e-30)
    assert safe_ratio(1.0, 0.0, scale=0.0) is None and safe_ratio(2.0, 4.0, scale=4.0) == 0.5


def test_covariance_cancellation_is_estimated_and_flagged_in_float32():
    """Nearly identical examples: cov / fisher ~ 4e-7; the float32 covariance trace loses >1%
    against float64, and the record says so instead of leaving it to be discovered."""
    torch.manual_seed(0)
    x = torch.randn(1, 6) + 1e-3 * torch.randn(64, 6)
    y = torch.zeros(64, dtype=torch.long)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))
    r32 = ss.DenseProbe(x, y, indices=range(64)).measure(model, step=0, examples_seen=0, epoch=0)
    twin = copy.deepcopy(model).double()
    r64 = ss.DenseProbe(x.double(), y, indices=range(64)).measure(
        twin, step=0, examples_seen=0, epoch=0
    )
    c32, c64 = (r.layers["2"].validity["covariance_raw"] for r in (r32, r64))
    actual = abs(c32 - c64) / abs(c64)
    assert actual > 0.01  # the cancellation is real
    v32 = r32.layers["2"].validity
    assert v32["covariance_computed_dtype"] == "float32"
    assert v32["covariance_relative_error_estimate"] >= actual
    assert v32["covariance_cancellation_suspect"] is True
    v64 = r64.layers["2"].validity
    assert v64["covariance_relative_error_estimate"] < 0.01
    assert v64["covariance_cancellation_suspect"] is False
    assert r32.conventions["covariance_cancellation"].startswith("validity")


def test_cancellation_error_formula():
    assert cancellation_error(2.0, 2.0) is None
    eps = torch.finfo(torch.float64).eps
    assert cancellation_error(3.0, 1.0, "float64") == pytest.approx(eps * 4.0 / 2.0)


def test_both_diversity_conventions_against_per_example_autograd():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 3)).double()
    x, y = torch.randn(12, 4, dtype=torch.float64), torch.randint(0, 3, (12,))
    grads = []
    for i in range(12):  # brute force: one backward per example of its own (summed) CE
        model.zero_grad()
        nn.functional.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        grads.append(model[2].weight.grad.clone())
    g = torch.stack(grads)
    first = float(g.square().sum((1, 2)).mean())  # mean_i ||g_i||^2
    second = float(g.mean(0).square().sum())  # ||G||^2
    yin = float(g.square().sum()) / float(g.sum(0).square().sum())
    rec = ss.DenseProbe(x, y, indices=range(12)).measure(model, step=0, examples_seen=0, epoch=0)
    layer = rec.layers["2"]
    assert layer.gradient_diversity == pytest.approx(yin, rel=1e-9)
    assert layer.gradient_diversity_legacy_scale == pytest.approx(first / second, rel=1e-9)
    assert layer.gradient_diversity_legacy_scale == pytest.approx(12 * yin, rel=1e-9)
    assert "probe/2/gradient_diversity_legacy_scale" in rec.scalars()
    assert LEGACY_NAMES["gradient_diversity_legacy_scale"][0] == (
        "layer-{i}/fisher/diversity"
    )
    out = ss.analyze_curvature(model, x, y)["directional"]["2"]["gradient_moments"]
    assert out["gradient_diversity"] == pytest.approx(yin, rel=1e-9)
    assert out["gradient_diversity_legacy_scale"] == pytest.approx(first / second, rel=1e-9)
