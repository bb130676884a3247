"""Wrong-type or out-of-range arguments to public calls: a TypeError or a coded Refusal, never a
raw AttributeError/IndexError and never a silent coercion."""

import math

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope import open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.stats import SPINE_WIDTH


@pytest.mark.parametrize(
    "kw",
    [
        dict(ram_capacity=None),
        dict(commit_steps="3"),
        dict(commit_steps=2.0),
        dict(output_dir=123),
        dict(histogram_descriptor="x"),
        dict(resume="yes"),
        dict(durable=None),
        dict(update_seed=1.5),
        dict(commit_seconds="10"),
        dict(extra=[1]),
        dict(ram_policy=None),
    ],
)
def test_watch_settings_of_the_wrong_type_raise_type_error(kw):
    with pytest.raises(TypeError):
        ss.WatchSettings(**kw)


@pytest.mark.parametrize(
    "kw",
    [
        dict(commit_seconds=math.nan),
        dict(commit_seconds=math.inf),
        dict(commit_seconds=0),
        dict(commit_steps=0),
        dict(update_seed=-1),
        dict(run_id=" "),
        dict(ram_capacity=0),
    ],
)
def test_watch_settings_out_of_range_refuse_settings_invalid(kw):
    with pytest.raises(ss.Refusal) as err:
        ss.WatchSettings(**kw)
    assert err.value.code == "settings_invalid"


def test_a_collector_of_no_model_raises_type_error():
    with pytest.raises(TypeError):
        ss.HistoryCollector(None)


@pytest.mark.parametrize("examples", ["x", -1, 1.5, True, 10**30])
def test_step_examples_are_never_coerced(examples):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = ss.HistoryCollector(model)
    with pytest.raises(ss.Refusal) as err:
        with c.step(opt, examples=examples):
            pass
    assert err.value.code == "runlog_value_invalid"
    with c.step(opt, examples=3):  # the collector is still usable: nothing half-recorded
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    assert c.last_block.examples_seen == 3


def test_logging_a_value_beyond_float64_refuses():
    log = ss.RunLog()
    with pytest.raises(ss.Refusal) as err:
        log.log("loss", 10**400)
    assert err.value.code == "runlog_value_invalid"


@pytest.mark.parametrize("steps", [(1,), (1, 2, 3), ("a", 2), (5, 1), 3, (1.5, 2)])
def test_reader_step_ranges_must_be_pairs_of_ints(tmp_path, steps):
    with HistoryWriter(tmp_path / "run", commit_steps=1) as w:
        ids = [w.register_site("s", "t", "sig")]
        b = ObservationBatch.observed("activation", "forward", ids, np.ones((1, SPINE_WIDTH)))
        w.write_step(StepBlockRecord(0), [b], scalars={"loss": 1.0})
    h = open_run(tmp_path / "run")
    for call in (
        lambda: h.series("s", "activation", "sum", steps=steps),
        lambda: h.scalars("loss", steps=steps),
        lambda: h.table("steps", steps=steps),
    ):
        with pytest.raises(ss.Refusal) as err:
            call()
        assert err.value.code == "history_query_invalid"


def test_a_phase_typo_refuses_with_a_query_code_not_a_json_code(tmp_path):
    with HistoryWriter(tmp_path / "run", commit_steps=1) as w:
        ids = [w.register_site("s", "t", "sig")]
        b = ObservationBatch.observed("activation", "forward", ids, np.ones((1, SPINE_WIDTH)))
        w.write_step(StepBlockRecord(0), [b])
    with pytest.raises(ss.Refusal) as err:
        open_run(tmp_path / "run").series("s", "activation", "sum", phase="forwrd")
    assert err.value.code == "history_series_unknown"
    with pytest.raises(ss.Refusal) as err:
        ObservationBatch.observed("activation", "forwrd", [0], np.ones((1, SPINE_WIDTH)))
    assert err.value.code == "stat_payload_invalid"


@pytest.mark.parametrize("kw", [dict(commit_steps="2"), dict(commit_seconds=math.nan)])
def test_artifact_writer_arguments_are_checked(tmp_path, kw):
    with pytest.raises((TypeError, ss.Refusal)):
        HistoryWriter(tmp_path / "run", **kw)
