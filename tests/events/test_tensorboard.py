"""TensorBoard output read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator as ea

from stepscope.events import (
    EventKind,
    EventStream,
    TensorBoardTracker,
    events_from_step,
    exponent_view,
    tensorboard_raw,
)
from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines


def _scalars(acc, tag) -> list[tuple[int, float]]:
    """Scalars written as float64 tensor summaries, decoded with TensorBoard's tensor_util."""
    from tensorboard.util import tensor_util

    return [(t.step, float(tensor_util.make_ndarray(t.tensor_proto))) for t in acc.Tensors(tag)]


def _load(log_dir) -> ea.EventAccumulator:
    acc = ea.EventAccumulator(
        str(log_dir),
        size_guidance={ea.HISTOGRAMS: 0, ea.SCALARS: 0, ea.TENSORS: 0},  # 0: keep every event
    )
    acc.Reload()
    return acc


def test_every_histogram_reads_back_with_the_spines_exact_moments_and_counts(ev, tmp_path):
    tb = TensorBoardTracker(tmp_path / "tb")
    run = ev.train(tmp_path / "run", n_steps=4, subscribers=[tb])
    acc = _load(tmp_path / "tb")
    hist_events = [e for step in run.events for e in step if e.kind is EventKind.HISTOGRAM_COUNTS]
    assert len(hist_events) == 4 * (5 + 3)  # 5 activation sites + 3 gradients per step
    tags = set(acc.Tags()["histograms"])
    for e in hist_events:
        stored = {h.step: h.histogram_value for h in acc.Histograms(e.name)}
        hv = stored[e.optimizer_step]
        stats, hist = e.histogram.stats(), e.histogram.histogram()
        assert hv.num == stats.finite
        assert hv.min == stats.min and hv.max == stats.max
        assert hv.sum == stats.sum and hv.sum_squares == stats.sum_squares
        counts = [int(c) for c in hv.bucket]
        # exact counts: the non-empty buckets of our grid, in order, nothing added or lost
        ours = [c for _, _, c in hist.buckets() if c]
        assert [c for c in counts if c] == ours
        raw = tensorboard_raw(e.histogram)  # bucket for bucket, edges included
        assert counts == raw["bucket_counts"] and list(hv.bucket_limit) == raw["bucket_limits"]
        assert sum(counts) == stats.finite
        assert e.name + "/exponent_view" in tags


def test_histogram_moments_equal_numpy_on_the_captured_tensor(tmp_path):
    # an independent oracle: float64 numpy on the very tensor, including zeros and specials
    x = torch.tensor([0.0, 0.0, 1e-20, -3.5, 2.0, 7.25, float("nan"), float("inf")] * 3)
    d = HistogramDescriptor()
    batch = ObservationBatch.observed(
        "activation",
        "forward",
        [0],
        reduce_spines([x]).numpy(),
        hist_rows=[0],
        histograms=reduce_histograms([x], d).numpy(),
    )
    site = SiteRecord(0, "act", "torch.nn.ReLU", "f32")
    events = events_from_step(StepBlockRecord(9, examples_seen=90, epoch=2), [batch], [site], d)
    with EventStream() as stream:
        stream.subscribe(TensorBoardTracker(tmp_path / "tb"))
        stream.publish(events)
    acc = _load(tmp_path / "tb")
    (h,) = acc.Histograms("activation.forward/act")
    f = x.double().numpy()
    f = f[np.isfinite(f)]
    hv = h.histogram_value
    assert h.step == 9
    assert (hv.num, hv.min, hv.max) == (f.size, f.min(), f.max())
    assert hv.sum == pytest.approx(f.sum(), rel=1e-15)
    assert hv.sum_squares == pytest.approx((f * f).sum(), rel=1e-15)
    counts = [int(c) for c in hv.bucket]
    limits = list(hv.bucket_limit)
    # zero keeps its own zero-width bucket: the bucket whose right edge is 0.0 holds the 6 zeros
    assert counts[limits.index(0.0)] == 6
    assert sum(counts) == f.size


def test_exponent_view_counts_against_the_signed_bin_index(tmp_path):
    x = torch.tensor([0.0, 1.0, 1.0, -2.0, 2.0**-60, 3.0])
    d = HistogramDescriptor()
    batch = ObservationBatch.observed(
        "activation",
        "forward",
        [0],
        reduce_spines([x]).numpy(),
        hist_rows=[0],
        histograms=reduce_histograms([x], d).numpy(),
    )
    (event,) = [
        e
        for e in events_from_step(StepBlockRecord(1), [batch], [SiteRecord(0, "a", "m", "s")], d)
        if e.kind is EventKind.HISTOGRAM_COUNTS
    ]
    with EventStream() as stream:
        stream.subscribe(TensorBoardTracker(tmp_path / "tb"))
        stream.publish([event])
    (h,) = _load(tmp_path / "tb").Histograms("activation.forward/a/exponent_view")
    hv = h.histogram_value

    # independent index of each value: 0 zero, +1 underflow, +-(k+2) for bin k = floor(4*(log2|v|+48))
    def index(v):
        if v == 0:
            return 0
        mag = abs(v)
        i = 1 if mag < 2.0**-48 else math.floor(4 * (math.log2(mag) + 48)) + 2
        return int(math.copysign(i, v))

    want = sorted(index(float(v)) for v in x)
    got = []
    for right, c in zip(hv.bucket_limit, hv.bucket):
        got += [round(right - 0.5)] * int(c)
    assert got == want
    assert (hv.min, hv.max, hv.num) == (min(want), max(want), len(want))
    assert hv.sum == sum(want) and hv.sum_squares == sum(i * i for i in want)
    idx, counts = exponent_view(event.histogram)
    assert counts.sum() == 6 and idx[np.flatnonzero(counts)].tolist() == sorted(set(want))


def test_scalars_read_back_on_the_declared_axis(ev, tmp_path):
    by_step = TensorBoardTracker(tmp_path / "steps")
    by_examples = TensorBoardTracker(
        tmp_path / "examples", axis="examples_seen", exponent_view=False
    )
    run = ev.train(tmp_path / "run", n_steps=3, subscribers=[by_step, by_examples])
    losses = [next(e.value for e in step if e.name == "loss") for step in run.events]
    a, b = _load(tmp_path / "steps"), _load(tmp_path / "examples")
    assert _scalars(a, "loss") == list(enumerate(losses))
    assert [s for s, _ in _scalars(b, "loss")] == [16, 32, 48]
    l2 = _scalars(a, "gradient.pre_step/fc1/l2")
    want = [
        next(e.value for e in step if e.name == "gradient.pre_step/fc1/l2") for step in run.events
    ]
    assert [v for _, v in l2] == want  # float64, bit for bit
    assert not any(t.endswith("/exponent_view") for t in b.Tags()["histograms"])


def test_unavailable_values_are_not_written_as_zero(ev, tmp_path):
    tb = TensorBoardTracker(tmp_path / "tb")
    ev.train(tmp_path / "run", n_steps=3, skip_activation_site=(1, "relu1"), subscribers=[tb])
    steps = [s for s, _ in _scalars(_load(tmp_path / "tb"), "activation.forward/relu1/mean")]
    assert steps == [0, 2]
    assert tb.counts.unavailable == 1
