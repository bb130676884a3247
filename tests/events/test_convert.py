"""events_from_step against float64 numpy computed directly on the tensors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from stepscope.events import EventKind, EventSource, GradientStage, SpineScalar, events_from_step
from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence, ScaleGrad, Stream
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines

SITES = [SiteRecord(i, f"s{i}", "torch.nn.Linear", "f32") for i in range(4)]
DESC = HistogramDescriptor()


def _by_name(events):
    return {e.name: e for e in events}


def test_spine_scalars_match_numpy_on_real_tensors(ev):
    g = torch.Generator().manual_seed(3)
    tensors = [
        torch.randn(5, 7, generator=g),
        torch.relu(torch.randn(64, generator=g)),  # many exact zeros
        torch.tensor([1.0, float("nan"), -float("inf"), 0.0, 3.0]),
        torch.randn(3, 3, generator=g, dtype=torch.float64) * 1e-20,
    ]
    batch = ObservationBatch.observed(
        "activation", "forward", [0, 1, 2, 3], reduce_spines(tensors).numpy()
    )
    events = events_from_step(StepBlockRecord(5, examples_seen=80, epoch=1), [batch], SITES, DESC)
    by = _by_name(events)
    assert len(events) == 4 * len(SpineScalar)
    for i, t in enumerate(tensors):
        oracle = ev.np_spine_scalars(t)
        for field, want in oracle.items():
            e = by[f"activation.forward/s{i}/{field}"]
            assert e.kind is EventKind.SCALAR and e.source is EventSource.SPINE
            assert e.value == pytest.approx(want, rel=1e-12, abs=0), (i, field)
    assert by["activation.forward/s2/nonfinite_count"].value == 2
    assert by["activation.forward/s1/zero_fraction"].value == float(
        (tensors[1] == 0).double().mean()
    )


def test_every_event_carries_the_three_axes_and_site_stream_phase():
    t = torch.randn(4, 4)
    block = StepBlockRecord(12, examples_seen=768, epoch=3)
    batch = ObservationBatch.observed("parameter", "pre_step", [1], reduce_spines([t]).numpy())
    events = events_from_step(block, [batch], SITES, DESC, scalars={"loss": 0.25, "lr": 0.1})
    assert {(e.optimizer_step, e.examples_seen, e.epoch) for e in events} == {(12, 768, 3)}
    spine = [e for e in events if e.source is EventSource.SPINE]
    assert {(e.site, e.stream, e.phase.value) for e in spine} == {
        ("s1", Stream.PARAMETER, "pre_step")
    }
    user = [e for e in events if e.source is EventSource.USER_SCALAR]
    assert [(e.name, e.value, e.site) for e in user] == [("loss", 0.25, None), ("lr", 0.1, None)]


def test_unknown_axes_stay_none_never_zero():
    batch = ObservationBatch.observed(
        "activation", "forward", [0], reduce_spines([torch.ones(3)]).numpy()
    )
    events = events_from_step(StepBlockRecord(4), [batch], SITES, DESC)
    assert all(e.examples_seen is None and e.epoch is None for e in events)


def test_gradient_scalars_carry_stage_and_scale_provenance():
    gs = [torch.randn(3, 3), torch.randn(2)]
    spines = reduce_spines(gs).numpy()
    whole = ObservationBatch.observed("gradient", "post_clip", [0, 1], spines, scale_grad="scaled")
    micro = ObservationBatch.observed(
        "activation_grad", "backward", [2, 3], spines, scale_grad="unknown", micro_batch=1
    )
    events = events_from_step(StepBlockRecord(0), [whole, micro], SITES, DESC)
    g = [e for e in events if e.stream is Stream.GRADIENT]
    assert {(e.stage, e.scale_provenance) for e in g} == {
        (GradientStage.POST_CLIP, ScaleGrad.SCALED)
    }
    a = [e for e in events if e.stream is Stream.ACTIVATION_GRAD]
    assert {(e.stage, e.scale_provenance, e.micro_batch) for e in a} == {
        (GradientStage.MICRO_BATCH, ScaleGrad.UNKNOWN, 1)
    }
    assert all("/mb1/" in e.name for e in a)
    act = events_from_step(
        StepBlockRecord(0),
        [ObservationBatch.observed("activation", "forward", [0], spines[:1])],
        SITES,
        DESC,
    )
    assert all(e.stage is None and e.scale_provenance is None for e in act)


def test_non_observed_rows_become_unavailable_with_the_presence_as_reason():
    spines = reduce_spines([torch.ones(2), torch.ones(2), torch.ones(2)]).numpy()
    presence = np.array(
        [
            code_of(Presence.OBSERVED),
            code_of(Presence.NOT_SCHEDULED),
            code_of(Presence.CAPTURE_FAILED),
        ]
    )
    spines[1:] = np.nan
    batch = ObservationBatch("activation", "forward", [0, 1, 2], presence, spines)
    events = events_from_step(StepBlockRecord(2), [batch], SITES, DESC)
    missing = [e for e in events if e.kind is EventKind.UNAVAILABLE]
    assert [(e.site, e.reason) for e in missing] == [
        ("s1", "not_scheduled"),
        ("s2", "capture_failed"),
    ]
    assert not any(e.kind is EventKind.SCALAR and e.site in ("s1", "s2") for e in events)


def test_fields_without_finite_values_are_unavailable_not_zero_or_nan():
    tensors = [torch.full((4,), float("nan")), torch.empty(0)]
    batch = ObservationBatch.observed(
        "activation", "forward", [0, 1], reduce_spines(tensors).numpy()
    )
    by = _by_name(events_from_step(StepBlockRecord(0), [batch], SITES, DESC))
    for field in ("l2", "mean", "std", "min", "max", "absmax"):
        e = by[f"activation.forward/s0/{field}"]
        assert e.kind is EventKind.UNAVAILABLE and e.reason == "undefined_no_finite_values"
        assert by[f"activation.forward/s1/{field}"].reason == "undefined_empty_tensor"
    assert by["activation.forward/s0/zero_fraction"].value == 0.0  # measured: no zeros among 4
    assert by["activation.forward/s0/nonfinite_count"].value == 4
    assert by["activation.forward/s1/zero_fraction"].reason == "undefined_empty_tensor"
    values = [e.value for e in by.values() if e.kind is EventKind.SCALAR]
    assert all(math.isfinite(v) for v in values)


def test_one_histogram_event_per_histogram_row_with_exact_counts():
    tensors = [torch.randn(50), torch.randn(20), torch.randn(9)]
    counts = reduce_histograms([tensors[0], tensors[2]], DESC).numpy()
    spines = reduce_spines(tensors).numpy()
    batch = ObservationBatch.observed(
        "gradient",
        "backward",
        [0, 1, 2],
        spines,
        hist_rows=[0, 2],
        histograms=counts,
        scale_grad="unscaled",
    )
    hist = [
        e
        for e in events_from_step(StepBlockRecord(1), [batch], SITES, DESC)
        if e.kind is EventKind.HISTOGRAM_COUNTS
    ]
    assert [e.site for e in hist] == ["s0", "s2"]
    assert np.array_equal(hist[1].histogram.counts, counts[1])
    assert np.array_equal(hist[1].histogram.spine, spines[2])
    assert hist[0].histogram.histogram().total == 50
    assert hist[0].stage is GradientStage.BACKWARD
    with pytest.raises(ValueError):
        hist[0].histogram.counts[0] = 1  # read-only: events are immutable


def test_unknown_site_id_refuses():
    batch = ObservationBatch.observed(
        "activation", "forward", [9], reduce_spines([torch.ones(2)]).numpy()
    )
    from stepscope.errors import Refusal

    with pytest.raises(Refusal) as err:
        events_from_step(StepBlockRecord(0), [batch], SITES, DESC)
    assert err.value.code == "history_series_unknown"


def test_fast_path_events_equal_fully_validated_events(ev, tmp_path):
    import dataclasses

    run = ev.train(tmp_path / "run", n_steps=2, skip_activation_site=(1, "fc2"))
    events = [e for step in run.events for e in step]
    assert len(events) > 100
    for e in events:  # through the keyword constructor, which takes the slow path on any doubt
        rebuilt = type(e)(**{f.name: getattr(e, f.name) for f in dataclasses.fields(e)})
        assert rebuilt == e
        assert rebuilt.to_dict() == e.to_dict()
        with pytest.raises(dataclasses.FrozenInstanceError):
            e.name = "x"  # type: ignore[misc]
