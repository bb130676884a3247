"""analyze_curvature: purity, refusals, sampled-mode normalisation, metadata and JSON shape."""

from __future__ import annotations

import copy
import hashlib
import json
import random

import numpy as np
import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope._purity import snapshot_rng


def model_and_data(seed: int = 0, n: int = 6):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Dropout(0.5), nn.Linear(5, 3))
    g = torch.Generator().manual_seed(seed + 1)
    return model, torch.randn(n, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def assert_tree_close(a, b, rel=1e-10):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_tree_close(a[k], b[k], rel)
    elif isinstance(a, list):
        assert len(a) == len(b)
        scale = max([abs(v) for v in a] + [1e-300])
        for u, v in zip(a, b):
            assert u == pytest.approx(v, rel=rel, abs=rel * scale)
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=rel, abs=1e-300)
    else:
        assert a == b


def test_model_optimizer_grads_modes_and_rng_are_preserved():
    model, x, y = model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    nn.functional.cross_entropy(model(x), y).backward()  # leave fresh .grad values in place
    model.train()
    model[0].weight.requires_grad_(False)
    params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    grads = [(p.grad, None if p.grad is None else p.grad.clone()) for p in model.parameters()]
    opt_state = copy.deepcopy(opt.state_dict())
    random.seed(5)
    np.random.seed(5)  # noqa: NPY002 - the global state is what we check
    rng = snapshot_rng()
    torch.set_float32_matmul_precision("medium")
    try:
        ss.analyze_curvature(model, x, y)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision("highest")
    assert snapshot_rng().equals(rng)
    assert all(m.training for m in model.modules())
    assert model[0].weight.requires_grad is False and model[0].bias.requires_grad
    for k, v in model.state_dict().items():
        assert torch.equal(v, params[k]) and v.dtype == torch.float32
    for p, (obj, val) in zip(model.parameters(), grads):
        assert p.grad is obj and (val is None or torch.equal(p.grad, val))
    after = opt.state_dict()
    for k, st in opt_state["state"].items():
        assert torch.equal(after["state"][k]["momentum_buffer"], st["momentum_buffer"])


def test_result_is_json_ready_and_metadata_records_provenance():
    model, x, y = model_and_data()
    out = ss.analyze_curvature(model, x, y, probe_id="probe-A")
    text = json.dumps(out, allow_nan=False)  # no NaN/inf anywhere
    assert json.loads(text) == out
    meta = out["metadata"]
    want_hash = hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest()
    assert meta["probe_sha256"] == want_hash and meta["probe_id"] == "probe-A"
    assert meta["analysis_dtype"] == "float64" and meta["supplied_model_dtype"] == "torch.float32"
    assert meta["mode"] == "exact" and meta["backward_passes"] == 3
    assert meta["elapsed_s"] > 0 and meta["largest_eigenproblem_dimension"] == 5
    assert "kfac_fro" in meta["omitted_legacy_quantities"]
    assert meta["legacy_names"]["output_space.lyapunov.rho_ambient"] == "mismatch/rho"
    assert set(out["layers"]) == {"0", "3"} and set(out["directional"]) == {"0", "3"}
    fam = out["layers"]["3"]["ce_ggn"]
    assert set(fam) == {"weight", "bias", "kfac", "backprop_factor"}
    assert set(fam["kfac"]) >= {
        "trace",
        "frobenius",
        "top_eigenvalue",
        "effective_rank",
        "stable_rank",
        "relative_diagonal_error",
    }
    assert ss.analyze_curvature(model, x, y, include_directional=False)["directional"] is None


def test_eval_mode_makes_dropout_models_deterministic():
    model, x, y = model_and_data()
    model.train()
    a = ss.analyze_curvature(model, x, y)
    b = ss.analyze_curvature(model, x, y)
    a["metadata"].pop("elapsed_s"), b["metadata"].pop("elapsed_s")
    assert a == b and a["metadata"]["model_mode_during_analysis"] == "eval"


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"mode": "lanczos"}, "curvature_mode_invalid"),
        ({"mode": "exact", "samples": 4}, "curvature_mode_invalid"),
        ({"mode": "sampled", "samples": 0}, "curvature_input_invalid"),
        ({"eig_max_dimension": 0}, "curvature_input_invalid"),
    ],
)
def test_bad_options_refuse(kwargs, code):
    model, x, y = model_and_data()
    with pytest.raises(ss.Refusal) as err:
        ss.analyze_curvature(model, x, y, **kwargs)
    assert err.value.code == code and err.value.remedies


