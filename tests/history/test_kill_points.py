"""A real ``kill -9`` at the n-th fsync / replace / write / pwrite of a writer's life.

The child process creates a run, commits, closes, resumes it (a second segment), commits and
closes, counting every durable file operation and sending ``SIGKILL`` to itself just before the
n-th. After each kill the parent checks, independently of the writer's own bookkeeping (the child
reports each committed step over a pipe only after ``commit()`` returned):

* the directory opens (or, killed before ``index.json`` first existed, is recognised as a creation
  that committed nothing), and every reported step is read back with its value;
* the same command recovers it: a resume (or a fresh writer on a half-created run) appends a step
  and the result opens with every reported step.

Every kill point of the scenario is visited (a few dozen forks, a few seconds), with the
synchronous writer and with the background writer (whose commits, and so whose kills, happen on
its ``stepscope-writer`` thread).
"""

import multiprocessing
import os
import shutil
import signal
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from stepscope import open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.stats.layout import FIELD_INDEX

OPS = ("fsync", "replace", "write", "pwrite")


def _batch(w, ids, step):
    spine = np.zeros((len(ids), 15))
    spine[:, 0] = spine[:, 1] = 3
    spine[:, FIELD_INDEX["mean"]] = step  # the value the parent checks
    return ObservationBatch.observed("activation", "forward", ids, spine)


def _scenario(path, fd, background=False):
    """Create, commit, close, resume, commit, close. With the background writer the commits
    are the explicit ``commit()`` calls (their file operations on the writer thread, while the
    caller waits), so every run makes the same operations in the same order."""

    def report(step):
        os.write(fd, struct.pack("<q", step))

    def write(w, step, ids, every):
        committed = w.write_step(StepBlockRecord(step), [_batch(w, ids, step)])
        if background and (step + 1) % every == 0:
            committed = w.commit() is not None
        return committed

    kw = {"commit_seconds": None, "background": background}
    w = HistoryWriter(path, commit_steps=1000 if background else 2, **kw)
    ids = [w.register_site(f"s{i}", "t", "x") for i in range(2)]
    for step in range(4):
        if write(w, step, ids, 2):
            for s in range(step + 1):
                report(s)
    w.close()
    report(3)
    w = HistoryWriter(
        path, resume=True, resume_at_step=4, commit_steps=1000 if background else 1, **kw
    )
    for step in (4, 5):
        write(w, step, [0, 1], 1)
        report(step)
    w.close()


def _child(path, fd, kill_at, background=False):
    count = [0]
    for name in OPS:
        real = getattr(os, name)

        def wrapped(*a, _real=real):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return _real(*a)

        setattr(os, name, wrapped)
    real_write = os.write
    _scenario(path, fd, background)
    real_write(fd, struct.pack("<q", -count[0] - 1))  # finished: how many operations it made


def _run(ctx, path, kill_at, background=False):
    r, w = os.pipe()
    p = ctx.Process(target=_child, args=(path, w, kill_at, background), daemon=True)
    p.start()
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    p.join(30)
    return [v for (v,) in struct.iter_unpack("<q", data)], p.exitcode


def _values(h):
    if "s0" not in {site.name for site in h.sites}:  # killed before its first commit
        return {}
    s = h.series("s0", "activation", "mean")
    return dict(zip(s.steps.tolist(), s.values.tolist()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("background", [False, True], ids=["synchronous", "background"])
def test_a_kill_at_every_file_operation_loses_no_committed_step_and_recovers(tmp_path, background):
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):  # fsync is free on tmpfs
        tmp_path = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="stepscope-kill-"))
    ctx = multiprocessing.get_context("fork")
    got, code = _run(ctx, tmp_path / "full", 0, background)
    assert code == 0 and got[-1] < 0
    total = -got[-1] - 1
    assert total > 20  # the scenario makes every kind of operation several times
    failures = []
    for n in range(1, total + 1):
        path = tmp_path / f"k{n}"
        reported, code = _run(ctx, path, n, background)
        assert code == -signal.SIGKILL, (n, code)
        committed = sorted(set(v for v in reported if v >= 0))
        try:
            if (path / "index.json").exists():  # written before any commit can happen
                values = _values(open_run(path))
                resume = True
            else:  # killed before index.json ever existed: nothing can have been committed
                values, resume = {}, False
            lost = [s for s in committed if values.get(s) != float(s)]
            w = HistoryWriter(path, resume=resume, resume_at_step=6, durable=False)
            ids = w.register_site("after", "t", "x"), w.register_site("s0", "t", "x")
            w.write_step(StepBlockRecord(6), [_batch(w, list(ids), 6)])
            assert w.close().uncommitted_steps == 0
            h = open_run(path)
            after = _values(h)
            lost += [s for s in [*committed, 6] if after.get(s) != float(s)]
            assert h.verify().ok, h.verify().failures
        except Exception as exc:
            failures.append((n, f"{type(exc).__name__}: {exc}"[:300]))
            continue
        if lost:
            failures.append((n, f"lost committed steps {lost}"))
    shutil.rmtree(tmp_path, ignore_errors=True)
    assert not failures, failures
