"""kfac_approx in the directional section, all-ignored batches, tied heads.

Brute force: float64 per-example autograd loops (tests/probe/oracle.py), each example alone.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope.probe import DenseProbe
from tests.probe.oracle import stable_ce
from tests.probe.transformer_testkit import make_transformer, make_transformer_data

RTOL = 1e-10


class SequenceMLP(nn.Module):
    def __init__(self, d: int = 3, h: int = 4, classes: int = 5) -> None:
        super().__init__()
        self.up = nn.Linear(d, h)
        self.out = nn.Linear(h, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.up(x)))


def reduce_factors_brute_force(model: SequenceMLP, x: torch.Tensor, y: torch.Tensor):
    """``(Abar, Bbar_F, G)`` of layer ``up`` with the reduce convention, example by example."""
    a_bar, b_bar, grads = [], [], []
    for i in range(x.shape[0]):
        seen: dict[str, torch.Tensor] = {}
        handle = model.up.register_forward_hook(lambda m, a, z, s=seen: s.update(a=a[0], z=z))
        logits = model(x[i : i + 1])[0]
        handle.remove()
        keep = y[i] != -100
        b = torch.autograd.grad(stable_ce(logits[keep], y[i][keep]).sum(), seen["z"])[0][0]
        a = seen["a"][0]
        a_bar.append(a.mean(0))
        b_bar.append(b.sum(0))
        grads.append(b.T @ a)
    a_bar, b_bar = torch.stack(a_bar), torch.stack(b_bar)
    n = x.shape[0]
    return a_bar.T @ a_bar / n, b_bar.T @ b_bar / n, torch.stack(grads).mean(0)


@pytest.mark.parametrize("approx", ["reduce", "expand"])
def test_directional_quotients_use_the_requested_kfac_factors(approx):
    torch.manual_seed(0)
    model = SequenceMLP().double()
    x = torch.randn(4, 3, 3, dtype=torch.float64)
    y = torch.randint(0, 5, (4, 3))
    result = ss.curvature.analyze_curvature(model, x, y, kfac_approx=approx)
    assert result["metadata"]["kfac_approx"] == approx
    got = result["directional"]["up"]["empirical_fisher"]["mean_gradient_quadratic_form"]
    abar, bbar, g = reduce_factors_brute_force(model, x, y)
    reduce_value = float(((bbar @ g) * (g @ abar)).sum())
    if approx == "reduce":
        assert got == pytest.approx(reduce_value, rel=RTOL, abs=0)
    else:  # the expand factors are a different matrix here (3 positions)
        assert got != pytest.approx(reduce_value, rel=1e-3)


def test_an_all_ignored_batch_gives_none_and_counts_not_an_exception():
    model = make_transformer("gpt_untied")
    x, y = make_transformer_data("gpt")
    y = torch.full_like(y, -100)
    result = ss.curvature.analyze_curvature(model, x, y, output="logits", next_token=True)
    meta = result["metadata"]
    assert meta["scored_targets"] == 0
    assert meta["probe_cross_entropy_mean"] is None and meta["probe_accuracy_fraction"] is None
    assert result["output_space"] is None
    assert "output_space" in meta["undefined_values"]["paths"]
    record = DenseProbe(x, y, size=x.shape[0], output="logits", next_token=True).measure(
        model, step=0, examples_seen=0, epoch=0
    )
    assert record.model.n_targets == 0
    assert record.model.accuracy_fraction is None and record.model.loss is None


def test_a_tied_head_is_reported_unsupported_and_the_rest_is_analysed():
    model = make_transformer("gpt")  # lm_head.weight is wte.weight
    x, y = make_transformer_data("gpt")
    result = ss.curvature.analyze_curvature(model, x, y, output="logits", next_token=True)
    assert "lm_head" not in result["layers"]
    assert result["metadata"]["unsupported_layers"]["lm_head"]["reason"] == (
        "curvature_weight_shared"
    )
    assert "wte" in result["metadata"]["unsupported_layers"]["lm_head"]["detail"]
    # the non-shared layers agree with the untied twin (same weights, the head excluded)
    untied = make_transformer("gpt_untied")
    untied.load_state_dict(model.state_dict(), strict=False)
    with torch.no_grad():
        untied.lm_head.weight.copy_(model.wte.weight)
    names = sorted(result["layers"])
    twin = ss.curvature.analyze_curvature(
        untied, x, y, output="logits", next_token=True, layers=names
    )
    for name in names:
        mine = result["layers"][name]["empirical_fisher"]["weight"]["trace"]
        theirs = twin["layers"][name]["empirical_fisher"]["weight"]["trace"]
        assert mine == pytest.approx(theirs, rel=RTOL, abs=0)
    with pytest.raises(ss.Refusal) as err:  # naming the tied head still refuses
        ss.curvature.analyze_curvature(
            model, x, y, output="logits", next_token=True, layers=["lm_head"]
        )
    assert err.value.code == "curvature_weight_shared"


def test_float32_internals_of_a_float64_model_are_recorded_not_hidden():
    """HF LlamaRMSNorm normalises in float32 inside the float64 analysis copy."""
    from tests.probe.test_hf_verification import build, data

    model = build("llama")
    x, y, _ = data("llama")
    meta = ss.curvature.analyze_curvature(model, x, y, next_token=True, include_directional=False)[
        "metadata"
    ]
    assert meta["derivative_dtype"] == "mixed"
    assert meta["lower_precision_internals"]["model.model.layers.0.input_layernorm"] == ["float32"]
    plain = SequenceMLP().double()
    xs, ys = torch.randn(3, 2, 3, dtype=torch.float64), torch.randint(0, 5, (3, 2))
    meta = ss.curvature.analyze_curvature(plain, xs, ys)["metadata"]
    assert meta["derivative_dtype"] == "float64" and meta["lower_precision_internals"] == {}
