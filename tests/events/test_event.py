"""ObserverEvent: the closed kind vocabulary, validation by refusal, immutability, JSON round trip."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from stepscope.errors import Refusal
from stepscope.events import EventKind, HistogramPayload, ObserverEvent, Verdict
from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines


def _refuses(**kw):
    with pytest.raises(Refusal) as err:
        ObserverEvent(**kw)
    assert err.value.code == "event_invalid"
    assert err.value.remedies
    return err.value


def test_kind_is_exactly_one_of_four():
    assert {k.value for k in EventKind} == {"scalar", "histogram_counts", "verdict", "unavailable"}
    _refuses(kind="gauge", name="x", optimizer_step=0, value=1.0)


def test_unavailable_requires_a_non_empty_reason():
    _refuses(kind="unavailable", name="x", optimizer_step=0)
    _refuses(kind="unavailable", name="x", optimizer_step=0, reason="  ")
    e = ObserverEvent("unavailable", "x", 0, reason="not_scheduled")
    assert e.kind is EventKind.UNAVAILABLE


def test_missing_is_never_a_value():
    _refuses(kind="unavailable", name="x", optimizer_step=0, reason="r", value=0.0)
    _refuses(kind="scalar", name="x", optimizer_step=0)  # a scalar without a value
    _refuses(kind="scalar", name="x", optimizer_step=0, value=1.0, reason="why")


def test_payloads_belong_to_their_kind():
    _refuses(kind="verdict", name="x", optimizer_step=0)
    _refuses(kind="histogram_counts", name="x", optimizer_step=0)
    v = Verdict("c", "warn", "m")
    _refuses(kind="scalar", name="x", optimizer_step=0, value=1.0, verdict=v)


def test_axes_are_non_negative_ints_or_unknown():
    _refuses(kind="scalar", name="x", optimizer_step=-1, value=1.0)
    _refuses(kind="scalar", name="x", optimizer_step=1.5, value=1.0)
    _refuses(kind="scalar", name="x", optimizer_step=1, examples_seen=True, value=1.0)
    e = ObserverEvent("scalar", "x", np.int64(3), epoch=None, value=1)
    assert (e.optimizer_step, e.epoch, e.value) == (3, None, 1.0)


def test_gradient_measurements_need_stage_and_scale_provenance():
    base = dict(
        kind="scalar", name="g", optimizer_step=0, value=1.0, stream="gradient", phase="backward"
    )
    _refuses(**base)
    _refuses(**base, stage="backward")
    e = ObserverEvent(**base, stage="backward", scale_provenance="unknown")
    assert e.scale_provenance.value == "unknown"
    ObserverEvent(**{**base, "stream": "activation"})  # not a gradient stream: fine


def test_events_are_frozen():
    e = ObserverEvent("scalar", "x", 0, value=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.value = 2.0  # type: ignore[misc]


def test_dict_round_trip_keeps_every_field_including_histograms():
    d = HistogramDescriptor()
    x = torch.tensor([0.0, 1e-30, -3.0, 2.5, float("inf"), float("nan")])
    payload = HistogramPayload(
        reduce_histograms([x], d)[0].numpy(), reduce_spines([x])[0].numpy(), d
    )
    events = [
        ObserverEvent(
            "histogram_counts",
            "h",
            3,
            192,
            3,
            histogram=payload,
            site="fc",
            stream="gradient",
            phase="pre_step",
            stage="pre_step",
            scale_provenance="scaled",
            source="histogram",
        ),
        ObserverEvent(
            "verdict",
            "check/x",
            4,
            verdict=Verdict("x", "raise", "bad", float("inf"), 0.0, None),
            source="check",
        ),
        ObserverEvent("unavailable", "u", 5, reason="capture_failed", micro_batch=2),
        ObserverEvent("scalar", "loss", 6, value=float("nan")),
    ]
    back = [ObserverEvent.from_dict(e.to_dict()) for e in events]
    assert back[:3] == events[:3]
    assert back[0].histogram.histogram() == payload.histogram()
    assert np.isnan(back[3].value)


def test_from_dict_refuses_malformed_input():
    with pytest.raises(Refusal) as err:
        ObserverEvent.from_dict({"kind": "scalar"})
    assert err.value.code == "event_invalid"
