"""The readable tag layout: each default tag against float64 numpy on the tensor it describes.

Rows are reduced with the real kernels from tensors whose answers numpy computes independently
(RMS, absmax, zero fraction, l2 ratios, NaN counts); user scalars go through the layout as the
collector's run log writes them (confusion cells, predicted counts, dense-probe rows).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stepscope.events import Axes, ScalarEvent, events_from_step
from stepscope.events.tags import (
    HistogramRecord,
    MatrixRecord,
    ScalarRecord,
    TagLayout,
    run_name,
)
from stepscope.events.views import confusion_image
from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
from stepscope.runlog.evals import expand_confusion
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines

SITES = [
    SiteRecord(0, "fc", "torch.nn.Linear", "f32"),
    SiteRecord(1, "relu", "torch.nn.ReLU", "f32"),
]
D = HistogramDescriptor()


def _batch(stream, phase, tensors, hist=False, **kw):
    spines = reduce_spines(tensors).numpy()
    extra = {}
    if hist:
        extra = {
            "hist_rows": np.arange(len(tensors)),
            "histograms": reduce_histograms(tensors, D).numpy(),
        }
    return ObservationBatch.observed(
        stream, phase, list(range(len(tensors))), spines, **extra, **kw
    )


def _records(batches, detail="default", scalars=None, step=4):
    events = events_from_step(StepBlockRecord(step), batches, SITES, D, scalars)
    return TagLayout(detail).records(events)


def _scalars(records):
    return {r.tag: r.value for r in records if isinstance(r, ScalarRecord)}


def test_default_tags_are_stream_site_quantity_and_equal_numpy(tmp_path):
    g = torch.Generator().manual_seed(0)
    act = [torch.randn(64, generator=g), torch.relu(torch.randn(64, generator=g))]
    weight, bias = torch.randn(32, generator=g), torch.randn(8, generator=g)
    grads = [torch.randn(32, generator=g), torch.zeros(8)]
    new = [weight * 1.01, bias + 0.5]
    updates = [n - p for n, p in zip(new, (weight, bias))]
    batches = [
        _batch("activation", "forward", act),
        _batch("gradient", "pre_step", grads, scale_grad="unscaled"),
        _batch("parameter", "post_step", new),
        _batch("update", "post_step", updates),
    ]
    got = _scalars(_records(batches))
    f = [t.double().numpy() for t in act]
    for name, a in zip(("fc", "relu"), f):
        assert got[f"act/{name}/rms"] == pytest.approx(np.sqrt((a * a).mean()), rel=1e-12)
        assert got[f"act/{name}/absmax"] == np.abs(a).max()
        assert got[f"act/{name}/zero_fraction"] == (a == 0).mean()
    for name, gr, p, u in zip(("fc", "relu"), grads, new, updates):
        gr64, p64, u64 = gr.double().numpy(), p.double().numpy(), u.double().numpy()
        assert got[f"grad/{name}/norm"] == pytest.approx(np.linalg.norm(gr64), rel=1e-12)
        assert got[f"grad/{name}/zero_fraction"] == (gr64 == 0).mean()
        assert got[f"param/{name}/norm"] == pytest.approx(np.linalg.norm(p64), rel=1e-12)
        ratio = np.linalg.norm(u64) / np.linalg.norm(p64)
        assert got[f"update/{name}/ratio"] == pytest.approx(ratio, rel=1e-6)
    assert got["health/nonfinite"] == 0.0
    expected = (
        {f"act/{s}/{q}" for s in ("fc", "relu") for q in ("rms", "absmax", "zero_fraction")}
        | {f"grad/{s}/{q}" for s in ("fc", "relu") for q in ("norm", "absmax", "zero_fraction")}
        | {f"param/{s}/{q}" for s in ("fc", "relu") for q in ("norm", "absmax")}
        | {f"update/{s}/ratio" for s in ("fc", "relu")}
        | {"health/nonfinite"}
    )
    assert set(got) == expected  # nothing else by default: no mean/std/min/max, no zero counts


def test_nonfinite_counts_appear_only_on_the_steps_that_have_them_and_sum_into_health():
    clean = torch.ones(10)
    bad = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 2.0])
    got = _scalars(_records([_batch("activation", "forward", [clean, bad])]))
    assert "act/fc/nonfinite" not in got and got["act/relu/nonfinite"] == 3.0
    assert got["health/nonfinite"] == 3.0
    full = _scalars(_records([_batch("activation", "forward", [clean, bad], hist=True)], "full"))
    assert full["act/fc/nonfinite"] == 0.0  # full: every step, zeros included
    assert (full["act/relu/nan"], full["act/relu/posinf"], full["act/relu/neginf"]) == (1, 1, 1)


def test_full_detail_adds_every_quantity_micro_batches_and_other_phases():
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(16, generator=g), torch.randn(4, generator=g)]
    batches = [
        _batch("gradient", "backward", grads, micro_batch=1, scale_grad="scaled"),
        _batch("gradient", "pre_clip", grads, scale_grad="unscaled"),
    ]
    assert _scalars(_records(batches)) == {}  # partials and other phases: full detail only
    full = _scalars(_records(batches, "full"))
    a = grads[0].double().numpy()
    assert full["grad/fc/mb1/norm"] == pytest.approx(np.linalg.norm(a), rel=1e-12)
    assert full["grad/fc/pre_clip/std"] == pytest.approx(a.std(), rel=1e-12)
    assert {"mean", "min", "max", "rms"} <= {t.rsplit("/", 1)[1] for t in full}


def test_histograms_are_tagged_by_stream_and_site():
    x = [torch.randn(32), torch.randn(8)]
    recs = _records([_batch("gradient", "pre_step", x, hist=True, scale_grad="unscaled")])
    hists = {r.tag: r for r in recs if isinstance(r, HistogramRecord)}
    assert set(hists) == {"grad/fc", "grad/relu"}
    assert hists["grad/fc"].histogram.stats().finite == 32


def test_a_confusion_family_is_one_matrix_and_its_column_sums_go_behind_full():
    matrix = np.array([[5, 1, 0], [2, 7, 1], [0, 0, 4]])
    metrics = {"accuracy": 0.8, **expand_confusion({"confusion": matrix})}
    scalars = {f"eval/test/{k}": float(v) for k, v in metrics.items()}
    recs = _records([], scalars=scalars)
    (m,) = [r for r in recs if isinstance(r, MatrixRecord)]
    assert m.tag == "eval/test/confusion"
    np.testing.assert_array_equal(m.counts, matrix)
    assert set(_scalars(recs)) == {"eval/test/accuracy"}
    full = _scalars(_records([], "full", scalars))
    assert full["eval/test/confusion/1/2"] == 1.0 and full["eval/test/predicted_counts/0"] == 7.0


def test_the_confusion_image_shades_each_cell_by_its_rows_share():
    matrix = np.array([[6, 2, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 9]])
    img = confusion_image(matrix, size=64)
    k = 64 // 4
    centre = img[k // 2 + 1 :: k, k // 2 + 1 :: k][:4, :4].astype(float)  # one pixel per cell
    totals = matrix.sum(1, keepdims=True)
    share = matrix / np.maximum(totals, 1)  # an empty row stays white
    # white (255) at share 0, dark blue at 1: the red channel falls linearly 255 -> 8
    np.testing.assert_allclose(centre[..., 0], 255 - share * (255 - 8), atol=0.5)
    assert img.shape == (4 * k + 1, 4 * k + 1, 3)


def test_dense_probe_rows_keep_a_few_per_layer_by_default():
    scalars = {
        "probe/fc/gradient_diversity": 0.5,
        "probe/fc/validity/n_examples": 128.0,
        "probe/fc/bias/update_ratio": 1e-3,
        "probe/model/loss": 2.0,
        "probe/model/n_examples": 128.0,
        "cadence/decided": 1.0,
        "train/lr": 0.1,
    }
    assert set(_scalars(_records([], scalars=scalars))) == {
        "probe/fc/gradient_diversity",
        "probe/model/loss",
        "train/lr",
    }
    assert set(_scalars(_records([], "full", scalars))) == set(scalars)


def test_user_scalars_keep_their_names():
    recs = TagLayout().records([ScalarEvent("my/own/metric", Axes(2), 0.25)])
    assert [(r.tag, r.value) for r in recs] == [("my/own/metric", 0.25)]


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("runs/plain-seed0", "plain-seed0"),
        ("runs/exp/version_3", "exp/version_3"),
        ("runs/exp/version_3/rank001", "exp/version_3/rank001"),
        (None, "9f3c2a1b"),
    ],
)
def test_a_run_is_named_after_its_folder_not_its_hex_id(path, name):
    class Record:
        run_id = "9f3c2a1b"

    assert run_name(Record(), path) == name
