"""SIGKILL a writer at random moments; the artifact must open to exactly its committed prefix."""

import multiprocessing
import os
import signal
import struct
import time

import numpy as np
import pytest

from stepscope import open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence

N_SITES = 4
TRIALS = 30


def _spines(step):
    # a pure function of the step, so the parent knows every value the child wrote
    base = np.arange(N_SITES * 15, dtype=np.float64).reshape(N_SITES, 15)
    return base + step


def _child(path, commit_steps, fd):
    w = HistoryWriter(path, commit_steps=commit_steps, commit_seconds=None)
    ids = [w.register_site(f"s{i}", "t", "sig") for i in range(N_SITES)]
    os.write(fd, struct.pack("<q", -1))  # ready
    for step in range(100_000):
        b = ObservationBatch.observed("activation", "forward", ids, _spines(step))
        if w.write_step(StepBlockRecord(step), [b], scalars={"x": float(step)}):
            os.write(fd, struct.pack("<q", w.committed_step))  # after the commit is durable


def _reported(fd):
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return [v for (v,) in struct.iter_unpack("<q", data)]


def _start(ctx, target, *args):
    """Start ``target(*args, fd)`` in a forked child; returns it and the pipe's read end once
    the child reported its artifact ready (the kill's clock starts after that)."""
    r, w = os.pipe()
    proc = ctx.Process(target=target, args=(*args, w), daemon=True)
    proc.start()
    os.close(w)
    assert os.read(r, 8) == struct.pack("<q", -1)
    return proc, r


