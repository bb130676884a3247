"""A torn append (a short write, then ENOSPC or EROFS) never makes committed rows unreadable.

Injected: the n-th append writes only its first ``k`` bytes, for every ``k`` of the line, then
the disk fails (and, in the second variant, the truncation back fails too, so the torn tail stays
on disk). Real: a 64 KiB tmpfs fills in the middle of a line. The oracle is the list of rows
whose append returned: exactly those rows, in order, must be read back, before and after the
disk heals and more rows are appended.
"""

import errno
import os

import numpy as np
import pytest

from stepscope import open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.files import append_log_row, encode_log_row, read_log


def _row(i):
    return {"seq": i, "payload": "x" * (37 * i % 50)}


class _TornDisk:
    """``os.pwrite`` writes ``keep`` bytes of the armed append, then the disk fails."""

    def __init__(self, monkeypatch, keep, truncate_fails):
        self.keep, self.truncate_fails, self.armed, self.torn = keep, truncate_fails, False, False
        real_pwrite, real_truncate = os.pwrite, os.ftruncate

        def pwrite(fd, data, pos):
            if self.armed:
                self.armed, self.torn = False, True
                if self.keep:
                    return real_pwrite(fd, bytes(data[: self.keep]), pos)
            if self.torn:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_pwrite(fd, data, pos)

        def ftruncate(fd, n):
            if self.torn and self.truncate_fails:
                raise OSError(errno.EROFS, "Read-only file system")
            return real_truncate(fd, n)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "ftruncate", ftruncate)

    def heal(self):
        self.torn = False


@pytest.mark.parametrize("truncate_fails", [False, True])
def test_a_torn_append_at_every_byte_offset_of_a_line_loses_no_committed_row(
    tmp_path, monkeypatch, truncate_fails
):
    line = len(encode_log_row(_row(2)))
    for keep in range(line):  # every byte offset of the torn line (0 = nothing written)
        path = tmp_path / f"{keep}.log"
        disk = _TornDisk(monkeypatch, keep, truncate_fails)
        committed = []
        for i in range(5):
            if i == 2:
                disk.armed = True
            if i == 3:
                disk.heal()
            try:
                append_log_row(path, _row(i), durable=False)
            except OSError:
                assert i == 2
                got = read_log(path)  # while the tail is torn
                assert got.rows == committed
                continue
            committed.append(_row(i))
        got = read_log(path)
        assert got.rows == committed and got.torn_tail_bytes == 0, keep
        assert path.read_bytes() == b"".join(encode_log_row(r) for r in committed)


def _batch(ids, step):
    spine = np.zeros((len(ids), 15))
    spine[:, :2] = 1
    return ObservationBatch.observed("activation", "forward", ids, spine)


@pytest.mark.parametrize("truncate_fails", [False, True])
def test_a_commit_torn_mid_index_line_then_retried_keeps_the_whole_run(
    tmp_path, monkeypatch, truncate_fails
):
    import warnings

    for keep in (0, 1, 63, 64, 65, 200, 300):
        path = tmp_path / f"run{keep}"
        w = HistoryWriter(path, commit_steps=1, commit_seconds=None, durable=False)
        ids = [w.register_site("s", "t", "x")]
        disk = _TornDisk(monkeypatch, keep, truncate_fails)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the disk-fault warning
            for step in range(6):
                disk.armed = step == 2
                if step == 3:
                    disk.heal()
                w.write_step(StepBlockRecord(step), [_batch(ids, step)])
            assert w.close().uncommitted_steps == 0
        monkeypatch.undo()
        h = open_run(path)
        assert h.steps.tolist() == list(range(6)), keep
        assert h.verify().ok


def test_a_real_tmpfs_filling_mid_line_loses_no_committed_row(tmpfs, monkeypatch):
    small_tmpfs = tmpfs.mount("64k")
    ballast = small_tmpfs / "ballast"
    ballast.write_bytes(b"\0" * 16384)  # freed later: the disk heals
    path = small_tmpfs / "evals.log"
    short = []
    real_pwrite = os.pwrite

    def pwrite(fd, data, pos):  # the kernel's own short writes, recorded (not injected)
        n = real_pwrite(fd, data, pos)
        if n < len(data):
            short.append((pos, n, len(data)))
        return n

    monkeypatch.setattr(os, "pwrite", pwrite)
    committed, failures = [], 0
    for i in range(200):
        row = {"n": i, "pad": "y" * 1500}
        try:
            append_log_row(path, row)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
            failures += 1
            assert read_log(path).rows == committed
            if failures == 3:
                break
            continue
        committed.append(row)
    assert failures == 3 and short, "the tmpfs never filled in the middle of a line"
    ballast.unlink()
    for i in range(200, 203):
        row = {"n": i, "pad": "z" * 1500}
        append_log_row(path, row)
        committed.append(row)
    assert read_log(path).rows == committed
