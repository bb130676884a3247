"""Observer events: one frozen class per kind, validation by refusal, immutability, JSON round trip."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from stepscope.errors import Refusal
from stepscope.events import (
    NO_SUBJECT,
    Axes,
    EventKind,
    EventSource,
    HistogramEvent,
    HistogramPayload,
    ObserverEvent,
    ScalarEvent,
    Subject,
    UnavailableEvent,
    Verdict,
    VerdictEvent,
)
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines

A0 = Axes(0)


def _refuses(fn, *args, **kw):
    with pytest.raises(Refusal) as err:
        fn(*args, **kw)
    assert err.value.code == "event_invalid"
    assert err.value.remedies
    return err.value


def _payload() -> HistogramPayload:
    d = HistogramDescriptor()
    x = torch.tensor([0.0, 1e-30, -3.0, 2.5, float("inf"), float("nan")])
    return HistogramPayload(reduce_histograms([x], d)[0].numpy(), reduce_spines([x])[0].numpy(), d)


def _line(kind: str, **kw) -> dict:
    return {"kind": kind, "name": "x", "optimizer_step": 0, **kw}


def test_kind_is_exactly_one_of_four_classes():
    assert {k.value for k in EventKind} == {"scalar", "histogram_counts", "verdict", "unavailable"}
    classes = (ScalarEvent, HistogramEvent, VerdictEvent, UnavailableEvent)
    assert {c.kind for c in classes} == set(EventKind)
    assert all(issubclass(c, ObserverEvent) for c in classes)
    _refuses(ObserverEvent.from_dict, _line("gauge", value=1.0))
    _refuses(ObserverEvent, "scalar", "x", 0, value=1.0)  # the base is not an event itself


def test_unavailable_requires_a_non_empty_reason():
    _refuses(UnavailableEvent, "x", A0, None)
    _refuses(UnavailableEvent, "x", A0, "  ")
    e = UnavailableEvent("x", A0, "not_scheduled")
    assert e.kind is EventKind.UNAVAILABLE and e.reason == "not_scheduled"


def test_missing_is_never_a_value():
    _refuses(ObserverEvent.from_dict, _line("unavailable", reason="r", value=0.0))
    _refuses(ScalarEvent, "x", A0, None)  # a scalar without a value
    _refuses(ObserverEvent.from_dict, _line("scalar", value=None))
    _refuses(ObserverEvent.from_dict, _line("scalar", value=1.0, reason="why"))
    assert not hasattr(UnavailableEvent("x", A0, "r"), "value")


def test_payloads_belong_to_their_kind():
    _refuses(VerdictEvent, "x", A0, None)
    _refuses(HistogramEvent, "x", A0, None)
    v = Verdict("c", "warn", "m")
    _refuses(ObserverEvent.from_dict, _line("scalar", value=1.0, verdict=v.to_dict()))
    _refuses(ObserverEvent.from_dict, _line("verdict", verdict=v.to_dict(), estimated=True))


def test_scalar_values_are_real_numbers_stored_as_floats():
    _refuses(ScalarEvent, "x", A0, True)
    _refuses(ScalarEvent, "x", A0, "1.0")
    assert type(ScalarEvent("x", A0, np.float32(0.5)).value) is float
    _refuses(ScalarEvent, "", A0, 1.0)
    _refuses(ScalarEvent, "x", 3, 1.0)  # axes must be an Axes
    _refuses(ScalarEvent, "x", A0, 1.0, subject="fc1")
    _refuses(ScalarEvent, "x", A0, 1.0, source="sensor")
    _refuses(ScalarEvent, "x", A0, 1.0, estimated="yes")
    assert ScalarEvent("x", A0, 1.0, source="spine").source is EventSource.SPINE


def test_axes_are_non_negative_ints_or_unknown():
    _refuses(Axes, -1)
    _refuses(Axes, 1.5)
    _refuses(Axes, 1, examples_seen=True)
    _refuses(Axes, 1, epoch=-2)
    a = Axes(np.int64(3), epoch=None)
    assert (a.optimizer_step, a.epoch) == (3, None) and type(a.optimizer_step) is int
    e = ScalarEvent("x", a, 1)
    assert (e.optimizer_step, e.examples_seen, e.epoch, e.value) == (3, None, None, 1.0)


def test_gradient_subjects_need_stage_and_scale_provenance():
    base = dict(site="w", stream="gradient", phase="backward")
    _refuses(Subject, **base)
    _refuses(Subject, **base, stage="backward")
    s = Subject(**base, stage="backward", scale_provenance="unknown")
    assert s.scale_provenance.value == "unknown"
    e = ScalarEvent("g", A0, 1.0, subject=s)
    assert (e.site, e.stream.value, e.stage.value) == ("w", "gradient", "backward")
    Subject(**{**base, "stream": "activation"})  # not a gradient stream: fine
    _refuses(Subject, stream="gradients")
    _refuses(Subject, micro_batch=-1)


def test_events_are_frozen_and_have_no_instance_dict():
    e = ScalarEvent("x", A0, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.value = 2.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        A0.optimizer_step = 1  # type: ignore[misc]
    assert not hasattr(e, "__dict__")


def test_the_hot_path_constructor_equals_init_and_refuses_the_same():
    s = Subject("w", "update", "post_step")
    good = ("w/l2", Axes(2, 64, 1), 0.25, s, "l2", EventSource.SPINE, True)
    name, axes, value, subject, field, source, estimated = good
    full = ScalarEvent(
        name, axes, value, subject=subject, field=field, source=source, estimated=estimated
    )
    assert ScalarEvent.measured(*good) == full
    # inexact types take __init__'s path: coerced alike
    assert ScalarEvent.measured(name, axes, np.float64(0.25), *good[3:]) == full
    assert ScalarEvent.measured(*good[:5], "spine", np.bool_(True)) == full
    for i, bad in [(0, ""), (0, None), (1, 2), (2, "x"), (2, True), (3, None), (5, "?")]:
        args = list(good)
        args[i] = bad
        _refuses(ScalarEvent.measured, *args)


def test_dict_round_trip_keeps_every_field_of_every_kind():
    payload = _payload()
    grad = Subject("fc", "gradient", "pre_step", stage="pre_step", scale_provenance="scaled")
    events = [
        HistogramEvent("h", Axes(3, 192, 3), payload, subject=grad, estimated=True),
        VerdictEvent("check/x", Axes(4), Verdict("x", "raise", "bad", float("inf"), 0.0, None)),
        UnavailableEvent("u", Axes(5), "capture_failed", subject=Subject(micro_batch=2)),
        ScalarEvent("loss", Axes(6), float("nan")),
        ScalarEvent("lr", Axes(7, 0, 0), -float("inf"), subject=NO_SUBJECT, field="lr"),
    ]
    dicts = [e.to_dict() for e in events]
    assert all(list(d) == list(dicts[0]) for d in dicts)  # one key order for every kind
    back = [ObserverEvent.from_dict(d) for d in dicts]
    assert back[:3] == events[:3] and back[4] == events[4]
    assert [type(b) for b in back] == [type(e) for e in events]
    assert back[0].histogram.histogram() == payload.histogram()
    assert np.isnan(back[3].value)
    assert [b.to_dict() for b in back] == dicts  # NaN included: "nan" both ways


def test_from_dict_refuses_malformed_input():
    with pytest.raises(Refusal) as err:
        ObserverEvent.from_dict({"kind": "scalar"})
    assert err.value.code == "event_invalid"