def _kill(proc, r, seen=()):
    """``kill -9`` the child; returns every value it reported (``seen`` first), pipe closed."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    os.set_blocking(r, False)
    values = [*seen, *_reported(r)]
    os.close(r)
    return values


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_at_random_moments_leaves_exactly_a_committed_prefix(tmp_path):
    ctx = multiprocessing.get_context("fork")
    rng = np.random.default_rng(20261129)
    outcomes = []
    for trial in range(TRIALS):
        path = tmp_path / f"run{trial}"
        commit_steps = int(rng.integers(1, 4))
        proc, r = _start(ctx, _child, path, commit_steps)  # artifact exists before the clock
        time.sleep(float(rng.uniform(0.0, 0.3)))
        committed = _kill(proc, r)

        h = open_run(path)
        assert h.verify().ok  # every index row's chunks verify
        steps = h.steps.tolist()
        last_reported = committed[-1] if committed else -1
        # nothing reported as committed is missing, and what shows is a prefix 0..n-1
        assert steps == list(range(len(steps)))
        assert len(steps) - 1 >= last_reported
        # each visible commit is whole: commit boundaries are multiples of commit_steps
        assert all(r["n_steps"] == commit_steps for r in h.commits)
        # the visible values are exactly what the child wrote at those steps
        for i in range(N_SITES if steps else 0):  # sites reach the catalog with a commit
            s = h.series(f"s{i}", "activation", "sum")
            np.testing.assert_array_equal(s.values, [_spines(t)[i, 10] for t in steps])
        if steps:
            assert h.scalars("x").values.tolist() == [float(t) for t in steps]
        outcomes.append((len(committed), len(steps), h.torn_tail_bytes))
        if trial % 6 == 0:  # a resumed writer continues right after the committed prefix
            w = HistoryWriter(path, resume=True, commit_steps=1)
            assert w.committed_step == (steps[-1] if steps else None)
            assert not list((path / "chunks").glob(".*.tmp*"))
            ids = [w.register_site(f"s{i}", "t", "sig") for i in range(N_SITES)]
            b = ObservationBatch.observed("activation", "forward", ids, _spines(len(steps)))
            w.write_step(StepBlockRecord(len(steps)), [b])
            w.close()
            again = open_run(path)
            assert again.steps.tolist() == list(range(len(steps) + 1))
            assert again.verify().ok and len(again.segments) == 2
    # the random kills landed at different points (not all before the first commit)
    assert len({n for _, n, _ in outcomes}) > 5, outcomes


RECOVERY_TRIALS = 10


def _faulty_child(path, commit_steps, fault_steps, fd):
    """Like ``_child``, but the disk fails (torn appends, failed renames) for ``fault_steps``."""
    import errno

    real_pwrite, real_replace = os.pwrite, os.replace
    on = [False]

    def pwrite(f, data, pos):
        if on[0]:
            real_pwrite(f, bytes(data[: max(1, len(data) // 2)]), pos)
            raise OSError(errno.ENOSPC, "injected")
        return real_pwrite(f, data, pos)

    def replace(a, b):
        if on[0]:
            raise OSError(errno.ENOSPC, "injected")
        return real_replace(a, b)

    os.pwrite, os.replace = pwrite, replace  # a forked child: patching os is local to it
    w = HistoryWriter(path, commit_steps=commit_steps, commit_seconds=None)
    ids = [w.register_site(f"s{i}", "t", "sig") for i in range(N_SITES)]
    os.write(fd, struct.pack("<q", -1))  # ready
    for step in range(100_000):
        on[0] = fault_steps[0] <= step < fault_steps[1]
        if step == fault_steps[1]:
            os.write(fd, struct.pack("<q", -2))  # healed: recovery starts now
        b = ObservationBatch.observed("activation", "forward", ids, _spines(step))
        if w.write_step(StepBlockRecord(step), [b], scalars={"x": float(step)}):
            os.write(fd, struct.pack("<q", w.committed_step))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_during_recovery_after_a_disk_fault_leaves_a_committed_prefix(tmp_path):
    ctx = multiprocessing.get_context("fork")
    rng = np.random.default_rng(20261130)
    lengths = set()
    for trial in range(RECOVERY_TRIALS):
        path = tmp_path / f"run{trial}"
        commit_steps = int(rng.integers(1, 4))
        start = int(rng.integers(0, 40))
        proc, r = _start(ctx, _faulty_child, path, commit_steps, (start, start + 30))
        seen: list[int] = []
        while -2 not in seen:  # wait for the disk to heal, then kill during the catch-up
            data = os.read(r, 8)
            assert data, "the writer died from the disk fault"
            seen += [v for (v,) in struct.iter_unpack("<q", data)]
        time.sleep(float(rng.uniform(0.0, 0.05)))
        committed = [v for v in _kill(proc, r, seen) if v >= 0]

        h = open_run(path)
        assert h.verify().ok
        steps = h.steps.tolist()
        assert steps == list(range(len(steps)))
        assert len(steps) - 1 >= (committed[-1] if committed else -1)
        assert len(steps) >= start - start % commit_steps  # committed before the fault: kept
        for i in range(N_SITES if steps else 0):
            s = h.series(f"s{i}", "activation", "sum")
            np.testing.assert_array_equal(s.values, [_spines(t)[i, 10] for t in steps])
        lengths.add(len(steps))
        w2 = HistoryWriter(path, resume=True, commit_steps=1)  # recovery of the recovery
        assert w2.committed_step == (steps[-1] if steps else None)
        w2.close()
        assert open_run(path).steps.tolist() == steps
    assert len(lengths) > 3, lengths


BACKGROUND_TRIALS = 12


def _background_child(path, commit_steps, fd):
    """Like ``_child`` with the background writer: reports ``committed_step`` as it advances
    (the writer thread commits; ``write_step`` only queues)."""
    w = HistoryWriter(path, commit_steps=commit_steps, commit_seconds=None, background=True)
    ids = [w.register_site(f"s{i}", "t", "sig") for i in range(N_SITES)]
    os.write(fd, struct.pack("<q", -1))  # ready
    reported = None
    for step in range(100_000):
        b = ObservationBatch.observed("activation", "forward", ids, _spines(step))
        w.write_step(StepBlockRecord(step), [b], scalars={"x": float(step)})
        committed = w.committed_step  # set by the thread once the commit is durable
        if committed is not None and committed != reported:
            os.write(fd, struct.pack("<q", committed))
            reported = committed
        time.sleep(0.0005)  # a training step's worth of time: the thread mostly keeps up


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_sigkill_of_a_background_writer_keeps_every_step_it_reported_committed(tmp_path):
    ctx = multiprocessing.get_context("fork")
    rng = np.random.default_rng(20261203)
    lengths = set()
    for trial in range(BACKGROUND_TRIALS):
        path = tmp_path / f"run{trial}"
        commit_steps = int(rng.integers(1, 6))
        proc, r = _start(ctx, _background_child, path, commit_steps)
        time.sleep(float(rng.uniform(0.0, 0.4)))
        committed = _kill(proc, r)

        h = open_run(path)
        assert h.verify().ok
        steps = h.steps.tolist()
        assert steps == list(range(len(steps)))  # a prefix
        assert committed == sorted(committed)
        assert len(steps) - 1 >= (committed[-1] if committed else -1)  # nothing reported is lost
        if steps:
            assert h.scalars("x").values.tolist() == [float(t) for t in steps]
        for i in range(N_SITES if steps else 0):
            s = h.series(f"s{i}", "activation", "sum")
            ok = s.valid  # observed: exactly the value written; else disclosed, never wrong
            np.testing.assert_array_equal(s.values[ok], [_spines(t)[i, 10] for t in h.steps[ok]])
            assert (s.presence_names()[~ok] == "budget_dropped").all()
        rows = h.table("observations")
        late = rows["presence"] == code_of(Presence.BUDGET_DROPPED)
        assert {h.disclosures[d] for d in rows["disclosure"][late]} <= {("writer_behind",)}
        lengths.add(len(steps))
        if trial % 4 == 0:  # a resumed writer continues right after the committed prefix
            w2 = HistoryWriter(path, resume=True, commit_steps=1, background=True)
            assert w2.committed_step == (steps[-1] if steps else None)
            w2.close()
            assert open_run(path).steps.tolist() == steps
    assert len(lengths) > 3, lengths
