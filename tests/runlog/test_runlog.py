"""RunLog without a collector: exact values at the right steps and axes, evals, clocks, RAM."""

import numpy as np
import pytest

from stepscope import Refusal, open_run
from stepscope.runlog import EvalRecord, RunLog, read_summary
from tests.runlog.runlog_testkit import BATCH, STEPS, STEPS_PER_EPOCH, survival


def _run(sdnet_train, path=None, **kw):
    rl = RunLog(path, durable=False) if path is not None else RunLog()
    truth = sdnet_train(lambda m, o: (rl, lambda n, e: rl.step(examples=n, epoch=e)), **kw)
    view = rl.view() if path is None else None
    rl.close()
    return truth, (view or open_run(path).view())


def test_reader_returns_exactly_the_logged_values_at_their_steps(tmp_path, sdnet_train):
    truth, v = _run(sdnet_train, tmp_path / "run")
    h = open_run(tmp_path / "run")
    loss = h.scalars("loss")  # the reader's own access path
    assert loss.steps.tolist() == list(range(STEPS))
    assert loss.values.tolist() == [truth.loss[s] for s in range(STEPS)]
    lr = v.scalar("lr")
    assert lr.values.tolist() == [0.2 * 0.5 ** (s // 3) for s in range(STEPS)]
    assert lr.values.tolist() == [truth.lr[s] for s in range(STEPS)]
    p = v.scalar("branch/blocks.1/survival_probability")
    assert p.values.tolist() == [survival(s) for s in range(STEPS)]
    assert lr.examples_seen.tolist() == [BATCH * (s + 1) for s in range(STEPS)]
    assert lr.epoch.tolist() == [s // STEPS_PER_EPOCH for s in range(STEPS)]
    assert not np.ma.is_masked(lr.examples_seen) and not np.ma.is_masked(lr.epoch)


def test_branch_activity_is_the_realised_fraction_with_nominal_macs(tmp_path, sdnet_train):
    truth, v = _run(sdnet_train, tmp_path / "run")
    b1 = v.branch("blocks.1")
    assert b1.active_units.tolist() == [truth.row_active[s] for s in range(STEPS)]
    assert b1.total_units.tolist() == [BATCH] * STEPS
    assert b1.active_fraction.tolist() == [truth.row_active[s] / BATCH for s in range(STEPS)]
    assert b1.nominal_skipped_macs.tolist() == [
        (BATCH - truth.row_active[s]) * 64.0 for s in range(STEPS)
    ]
    b2 = v.branch("blocks.2")
    assert b2.active_fraction.tolist() == [float(truth.block2_runs[s]) for s in range(STEPS)]
    assert v.branches() == ["blocks.1", "blocks.2"]


def test_evaluations_keep_split_axes_endpoint_count_and_hash(tmp_path, sdnet_train):
    truth, v = _run(sdnet_train, tmp_path / "run")
    val = v.evals("validation")
    assert [r.optimizer_step for r in val] == [0, 4, 8, 12]
    assert [r.examples_seen for r in val] == [0, 64, 128, 192]
    assert [r.metrics["ce"] for r in val] == [truth.val_ce[s] for s in (0, 4, 8, 12)]
    assert {(r.sample_count, r.data_hash, r.endpoint, r.epoch) for r in val} == {
        (64, "val:seed0", False, None)
    }
    assert v.evals("validation", endpoints_only=True) == []
    (test,) = v.evals("test", endpoints_only=True)
    assert (test.optimizer_step, test.metrics, test.sample_count) == (12, {"ce": 0.5}, 100)
    assert v.eval_splits() == ["test", "validation"]
    # the same values as scalar rows, for trackers and reports
    ce = v.scalar("eval/validation/ce")
    assert ce.steps.tolist() == [0, 4, 8, 12]
    assert ce.values.tolist() == [truth.val_ce[s] for s in (0, 4, 8, 12)]


def test_clocks_add_up_at_every_step(tmp_path, sdnet_train):
    _, v = _run(sdnet_train, tmp_path / "run")
    c = v.clocks()
    assert c.steps.tolist() == list(range(STEPS))
    assert (np.diff(c.training_seconds) >= 0).all() and (np.diff(c.elapsed_seconds) > 0).all()
    assert (c.training_seconds + c.telemetry_seconds <= c.elapsed_seconds).all()
    assert c.training_clock == "host_perf_counter"
    summary = read_summary(tmp_path / "run")
    assert summary["closed"] and summary["training_seconds"] == c.training_seconds[-1]
    assert summary["overhead_fraction"] == pytest.approx(c.overhead_fraction, rel=1e-12)


def test_ram_run_reads_the_same_as_the_artifact(tmp_path, sdnet_train):
    truth_a, disk = _run(sdnet_train, tmp_path / "run")
    truth_b, ram = _run(sdnet_train)
    assert truth_a.loss == truth_b.loss
    for name in ("loss", "lr", "branch/blocks.2/active_fraction", "eval/validation/ce"):
        a, b = disk.scalar(name), ram.scalar(name)
        assert a.steps.tolist() == b.steps.tolist() and a.values.tolist() == b.values.tolist()
    assert [r.to_dict() | {"wall_time": 0} for r in disk.evals()] == [
        r.to_dict() | {"wall_time": 0} for r in ram.evals()
    ]


def test_without_a_collector_telemetry_is_only_our_own_time():
    # a timer that only moves when the "training" moves it: our own calls take no time
    now = [0.0]
    rl = RunLog(timer=lambda: now[0])
    for step in range(5):
        with rl.step(examples=4):
            now[0] += 0.5 + step  # the training work
            rl.log("loss", 1.0)
        now[0] += 10.0  # between steps (data loading, evaluation): in neither clock
    v = rl.view()
    rl.close()
    c = v.clocks()
    assert c.telemetry_seconds.tolist() == [0.0] * 5
    assert c.per_step()[0].tolist() == [0.5, 1.5, 2.5, 3.5, 4.5]
    assert c.elapsed_seconds.tolist() == [0.5, 12.0, 24.5, 38.0, 52.5]


def test_end_step_spelling_and_unknown_examples_stay_unknown():
    rl = RunLog()
    rl.log("loss", 3.0)
    rl.end_step(examples=8, epoch=0)
    rl.log("loss", 2.0)
    rl.end_step()  # examples not declared: examples_seen unknown from here on, never 0
    rl.log("loss", 1.0)
    rl.end_step(examples=8)
    loss = rl.view().scalar("loss")
    assert loss.examples_seen.tolist() == [8, None, None]
    assert loss.epoch.tolist() == [0, None, None]
    rec = rl.log_eval("validation", {"ce": 1.0})
    assert (rec.optimizer_step, rec.examples_seen, rec.sample_count) == (3, None, None)


def test_rows_logged_after_the_last_step_are_kept_at_the_next_step(tmp_path):
    rl = RunLog(tmp_path / "r", durable=False)
    with rl.step(examples=1):
        rl.log("loss", 1.0)
    rl.log("final_accuracy_fraction", 0.75)
    rl.close()
    s = open_run(tmp_path / "r").scalars("final_accuracy_fraction")
    assert (s.steps.tolist(), s.values.tolist()) == ([1], [0.75])


def test_an_exception_in_a_step_closes_the_log_and_keeps_committed_rows(tmp_path):
    rl = RunLog(tmp_path / "r", durable=False)
    with rl.step():
        rl.log("loss", 1.0)
    with pytest.raises(ZeroDivisionError), rl.step():
        rl.log("loss", 2.0)
        _ = 1 / 0
    with pytest.raises(Refusal) as err:
        rl.log("loss", 3.0)
    assert err.value.code == "runlog_closed"
    assert open_run(tmp_path / "r").scalars("loss").values.tolist() == [1.0]


def test_eval_records_validate_their_fields():
    with pytest.raises(Refusal) as err:
        EvalRecord("bad split/", {"ce": 1.0}, optimizer_step=0)
    assert err.value.code == "runlog_name_invalid"
    with pytest.raises(Refusal) as err:
        EvalRecord("validation", {}, optimizer_step=0)
    assert err.value.code == "runlog_value_invalid"
    with pytest.raises(Refusal) as err:
        EvalRecord("validation", {"ce": 1.0}, optimizer_step=0, sample_count=-3)
    assert err.value.code == "runlog_value_invalid"
    r = EvalRecord("validation", {"ce": float("nan")}, optimizer_step=2, endpoint=True)
    back = EvalRecord.from_dict(r.to_dict())
    assert np.isnan(back.metrics["ce"]) and back.endpoint and back.optimizer_step == 2


def test_a_hand_logged_fraction_has_masked_counts_not_garbage():
    rl = RunLog()
    with rl.step():
        rl.log("branch/mine/active_fraction", 0.5)
    with rl.step():
        rl.log_mask("mine", [True, False, False, False])
    b = rl.view().branch("mine")
    assert b.active_fraction.tolist() == [0.5, 0.25]
    assert b.active_units.tolist() == [None, 1] and b.total_units.tolist() == [None, 4]
    assert b.nominal_skipped_macs.tolist() == [None, None]


def test_the_history_reader_exposes_evals_and_clocks(tmp_path, sdnet_train):
    truth, v = _run(sdnet_train, tmp_path / "run")
    h = open_run(tmp_path / "run")
    assert [r.metrics["ce"] for r in h.evals("validation")] == [
        truth.val_ce[s] for s in (0, 4, 8, 12)
    ]
    assert [r.split for r in h.evals(endpoints_only=True)] == ["test"]
    assert h.clocks().training_seconds.tolist() == v.clocks().training_seconds.tolist()
    assert h.clocks().overhead_fraction == v.clocks().overhead_fraction
