"""TensorBoard output read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing import event_accumulator as ea

from stepscope.events import (
    EventBus,
    EventKind,
    TensorBoardTracker,
    events_from_step,
    exponent_view,
    tensorboard_raw,
)
from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines


def _scalars(acc, tag) -> list[tuple[int, float]]:
    """Scalars as TensorBoard's Scalars page reads them (float32 ``simple_value``)."""
    return [(s.step, s.value) for s in acc.Scalars(tag)]


#: the tag group of each stream (docs/events.md, "Tags")
GROUP = {"activation": "act", "gradient": "grad", "parameter": "param", "update": "update"}


def _tag(e) -> str:
    """The tag of a site's histogram: ``<stream group>/<site>``."""
    return f"{GROUP[e.stream.value]}/{e.site}"


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
        stored = {h.step: h.histogram_value for h in acc.Histograms(_tag(e))}
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
        assert _tag(e) + "/exponent_view/positive" in tags or hist.negative.any()


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
    with EventBus() as bus:
        bus.subscribe(TensorBoardTracker(tmp_path / "tb"))
        bus.publish(events)
    acc = _load(tmp_path / "tb")
    (h,) = acc.Histograms("act/act")
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


def _one_histogram_event(x: torch.Tensor):
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
    return event


def test_exponent_views_count_each_sign_against_log2_abs_in_octaves(tmp_path):
    x = torch.tensor([0.0, 1.0, 1.0, -2.0, 2.0**-60, 3.0, -0.3, 2.0**20])
    event = _one_histogram_event(x)
    with EventBus() as bus:
        bus.subscribe(TensorBoardTracker(tmp_path / "tb"))
        bus.publish([event])
    acc = _load(tmp_path / "tb")

    # independent right edge (octaves) of each value's bucket: underflow ends at -48, bin k of
    # [2^(-48 + k/4), 2^(-48 + (k+1)/4)) ends at -48 + (k+1)/4, overflow (>= 2^16) ends at 17
    def right_edge(v):
        mag = abs(v)
        if mag < 2.0**-48:
            return -48.0
        if mag >= 2.0**16:
            return 17.0
        return -48 + (math.floor(4 * (math.log2(mag) + 48)) + 1) / 4

    for label, sign in (("positive", 1), ("negative", -1)):
        (h,) = acc.Histograms(f"act/a/exponent_view/{label}")
        hv = h.histogram_value
        got = []
        for right, c in zip(hv.bucket_limit, hv.bucket):
            got += [right] * int(c)
        want = sorted(right_edge(float(v)) for v in x if v * sign > 0)
        assert got == want
        assert hv.num == len(want)
        # the axis is log2|x| in octaves: every bucket is 1/4 octave wide, inside [-49, 17]
        assert -49.0 <= hv.min and hv.max <= 17.0
    # the old signed bin-index axis (-200..200) is gone
    assert "act/a/exponent_view" not in acc.Tags()["histograms"]
    _, counts = exponent_view(event.histogram)  # the W&B index view keeps every finite value
    assert counts.sum() == 8


def test_nan_and_infinities_are_one_count_and_bands_and_full_detail_splits_them(tmp_path):
    nan, inf = float("nan"), float("inf")
    x = torch.tensor([1.0, nan, nan, inf, -inf, -inf, -inf, 0.5])
    d = HistogramDescriptor()
    batch = ObservationBatch.observed(
        "activation",
        "forward",
        [0],
        reduce_spines([x]).numpy(),
        hist_rows=[0],
        histograms=reduce_histograms([x], d).numpy(),
    )
    events = events_from_step(StepBlockRecord(1), [batch], [SiteRecord(0, "a", "m", "s")], d)
    with EventBus() as bus:
        bus.subscribe(TensorBoardTracker(tmp_path / "tb"))
        bus.subscribe(TensorBoardTracker(tmp_path / "full", detail="full"))
        bus.publish(events)
    acc, full = _load(tmp_path / "tb"), _load(tmp_path / "full")
    a = x.double().numpy()
    want = {
        "nan": int(np.isnan(a).sum()),
        "posinf": int(np.isposinf(a).sum()),
        "neginf": int(np.isneginf(a).sum()),
    }
    # default: one non-finite count per site (written because it is > 0) and the step's total
    assert _scalars(acc, "act/a/nonfinite") == [(1, float(sum(want.values())))]
    assert _scalars(acc, "health/nonfinite") == [(1, float(sum(want.values())))]
    assert not any(t.endswith("_count") or t.endswith("/nan") for t in acc.Tags()["scalars"])
    for name, n in want.items():  # full detail: each kind, from the histogram's exact specials
        assert _scalars(full, f"act/a/{name}") == [(1, float(n))]
    (h,) = acc.Histograms("act/a/nonfinite_bands")
    bands = dict(zip(h.histogram_value.bucket_limit, h.histogram_value.bucket))
    assert bands == {-0.5: want["neginf"], 0.5: want["nan"], 1.5: want["posinf"]}
    (v,) = acc.Histograms("act/a")  # the value axis holds the finite values
    assert v.histogram_value.num == np.isfinite(a).sum()


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
    l2 = _scalars(a, "grad/fc1/norm")
    want = [
        next(e.value for e in step if e.name == "gradient.pre_step/fc1/l2") for step in run.events
    ]
    assert [v for _, v in l2] == [float(np.float32(w)) for w in want]  # float32 simple_value
    assert not any("/exponent_view" in t for t in b.Tags()["histograms"])


def test_unavailable_values_are_not_written_as_zero(ev, tmp_path):
    tb = TensorBoardTracker(tmp_path / "tb")
    ev.train(tmp_path / "run", n_steps=3, skip_activation_site=(1, "relu1"), subscribers=[tb])
    steps = [s for s, _ in _scalars(_load(tmp_path / "tb"), "act/relu1/rms")]
    assert steps == [0, 2]
    assert tb.counts.unavailable == 1


def test_fast_record_checksums_are_tensorboards_own_masked_crc32c_byte_for_byte():
    pytest.importorskip("crc32c")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as pure
    from tensorboard.summary.writer import record_writer

    from stepscope.events.trackers.tensorboard import use_fast_record_checksums

    assert use_fast_record_checksums() and use_fast_record_checksums()  # idempotent
    fast = record_writer.masked_crc32c
    assert fast is not pure and fast.stepscope_fast
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 60, 4096, 10_001):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert fast(data) == pure(data)
