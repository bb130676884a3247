"""Axes and Subject: validated once, shared by every event of a step / a row, picklable."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from stepscope.errors import Refusal
from stepscope.events import (
    NO_SUBJECT,
    Axes,
    Axis,
    CheckFailed,
    GradientStage,
    ScalarEvent,
    Subject,
    UnavailableEvent,
    events_from_step,
)
from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
from stepscope.history.vocab import Phase, ScaleGrad, Stream
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines


def test_axes_read_one_axis_by_name_or_member():
    a = Axes(7, examples_seen=448, epoch=None)
    assert [a.of(x) for x in Axis] == [7, 448, None]
    assert a.of("examples_seen") == 448
    with pytest.raises(ValueError):
        a.of("wall_time")


def test_subject_coerces_its_vocabularies_and_refuses_unknown_values():
    s = Subject("fc", "gradient", "backward", 0, "micro_batch", "scaled")
    assert (s.stream, s.phase, s.stage, s.scale_provenance) == (
        Stream.GRADIENT,
        Phase.BACKWARD,
        GradientStage.MICRO_BATCH,
        ScaleGrad.SCALED,
    )
    for bad in ({"phase": "sideways"}, {"site": 3}, {"micro_batch": 1.0}, {"stage": "late"}):
        with pytest.raises(Refusal) as err:
            Subject(**bad)
        assert err.value.code == "event_invalid"
    assert NO_SUBJECT == Subject() and NO_SUBJECT.site is None


def test_events_of_one_step_share_one_axes_and_of_one_row_one_subject():
    desc = HistogramDescriptor()
    xs = [torch.tensor([1.0, -2.0]), torch.tensor([float("nan")])]
    batch = ObservationBatch.observed(
        "gradient",
        "pre_step",
        [0, 1],
        reduce_spines(xs).numpy(),
        hist_rows=np.array([0]),
        histograms=reduce_histograms(xs[:1], desc).numpy(),
        scale_grad="unscaled",
    )
    sites = [SiteRecord(0, "a", "m", "f32[2]"), SiteRecord(1, "b", "m", "f32[1]")]
    block = StepBlockRecord(4, examples_seen=64, epoch=1)
    events = events_from_step(block, [batch], sites, desc, scalars={"loss": 0.5})
    assert len({id(e.axes) for e in events}) == 1
    assert events[0].axes == Axes(4, 64, 1)
    by_site = {}
    for e in events[:-1]:
        by_site.setdefault(e.site, set()).add(id(e.subject))
    assert {k: len(v) for k, v in by_site.items()} == {"a": 1, "b": 1}
    a = next(e for e in events if e.site == "a")
    assert (a.stage, a.scale_provenance) == (GradientStage.PRE_STEP, ScaleGrad.UNSCALED)
    # site b has no finite value: its defined field is a scalar, the others unavailable
    b = [e for e in events if e.site == "b"]
    assert {type(e) for e in b} == {ScalarEvent, UnavailableEvent}
    assert events[-1].subject is NO_SUBJECT and events[-1].name == "loss"


def test_events_and_their_coordinates_pickle_as_values():
    s = Subject("w", "gradient", "pre_step", stage="pre_step", scale_provenance="scaled")
    e = ScalarEvent("w/l2", Axes(1, 2, 3), 1.5, subject=s, field="l2", estimated=True)
    assert pickle.loads(pickle.dumps(e)) == e
    err = pickle.loads(pickle.dumps(CheckFailed("m", [e], ["r"])))
    assert err.events == (e,)
