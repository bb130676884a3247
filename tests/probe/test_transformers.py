"""The dense probe on sequence / transformer models against a float64 torch.func oracle."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stepscope import Refusal
from stepscope.probe import DenseProbe
from tests.probe.transformer_testkit import (
    TARGETS,
    Conv1D,
    make_transformer,
    make_transformer_data,
    moments,
    per_example_gradients,
)

RTOL = 1e-10
ZERO = 1e-24  # squared-gradient scale below which a block is round-off of an exact zero
FIELDS = (
    "fisher_trace",
    "mean_grad_sq_norm",
    "gradient_diversity",
    "grad_norm_rms",
    "grad_fro_legacy_scale",
)
KINDS = ["gpt", "bert", "vit", "hf_gpt2", "hf_bert"]


def _probe(kind: str, **kwargs) -> tuple[DenseProbe, torch.Tensor, torch.Tensor]:
    x, y = make_transformer_data(kind)
    _, output, next_token = TARGETS[kind]
    probe = DenseProbe(x, y, size=6, seed=2, output=output, next_token=next_token, **kwargs)
    return probe, x, y


def _check_block(block, ref: dict[str, float], key: str) -> None:
    if ref["fisher_trace"] < ZERO:  # e.g. an attention key bias: zero up to round-off
        assert block.fisher_trace < ZERO, key
        return
    for field in FIELDS:
        got = getattr(block, field)
        assert got is not None and math.isclose(got, ref[field], rel_tol=RTOL), (key, field)
    assert abs(block.covariance_trace - ref["covariance_trace"]) <= RTOL * ref["fisher_trace"]
    for q, v in block.grad_norm_quantiles.items():
        assert math.isclose(v, ref[f"q_{q}"], rel_tol=RTOL), (key, q)


@pytest.mark.parametrize("kind", KINDS)
def test_every_layer_moment_matches_torch_func_per_example_gradients(kind):
    if kind.startswith("hf_"):
        pytest.importorskip("transformers")
    model = make_transformer(kind)
    probe, x, y = _probe(kind)
    rec = probe.measure(model, step=0, examples_seen=0, epoch=0)
    idx = list(probe.selection.indices)
    _, output, next_token = TARGETS[kind]
    grads, losses, targets = per_example_gradients(model, x[idx], y[idx], output, next_token)
    assert math.isclose(rec.model.loss, sum(losses) / targets, rel_tol=RTOL)
    assert rec.model.n_targets == targets and rec.model.n_examples == len(idx)
    modules = dict(model.named_modules())
    measured_params = set()
    for name, layer in rec.layers.items():
        for part, block in (("weight", layer), ("bias", layer.bias)):
            param = getattr(modules[name], part, None)
            if not isinstance(param, nn.Parameter):
                assert block is None
                continue
            measured_params.add(id(param))
            _check_block(block, moments(grads[id(param)]), f"{name}.{part}")
    kinds = {layer.kind for layer in rec.layers.values()}
    expected = {
        "gpt": {"embedding", "hf_conv1d", "linear", "layernorm"},
        "bert": {"embedding", "conv1d", "linear", "layernorm", "rmsnorm"},
        "vit": {"conv2d", "linear", "layernorm"},
        "hf_gpt2": {"embedding", "hf_conv1d", "linear", "layernorm"},
        "hf_bert": {"embedding", "linear", "layernorm"},
    }[kind]
    assert kinds == expected
    # every parameter owned by a module as weight/bias is measured (the ViT class token is not)
    owned = {
        id(p)
        for m in modules.values()
        for k, p in m._parameters.items()
        if k in ("weight", "bias") and p is not None
    }
    assert owned <= measured_params


def test_tied_head_reports_the_parameters_total_gradient_in_both_records():
    model = make_transformer("gpt")
    probe, x, y = _probe("gpt")
    rec = probe.measure(model, step=0, examples_seen=0, epoch=0)
    head, emb = rec.layers["lm_head"], rec.layers["wte"]
    assert head.fisher_trace == emb.fisher_trace
    assert head.validity["shared_with"] == ["wte"] and emb.validity["shared_with"] == ["lm_head"]
    # the head's use alone would be a different number: the sum over uses is what is reported
    alone = DenseProbe(x, y, size=6, seed=2, output="logits", next_token=True, layers=["wte"])
    assert alone.measure(model, step=0, examples_seen=0, epoch=0).layers["wte"].fisher_trace == (
        emb.fisher_trace
    )


def test_naming_only_the_tied_head_still_counts_the_embedding_use():
    model = make_transformer("gpt")
    x, y = make_transformer_data("gpt")
    probe = DenseProbe(x, y, size=6, seed=2, output="logits", next_token=True, layers=["lm_head"])
    rec = probe.measure(model, step=0, examples_seen=0, epoch=0)
    idx = list(probe.selection.indices)
    grads, _, _ = per_example_gradients(model, x[idx], y[idx], "logits", True)
    _check_block(rec.layers["lm_head"], moments(grads[id(model.lm_head.weight)]), "lm_head")


def test_dict_output_without_a_selector_refuses_naming_the_keys():
    model = make_transformer("bert")
    x, y = make_transformer_data("bert")
    with pytest.raises(Refusal) as err:
        DenseProbe(x, y, size=4).measure(model, step=0, examples_seen=0, epoch=0)
    assert err.value.code == "probe_output_invalid" and "logits" in str(err.value)


@pytest.mark.parametrize(
    ("module", "type_name"),
    [(nn.Bilinear(8, 8, 8), "Bilinear"), (nn.Conv1d(8, 8, 3, groups=2), "groups=2")],
)
def test_unsupported_named_layer_refuses_naming_its_type(module, type_name):
    model = nn.Sequential(nn.Linear(8, 8), module)
    with pytest.raises(Refusal) as err:
        DenseProbe(
            torch.randn(4, 8), torch.zeros(4, dtype=torch.long), size=2, layers=["1"]
        ).measure(model, step=0, examples_seen=0, epoch=0)
    assert err.value.code == "probe_layer_unsupported" and type_name in str(err.value)


def test_hf_conv1d_is_recognised_by_duck_type_and_measured_like_its_linear_twin():
    torch.manual_seed(0)
    conv = Conv1D(3, 5).double()
    lin = nn.Linear(5, 3).double()
    with torch.no_grad():
        lin.weight.copy_(conv.weight.T)
        lin.bias.copy_(conv.bias)
    x = torch.randn(8, 4, 5, dtype=torch.float64)
    y = torch.randint(0, 3, (8, 4))
    a = DenseProbe(x, y, size=5).measure(conv, step=0, examples_seen=0, epoch=0).layers[""]
    b = DenseProbe(x, y, size=5).measure(lin, step=0, examples_seen=0, epoch=0).layers[""]
    assert a.kind == "hf_conv1d" and b.kind == "linear"
    for field in FIELDS:
        assert math.isclose(getattr(a, field), getattr(b, field), rel_tol=RTOL)


def test_token_targets_without_shift_score_every_position_and_ignore_minus_100():
    model = make_transformer("gpt")
    x, y = make_transformer_data("gpt")
    probe = DenseProbe(x, y, size=6, seed=2, output="logits")
    rec = probe.measure(model, step=0, examples_seen=0, epoch=0)
    idx = list(probe.selection.indices)
    grads, losses, targets = per_example_gradients(model, x[idx], y[idx], "logits", False)
    assert rec.model.n_targets == targets == int((y[idx] != -100).sum())
    assert math.isclose(rec.model.loss, sum(losses) / targets, rel_tol=RTOL)
    _check_block(rec.layers["block.c_fc"], moments(grads[id(model.block.c_fc.weight)]), "c_fc")


def test_confusion_above_the_class_cap_is_bounded_and_matches_a_dense_count():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 40)).double()
    x = torch.randn(64, 6, dtype=torch.float64)
    y = torch.randint(0, 40, (64,))
    dense = DenseProbe(x, y, size=48).measure(model, step=0, examples_seen=0, epoch=0).model
    bounded = (
        DenseProbe(x, y, size=48, confusion_cap=16)
        .measure(model, step=0, examples_seen=0, epoch=0)
        .model
    )
    assert dense.confusion_mode == "dense" and bounded.confusion_mode == "bounded"
    assert bounded.confusion == [] and bounded.confusion_class_cap == 16
    full = torch.tensor(dense.confusion)
    assert bounded.predicted_counts == dense.predicted_counts
    assert bounded.n_correct == dense.n_correct == int(full.trace())
    off = full - torch.diag(full.diag())
    assert bounded.per_class_errors == off.sum(1).tolist()
    pairs = sorted(
        ([t, p, int(off[t, p])] for t in range(40) for p in range(40) if off[t, p] > 0),
        key=lambda r: (-r[2], r[0] * 40 + r[1]),
    )
    assert bounded.top_confused_pairs == pairs[:32]


def test_a_50257_class_head_never_allocates_a_class_by_class_matrix(monkeypatch):
    torch.manual_seed(0)
    model = nn.Linear(8, 50257)
    x, y = torch.randn(32, 8), torch.randint(0, 50257, (32,))
    real = torch.bincount

    def bounded_bincount(t, weights=None, minlength=0):
        assert max(minlength, int(t.max()) + 1 if t.numel() else 0) <= 50257, "C x C bincount"
        return real(t, weights, minlength)

    monkeypatch.setattr(torch, "bincount", bounded_bincount)
    rec = DenseProbe(x, y, size=16).measure(model, step=0, examples_seen=0, epoch=0)
    assert rec.model.confusion_mode == "bounded" and sum(rec.model.predicted_counts) == 16


def test_bounded_confusion_writes_rows_linear_in_the_probe_not_the_class_count():
    from stepscope.probe import probe_scalar_rows

    torch.manual_seed(0)
    model = nn.Linear(8, 5000)
    x, y = torch.randn(32, 8), torch.randint(0, 5000, (32,))
    rec = DenseProbe(x, y, size=16).measure(model, step=0, examples_seen=0, epoch=0)
    rows = probe_scalar_rows(rec)
    counts = [k for k in rows if k.startswith("probe/model/predicted_counts/")]
    assert 1 <= len(counts) <= 16 and len(rows) < 500
    assert sum(rows[k] for k in counts) == 16
    assert sum(v for k, v in rows.items() if "/per_class_errors/" in k) == 16 - rec.model.n_correct


def test_measuring_a_transformer_mid_training_leaves_the_run_bitwise_unchanged():
    def train(observe: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
        model = make_transformer("gpt").train()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = make_transformer_data("gpt", n=12)
        probe = DenseProbe(x, y, size=4, output="logits", next_token=True)
        torch.manual_seed(5)
        for step in range(3):
            opt.zero_grad()
            logits = model(x)["logits"][:, :-1]
            loss = nn.functional.cross_entropy(logits.reshape(-1, 23), y[:, 1:].reshape(-1))
            loss.backward()
            if observe:
                probe.measure(model, step=step, examples_seen=12 * step, epoch=0)
            opt.step()
        return [p.detach().clone() for p in model.parameters()], torch.get_rng_state()

    observed, rng_a = train(True)
    plain, rng_b = train(False)
    assert all(torch.equal(a, b) for a, b in zip(observed, plain)) and torch.equal(rng_a, rng_b)
