"""``stepscope.codec``: one non-finite JSON float spelling and one enum parser for every layer.

The oracle for the float spelling is Python itself: ``repr`` writes it, ``float`` reads it, and
``json.dumps(..., allow_nan=False)`` proves the record is standard JSON. The records of three
layers (stats, runlog, events) are checked to use that one spelling.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from stepscope.codec import NONFINITE_SPELLINGS, float_from_json, json_float, parse_enum
from stepscope.curvature.base import CurvatureKind
from stepscope.errors import Refusal
from stepscope.events.payload import Verdict
from stepscope.history.ring import RingPolicy, StepRing
from stepscope.history.vocab import Phase, Stream, Tristate
from stepscope.runlog.evals import EvalRecord
from stepscope.stats import RunningStats

SPECIAL = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("value", [*SPECIAL, 0.0, -0.0, 1.5, -3e300, 5e-324, None])
def test_json_float_round_trips_through_standard_json(value):
    text = json.dumps(json_float(value), allow_nan=False)  # raises on a bare NaN/inf
    back = float_from_json(json.loads(text), "x")
    if value is None:
        assert back is None
    elif math.isnan(value):
        assert math.isnan(back)
    else:
        assert back == value and math.copysign(1, back) == math.copysign(1, value)


def test_the_spelling_is_pythons_repr():
    assert (
        {json_float(v) for v in SPECIAL} == {repr(v) for v in SPECIAL} == set(NONFINITE_SPELLINGS)
    )


@pytest.mark.parametrize("bad", [True, "NaN", "Infinity", "1.5", [1.0], {"v": 1}])
def test_float_from_json_refuses_anything_else_with_the_callers_code(bad):
    with pytest.raises(Refusal) as err:
        float_from_json(bad, "loss", "stat_payload_invalid")
    assert err.value.code == "stat_payload_invalid" and "'loss'" in err.value.message
    with pytest.raises(Refusal) as err:
        float_from_json(bad, "loss")
    assert err.value.code == "history_json_invalid"


def test_three_layers_write_non_finite_floats_the_same_way():
    stats = RunningStats()
    stats.update(
        torch.tensor([1e308, 1e308, -1.0], dtype=torch.float64)
    )  # the float64 sum of squares overflows
    spine = stats.to_dict()
    assert spine["sum_squares"] == "inf"
    assert RunningStats.from_dict(json.loads(json.dumps(spine, allow_nan=False))) == stats

    ev = EvalRecord("validation", {"loss": math.nan, "acc": 0.5}, optimizer_step=3).to_dict()
    assert ev["metrics"] == {"acc": 0.5, "loss": "nan"}
    back = EvalRecord.from_dict(json.loads(json.dumps(ev, allow_nan=False)))
    assert math.isnan(back.metrics["loss"]) and back.metrics["acc"] == 0.5

    verdict = Verdict("grad_norm", "warn", "too big", math.inf, None, -math.inf)
    d = verdict.to_dict()
    assert (d["observed"], d["lower"], d["upper"]) == ("inf", None, "-inf")
    assert Verdict.from_dict(json.loads(json.dumps(d, allow_nan=False))) == verdict


def test_a_stored_spine_field_of_another_spelling_refuses():
    d = RunningStats().to_dict()
    d["sum"] = "Infinity"
    with pytest.raises(Refusal) as err:
        RunningStats.from_dict(d)
    assert err.value.code == "stat_payload_invalid"


def test_parse_enum_returns_members_and_parses_values():
    assert parse_enum(RingPolicy, RingPolicy.COARSEN, "ring policy", "settings_invalid") is (
        RingPolicy.COARSEN
    )
    assert parse_enum(Phase, "pre_step", "phase", "history_json_invalid") is Phase.PRE_STEP


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (
            lambda: parse_enum(Phase, "later", "phase", "history_series_unknown"),
            "history_series_unknown",
        ),
        (lambda: parse_enum(Phase, None, "phase", "history_json_invalid"), "history_json_invalid"),
        (lambda: StepRing(4, "drop_newest"), "settings_invalid"),
        (lambda: Tristate.of("maybe"), "history_json_invalid"),
        (lambda: parse_enum(Stream, "weights", "stream", "stream_unknown"), "stream_unknown"),
    ],
)
def test_parse_enum_refuses_with_the_code_its_caller_names(call, code):
    with pytest.raises(Refusal) as err:
        call()
    assert err.value.code == code
    assert err.value.remedies and err.value.remedies[0].startswith("use one of: ")


def test_curvature_arguments_refuse_curvature_mode_invalid():
    from stepscope.curvature.products import make_operator

    model = torch.nn.Linear(3, 2)
    x, y = torch.randn(4, 3), torch.tensor([0, 1, 0, 1])
    with pytest.raises(Refusal) as err:
        make_operator(model, x, y, kind="fisher")
    assert err.value.code == "curvature_mode_invalid"
    assert {k.value for k in CurvatureKind} <= set(err.value.remedies[0].split(": ")[1].split(", "))