@pytest.mark.parametrize(
    "x, y",
    [
        (torch.randn(6, 4), torch.zeros(5, dtype=torch.int64)),
        (torch.randn(6, 4), torch.zeros(6)),
        (torch.randn(6, 4), torch.full((6,), 3)),
        (torch.full((6, 4), float("nan")), torch.zeros(6, dtype=torch.int64)),
    ],
    ids=["length", "float_labels", "label_range", "nan_input"],
)
def test_bad_inputs_refuse(x, y):
    model, _, _ = model_and_data()
    with pytest.raises(ss.Refusal) as err:
        ss.analyze_curvature(model, x, y)
    assert err.value.code == "curvature_input_invalid"


def test_sampled_mode_is_unbiased_and_keeps_empirical_fisher_exact():
    model, x, y = model_and_data(n=5)
    exact = ss.analyze_curvature(model, x, y, include_directional=False)
    keys = [
        ("ce_ggn", "weight", "trace"),
        ("jacobian_gram", "weight", "trace"),
        ("ce_ggn", "kfac", "trace"),
        ("jacobian_gram", "bias", "trace"),
    ]
    runs = [
        ss.analyze_curvature(
            model, x, y, mode="sampled", samples=2, seed=s, include_directional=False
        )
        for s in range(40)
    ]
    for fam, part, key in keys:
        vals = np.array([r["layers"]["0"][fam][part][key] for r in runs])
        want = exact["layers"]["0"][fam][part][key]
        assert vals.std() > 1e-6 * abs(want)  # genuinely random
        stderr = vals.std(ddof=1) / np.sqrt(len(vals))
        assert abs(vals.mean() - want) < 4 * stderr + 1e-12, (fam, part, key)
    one = runs[0]
    assert one["metadata"]["mode"] == "sampled" and one["metadata"]["backward_passes"] == 1 + 2 + 2
    assert "Rademacher" in one["metadata"]["estimators"]["ce_ggn"]
    assert "exact" in one["metadata"]["estimators"]["empirical_fisher"]
    for layer in ("0", "3"):  # same numbers, up to summation order (exact mode mixes Jacobians)
        assert_tree_close(
            one["layers"][layer]["empirical_fisher"], exact["layers"][layer]["empirical_fisher"]
        )


def test_sampled_mode_converges_as_samples_grow():
    model, x, y = model_and_data(n=4)
    want = ss.analyze_curvature(model, x, y, include_directional=False)["layers"]["0"]["ce_ggn"][
        "weight"
    ]["trace"]
    errs = []
    for samples in (1, 1024):
        got = [
            ss.analyze_curvature(
                model, x, y, mode="sampled", samples=samples, seed=s, include_directional=False
            )
            for s in range(2)
        ]
        errs.append(
            max(abs(g["layers"]["0"]["ce_ggn"]["weight"]["trace"] - want) for g in got) / want
        )
    assert errs[1] < 0.1 and errs[1] < errs[0]


def test_dead_layer_gives_none_values_that_are_counted_not_zeros():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every ReLU output is 0: layer 2 sees a zero activation
    x, y = torch.randn(6, 4), torch.randint(0, 3, (6,))
    out = ss.analyze_curvature(model, x, y)
    layer = out["layers"]["2"]
    assert layer["activation_factor"]["top_eigenvalue"] == 0.0
    assert layer["activation_factor"]["stable_rank"] is None
    assert layer["activation_factor"]["effective_rank"] is None
    for fam in ("empirical_fisher", "ce_ggn", "jacobian_gram"):
        assert layer[fam]["kfac"]["relative_diagonal_error"] is None
        assert layer[fam]["weight"]["trace"] == 0.0  # a measured zero: the block is zero
    paths = out["metadata"]["undefined_values"]["paths"]
    assert "layers.2.ce_ggn.kfac.relative_diagonal_error" in paths
    assert out["metadata"]["undefined_values"]["count"] == len(paths) > 0
    mom = out["directional"]["2"]["gradient_moments"]
    assert mom["mean_gradient_zero"] and mom["gradient_diversity"] is None
    assert "directional.2.gradient_moments.gradient_diversity" in paths
    # layer 0 gets no gradient through the dead ReLU either: its ratios are None, not zero
    pe = out["directional"]["0"]["ce_ggn"]["per_example_rayleigh_quotient"]
    assert pe["valid_count"] == 0 and pe["mean"] is None


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_works_under_no_grad_and_inference_mode(context):
    model, x, y = model_and_data()
    want = ss.analyze_curvature(model, x, y)["layers"]
    with context():
        got = ss.analyze_curvature(model, x, y)["layers"]
    assert got == want
