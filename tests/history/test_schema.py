import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope import Refusal
from stepscope.history import (
    ObservationRecord,
    Presence,
    RunRecord,
    ScaleGrad,
    SiteRecord,
    StepBlockRecord,
    StepTruth,
    Stream,
    Tristate,
    model_fingerprint,
)
from stepscope.history.fingerprint import model_structure
from stepscope.stats import RunningStats


def _roundtrip(record):
    text = json.dumps(record.to_dict())  # proves JSON safety, not just dict equality
    return type(record).from_dict(json.loads(text))


def test_run_record_round_trips_through_json_with_extra_fields():
    r = RunRecord.new(
        run_id="r1",
        cadences={"activation": 1, "gradient": 10},
        budgets={"bytes_per_step": 1e6},
        rank=1,
        world_size=4,
        extra={"measurements": {"overhead_ratio": 1.03}},
    )
    back = _roundtrip(r)
    assert back == r
    assert set(back.packages) == {"python", "torch", "numpy", "stepscope"}
    assert back.histogram_descriptor["bins_per_octave"] == 4


def test_resumed_record_names_its_parent_and_step():
    r = RunRecord.new(run_id="r1")
    child = r.resumed(at_step=120)
    assert (child.run_id, child.parent_segment, child.resumed_at_step) == ("r1", r.segment_id, 120)
    assert child.segment_id != r.segment_id


def test_run_record_with_other_schema_version_refuses():
    d = RunRecord.new().to_dict()
    d["schema_version"] = 99
    with pytest.raises(Refusal) as err:
        RunRecord.from_dict(d)
    assert err.value.code == "history_schema_unsupported"


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10**6),
    st.text(min_size=1, max_size=20),
    st.none() | st.integers(0, 10**6),
    st.none() | st.text(max_size=10),
)
def test_site_record_round_trips(site_id, name, ended, label):
    s = SiteRecord(site_id, name, "torch.nn.Linear", "f32[*,8]", label, 0, ended, None)
    assert _roundtrip(s) == s


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10**9),
    st.none() | st.integers(0, 10**9),
    st.sampled_from(["explicit", "implicit"]),
    st.sampled_from([True, False, None]),
    st.none() | st.floats(1e-3, 1e6),
    st.none() | st.integers(1, 64),
)
def test_step_block_round_trips_with_unknowns(step, seen, prov, applied, scale, micro):
    b = StepBlockRecord(
        step,
        examples_seen=seen,
        provenance=prov,
        truth=StepTruth(applied=applied, scale=scale, micro_batches=micro),
    )
    back = _roundtrip(b)
    assert back == b
    assert back.truth.applied is Tristate.of(applied)


def test_unknown_truth_is_unknown_not_false():
    t = StepTruth()
    assert (t.applied, t.unscaled, t.clipped) == (Tristate.UNKNOWN,) * 3
    assert t.scale is None and t.micro_batches is None


@pytest.mark.parametrize("presence", [p for p in Presence if p is not Presence.OBSERVED])
def test_non_observed_presence_with_payload_refuses(presence):
    s = RunningStats()
    s.update(torch.ones(3))
    with pytest.raises(Refusal) as err:
        ObservationRecord(0, 0, "activation", "forward", presence, spine=s)
    assert err.value.code == "presence_payload_forbidden"
    # the same cell without payload is fine
    ObservationRecord(0, 0, "activation", "forward", presence)


@pytest.mark.parametrize("stream", ["gradient", "activation_grad"])
def test_gradient_streams_require_scale_grad(stream):
    with pytest.raises(Refusal) as err:
        ObservationRecord(0, 0, stream, "backward", "not_scheduled")
    assert err.value.code == "scale_grad_required"
    rec = ObservationRecord(0, 0, stream, "backward", "not_scheduled", scale_grad="unknown")
    assert rec.scale_grad is ScaleGrad.UNKNOWN


def test_unknown_stream_and_presence_refuse_with_codes():
    with pytest.raises(Refusal) as err:
        ObservationRecord(0, 0, "weights", "forward", "observed")
    assert err.value.code == "stream_unknown"
    with pytest.raises(Refusal) as err:
        ObservationRecord(0, 0, "activation", "forward", "missing")
    assert err.value.code == "history_json_invalid"
    assert {s.value for s in Stream} == {
        "activation",
        "gradient",
        "parameter",
        "update",
        "activation_grad",
    }


def test_malformed_record_dicts_refuse_not_crash():
    for bad in ([], {"run_id": 3}, {"schema_version": 1, "run_id": "x"}, None):
        with pytest.raises(Refusal) as err:
            RunRecord.from_dict(bad)  # type: ignore[arg-type]
        assert err.value.code in {"history_json_invalid"}


def test_fingerprint_depends_on_structure_not_values():
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    b = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    with torch.no_grad():
        b[0].weight.add_(1.0)
    assert model_fingerprint(a) == model_fingerprint(b)
    c = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    d = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2)).double()
    assert len({model_fingerprint(m) for m in (a, c, d)}) == 3
    rows = model_structure(a)
    assert ["parameter", "0.weight", "3x4", "torch.float32"] in rows
