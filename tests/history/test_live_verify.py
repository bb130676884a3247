"""A live run never reports false damage; ``stepscope verify`` verifies what ``open_run`` does."""

import multiprocessing
import os
import time

import numpy as np
import pytest

from stepscope import open_run
from stepscope.cli import main
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.files import append_log_row
from stepscope.history.pending import write_chunk


def _batch(ids):
    spine = np.zeros((len(ids), 15))
    spine[:, :2] = 1
    return ObservationBatch.observed("activation", "forward", ids, spine)


def test_verify_of_a_reader_opened_before_two_more_commits_is_not_damage(tmp_path):
    """The writer commits after the reader opened and is writing the next commit's chunks (its
    index line not yet appended): verify must not call that a shortened log."""
    path = tmp_path / "run"
    w = HistoryWriter(path, commit_steps=1, commit_seconds=None)
    ids = [w.register_site("fc", "t", "x")]
    w.write_step(StepBlockRecord(0), [_batch(ids)])
    reader = open_run(path)  # sees commit 0
    w.write_step(StepBlockRecord(1), [_batch(ids)])  # commit 1 appended after the open
    w.write_step(StepBlockRecord(2), [_batch(ids)], scalars=None)  # commit 2 ...
    # ... and the chunks of commit 3 written, its line not yet appended (a commit in progress)
    w.write_scalar("x", 3, 1.0)
    write_chunk(
        path / "chunks",
        f"{w.run.segment_id}-0000003",
        "steps",
        None,
        np.zeros(0, dtype=open_run(path)._dtypes["steps"]),
        False,
    )
    report = reader.verify()
    assert report.ok, report.failures
    w.close()


def _live_writer(path, ready):
    w = HistoryWriter(path, commit_steps=1, commit_seconds=None, durable=False)
    ids = [w.register_site("fc", "t", "x")]
    from stepscope.runlog.evals import EvalRecord
    from stepscope.runlog.sink import DiskSink

    rows = DiskSink(w)
    ready.set()
    for step in range(300):  # bounded: each verify reads the whole run
        w.write_step(StepBlockRecord(step), [_batch(ids)])
        if step % 3 == 0:
            rows.write_eval(EvalRecord("validation", {"ce": 1.0}, optimizer_step=step))
        if step % 40 == 39:  # a resume every 40 steps: new segments, seals, manifests
            w.close()
            w = HistoryWriter(
                path, resume=True, commit_steps=1, commit_seconds=None, durable=False
            )
            rows = DiskSink(w)
    w.close()
    while True:  # stay alive (the parent kills it)
        time.sleep(1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_verify_and_evals_while_a_writer_appends_and_resumes_never_report_damage(tmp_path):
    path = tmp_path / "run"
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Event()
    p = ctx.Process(target=_live_writer, args=(path, ready), daemon=True)
    p.start()
    try:
        assert ready.wait(30)
        time.sleep(0.1)
        damage = []
        for _ in range(12):  # each read races the writer's commits, evals and resumes
            run = open_run(path)
            damage += run.verify().failures
            run.evals()
    finally:
        p.kill()
        p.join(10)
    assert not damage, damage[:3]
    assert open_run(path).verify().ok  # killed mid-write: still no damage


def test_cli_verify_fails_where_open_run_verify_fails(tmp_path, capsys):
    path = tmp_path / "run"
    w = HistoryWriter(path)
    w.write_step(StepBlockRecord(0), [])
    append_log_row(path / "evals.log", {"n": 0, "segment": w.run.segment_id, "metrics": "x"})
    w.close()
    assert not open_run(path).verify().ok  # the row cannot be decoded as an evaluation
    assert main(["verify", str(path)]) == 1
    assert "evals.log" in capsys.readouterr().out
