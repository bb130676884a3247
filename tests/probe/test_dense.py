"""DenseProbe.measure against the brute-force float64 per-example oracle."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from stepscope import Refusal
from stepscope.probe import DenseProbe
from tests.probe.probe_testkit import make_data, make_model
from tests.probe.transformer_testkit import per_example_gradients

RTOL, ATOL = 2e-4, 1e-9
CASES = [
    {"kind": "mlp", "size": 16, "seed": 3},
    {"kind": "mlp_nobias", "size": 12, "seed": 4},
    {"kind": "cnn", "size": 10, "seed": 5},
    {"kind": "cnn_same", "size": 9, "seed": 6},
    {"kind": "seq", "size": 11, "seed": 7},
]


def _close(actual: float | None, expected: float, rtol: float = RTOL) -> bool:
    return actual is not None and math.isclose(actual, float(expected), rel_tol=rtol, abs_tol=ATOL)


@pytest.mark.parametrize("case", CASES, ids=[c["kind"] for c in CASES])
def test_every_moment_matches_the_per_example_float64_loop(case, oracle):
    model = make_model(case["kind"])
    x, y = make_data(case["kind"])
    probe = DenseProbe(x, y, size=case["size"], seed=case["seed"])
    rec = probe.measure(model, step=0, examples_seen=0, epoch=0)
    idx = list(probe.selection.indices)
    ref = oracle(model, x[idx], y[idx], list(rec.layers))
    assert _close(rec.model.loss, ref["loss"], 1e-5)
    preds = np.asarray(ref["preds"])
    assert (
        rec.model.predicted_counts == np.bincount(preds, minlength=rec.model.num_classes).tolist()
    )
    assert rec.model.n_correct == int((preds == y[idx].numpy()).sum())
    for name, layer in rec.layers.items():
        for part, block in (("weight", layer), ("bias", layer.bias)):
            key = f"{name}.{part}"
            if key not in ref["blocks"]:
                assert block is None, key  # no bias: no bias block, not zeros
                continue
            r = ref["blocks"][key]
            for field in (
                "fisher_trace",
                "mean_grad_sq_norm",
                "gradient_diversity",
                "grad_norm_rms",
                "grad_fro_legacy_scale",
            ):
                assert _close(getattr(block, field), r[field]), (key, field)
            # the covariance is a difference: compare against the fisher scale
            assert abs(block.covariance_trace - r["covariance_trace"]) <= RTOL * r["fisher_trace"]
            for q, v in r["quantiles"].items():
                assert _close(block.grad_norm_quantiles[q], v), (key, q)
        act, back = ref["zeros"][name]
        assert layer.activation_zero_fraction == pytest.approx(act, abs=1e-12)
        assert layer.backprop_zero_fraction == pytest.approx(back, abs=1e-12)


def test_legacy_diversity_is_n_times_yin_diversity(oracle):
    model = make_model("mlp")
    x, y = make_data("mlp")
    rec = DenseProbe(x, y, size=8, seed=1).measure(model, step=0, examples_seen=0, epoch=0)
    v = rec.layers["0"].validity
    legacy = (v["diversity_numerator"] / 8) / (v["diversity_denominator"] / 64)
    assert legacy == pytest.approx(8 * rec.layers["0"].gradient_diversity)


@pytest.mark.parametrize("kind", ["mlp", "cnn", "seq"])
def test_single_example_probe_has_zero_covariance_and_unit_diversity(kind):
    model = make_model(kind)
    x, y = make_data(kind)
    rec = DenseProbe(x, y, indices=[5]).measure(model, step=0, examples_seen=0, epoch=0)
    for layer in rec.layers.values():
        assert layer.gradient_diversity == pytest.approx(1.0, rel=1e-4)
        assert abs(layer.covariance_trace) <= 1e-5 * layer.fisher_trace
        q = layer.grad_norm_quantiles
        assert q["min"] == q["max"] == pytest.approx(layer.grad_norm_rms)


def test_dead_relu_network_reports_measured_zeros_and_undefined_diversity():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every hidden unit dead
    x, y = torch.randn(20, 3), torch.randint(0, 2, (20,))
    rec = DenseProbe(x, y, size=10).measure(model, step=0, examples_seen=0, epoch=0)
    first, last = rec.layers["0"], rec.layers["2"]
    assert first.fisher_trace == 0.0 and first.mean_grad_sq_norm == 0.0
    assert first.gradient_diversity is None and first.validity["diversity_valid"] == 0
    assert first.backprop_zero_fraction == 1.0
    assert last.activation_zero_fraction == 1.0
    assert last.fisher_trace == 0.0 and last.gradient_diversity is None
    assert last.bias.fisher_trace > 0  # the head's bias still learns


def test_cancelling_gradients_give_none_not_a_huge_diversity():
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
    x = torch.ones(2, 2)
    y = torch.tensor([0, 1])  # p = (1/2, 1/2): the two gradients are exact opposites
    rec = DenseProbe(x, y, indices=[0, 1]).measure(model, step=0, examples_seen=0, epoch=0)
    layer = rec.layers[""]
    assert layer.mean_grad_sq_norm == 0.0 and layer.fisher_trace > 0
    assert layer.gradient_diversity is None
    assert layer.covariance_trace == pytest.approx(layer.fisher_trace)


def test_masked_layers_are_none_with_reasons_and_keep_parameter_norms():
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=8)
    rec = probe.measure(model, step=0, examples_seen=0, epoch=0, active={"3": False})
    assert rec.layers["3"].fisher_trace is None and rec.layers["3"].bias.fisher_trace is None
    assert rec.layers["3"].activation_zero_fraction is None
    assert rec.layers["3"].validity["gradient_absent_reason"] == "inactive_in_mask"
    assert rec.layers["3"].param_l2 > 0
    assert rec.layers["0"].fisher_trace is not None
    all_off = {name: False for name in rec.layers}
    rec = probe.measure(model, step=1, examples_seen=8, epoch=0, active=all_off)
    for layer in rec.layers.values():
        assert layer.fisher_trace is None and layer.gradient_diversity is None
        assert layer.grad_norm_quantiles is None and layer.validity["gradient_present"] is False
    assert rec.model.loss is not None


def test_unexecuted_layer_is_reported_absent():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.unused = nn.Linear(3, 2), nn.Linear(3, 2)

        def forward(self, x):
            return self.a(x)

    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    rec = DenseProbe(x, y, size=4).measure(Branchy(), step=0, examples_seen=0, epoch=0)
    assert rec.layers["unused"].fisher_trace is None
    assert rec.layers["unused"].validity["gradient_absent_reason"] == "not_executed"


def test_inplace_relu_model_measures_the_same_as_out_of_place():
    x, y = make_data("mlp")
    plain = make_model("mlp")
    inplace = make_model("mlp")
    inplace[1], inplace[4] = nn.ReLU(inplace=True), nn.ReLU(inplace=True)
    a = DenseProbe(x, y, size=8).measure(plain, step=0, examples_seen=0, epoch=0)
    b = DenseProbe(x, y, size=8).measure(inplace, step=0, examples_seen=0, epoch=0)
    for name in a.layers:
        assert a.layers[name].fisher_trace == b.layers[name].fisher_trace
        assert a.layers[name].backprop_zero_fraction == b.layers[name].backprop_zero_fraction


@pytest.mark.parametrize(
    ("model", "code"),
    [
        (nn.Sequential(nn.Linear(6, 4), nn.Unflatten(1, (2, 2))), "probe_output_invalid"),
        (nn.Linear(6, 2), "probe_output_invalid"),  # labels reach class 3
        (make_model("mlp").half(), "probe_dtype_unsupported"),
        (nn.Sequential(nn.Linear(6, 4), nn.Linear(4, 4).double()), "probe_dtype_unsupported"),
        (nn.Sequential(nn.ReLU()), "probe_layer_unsupported"),
    ],
)
def test_invalid_models_refuse_with_codes(model, code):
    x, y = make_data("mlp")
    with pytest.raises(Refusal) as err:
        DenseProbe(x, y, size=8).measure(model, step=0, examples_seen=0, epoch=0)
    assert err.value.code == code and err.value.remedies


def test_reused_module_gets_the_sum_over_its_calls_and_unknown_names_refuse():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    twice = nn.Sequential(lin, nn.Tanh(), lin).double()
    x, y = torch.randn(8, 4, dtype=torch.float64), torch.randint(0, 4, (8,))
    rec = DenseProbe(x, y, size=5).measure(twice, step=0, examples_seen=0, epoch=0)
    idx = list(DenseProbe(x, y, size=5).selection.indices)
    grads, _, _ = per_example_gradients(twice, x[idx], y[idx], None, False)
    g = grads[id(lin.weight)]
    expected = (g**2).sum(1).mean()
    assert rec.layers["0"].fisher_trace == pytest.approx(expected, rel=1e-12)
    assert list(rec.layers) == ["0"]  # one module, registered twice, called twice
    assert rec.layers["0"].validity["calls"] == 2
    with pytest.raises(Refusal) as err:
        DenseProbe(x, y, size=4, layers=["1"]).measure(twice, step=0, examples_seen=0, epoch=0)
    assert err.value.code == "probe_layer_unsupported" and "Tanh" in str(err.value)
    with pytest.raises(Refusal):
        DenseProbe(x, y, size=4, layers=["0"]).measure(
            twice, step=0, examples_seen=0, epoch=0, active={"nope": False}
        )


def test_selected_layers_only_and_confusion_sums_to_n():
    model = make_model("mlp")
    x, y = make_data("mlp")
    rec = DenseProbe(x, y, size=16, layers=["3"]).measure(model, step=2, examples_seen=3, epoch=4)
    assert list(rec.layers) == ["3"]
    assert sum(map(sum, rec.model.confusion)) == 16 == sum(rec.model.predicted_counts)
    assert rec.step.to_dict() == {"optimizer_step": 2, "examples_seen": 3, "epoch": 4}


def test_measure_never_calls_backward_or_touches_grad(monkeypatch):
    model = make_model("cnn")
    x, y = make_data("cnn")
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = {n: (p.grad, p.grad.clone()) for n, p in model.named_parameters()}

    def forbidden(*args, **kwargs):
        raise AssertionError("measure called .backward()")

    monkeypatch.setattr(torch.Tensor, "backward", forbidden)
    monkeypatch.setattr(torch.autograd, "backward", forbidden)
    DenseProbe(x, y, size=6).measure(model, step=0, examples_seen=0, epoch=0)
    for n, p in model.named_parameters():
        assert p.grad is grads[n][0] and torch.equal(p.grad, grads[n][1])
