"""The collector's group commit: by time, and what a ``kill -9`` loses (exactly the uncommitted)."""

import itertools
import multiprocessing
import os
import signal
import struct
import time

import pytest
import torch

from stepscope import open_run
from stepscope.collect import HistoryCollector, WatchSettings

COMMIT_SECONDS = 1.0
RECORD = struct.Struct("<qqd")  # step written, committed step (-1: none), monotonic seconds


def _train_forever(path: str, fd: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    settings = WatchSettings(output_dir=path, commit_seconds=COMMIT_SECONDS)  # commit_steps: 1024
    c = HistoryCollector(model, settings=settings)
    x = torch.randn(4, 8)
    for step in range(1_000_000):
        with c.step(opt, examples=4):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        committed = c.writer.committed_step
        os.write(fd, RECORD.pack(step, -1 if committed is None else committed, time.monotonic()))
        time.sleep(0.002)  # a few hundred steps a second: many steps per commit


def _records(fd: int) -> list[tuple[int, int, float]]:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    data = data[: len(data) - len(data) % RECORD.size]
    return list(RECORD.iter_unpack(data))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_kill_loses_exactly_the_steps_since_the_last_time_based_commit(tmp_path):
    path = str(tmp_path / "run")
    r, w = os.pipe()
    proc = multiprocessing.get_context("fork").Process(target=_train_forever, args=(path, w))
    proc.start()
    os.close(w)
    os.set_blocking(r, False)
    seen: list[tuple[int, int, float]] = []
    deadline = time.monotonic() + 60
    # run until the child reported two commits and then some steps of a third interval
    while time.monotonic() < deadline:
        seen += _records(r)
        commits = sorted({c for _, c, _ in seen if c >= 0})
        if len(commits) >= 2 and seen[-1][0] - commits[-1] >= 5:
            break
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    seen += _records(r)
    os.close(r)
    assert len({c for _, c, _ in seen if c >= 0}) >= 2, "the child committed less than twice"

    h = open_run(path)
    assert h.verify().ok
    steps = h.steps.tolist()
    last_written, last_reported_commit, _ = seen[-1]
    # what shows is a prefix; everything reported committed is there; a commit that became
    # durable after the last report (the kill's race) may show as well, nothing else
    assert steps == list(range(len(steps)))
    assert len(steps) - 1 >= last_reported_commit
    assert len(steps) - 1 <= last_written + 1
    # grouped by time, not by count: every commit before the kill held fewer than commit_steps
    # steps, and each was made at least COMMIT_SECONDS after the one before (the index rows'
    # commit times; a loaded machine only makes the gaps longer, so no timing decides this)
    at = {s: t for s, _, t in seen}
    commit_steps = WatchSettings(output_dir=path).commit_steps
    assert all(row["n_steps"] < commit_steps for row in h.commits)
    for a, b in itertools.pairwise(h.commits):
        assert b["time"] - a["time"] >= COMMIT_SECONDS * 0.9  # wall clock: slew allowed for
    # what the kill lost: the steps written after the last durable commit, and no more than
    # COMMIT_SECONDS of them (plus the step that was running at the deadline)
    lost = [s for s, _, _ in seen if s >= len(steps)]
    if lost:
        assert at[lost[-1]] - at[lost[0]] <= COMMIT_SECONDS + 0.5


def test_default_settings_commit_by_time_not_every_32_steps(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, settings=WatchSettings(output_dir=str(tmp_path / "run")))
    t0 = time.monotonic()
    for _ in range(100):
        with c.step(opt, examples=2):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    if time.monotonic() - t0 < c.writer.commit_seconds:  # a slow machine may pass 10 s
        assert c.writer.commits == 0
        assert c.writer.pending_steps == 100
    c.close()
    h = open_run(str(tmp_path / "run"))
    assert h.steps.tolist() == list(range(100))
