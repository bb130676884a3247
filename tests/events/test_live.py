"""Live streaming (``WatchSettings(tensorboard=DIR, wandb=True)``) while training runs.

The real TensorBoard server is started on 127.0.0.1 while a collector is open and training is
paused mid-run (a thread waiting on an event), and it is asked over HTTP for the latest step;
the values it shows are compared with numbers the training loop computed itself from the
model (``loss``, ``weight.grad.norm()``). A tracker that blocks never blocks training (steps are
dropped and counted), one that raises never reaches it, W&B runs offline, and training with
streaming on is bitwise equal to an unobserved twin.
"""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope._purity import snapshot_rng
from stepscope.events import SubscriberFailureWarning
from stepscope.events.live import LiveStream, LiveStreamWarning
from stepscope.events.trackers.base import Tracker
from stepscope.history import StepBlockRecord
from stepscope.stats import HistogramDescriptor

WAIT_S = 120.0  # generous: the machine is shared; nothing is decided by time


def _model(seed: int = 0) -> torch.nn.Sequential:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _batches(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)) for _ in range(n)
    ]


def _step(model, opt, x, y, st=None) -> float:
    loss = torch.nn.functional.cross_entropy(model(torch.nn.functional.dropout(x, 0.1)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if st is not None:
        st.log("loss", loss)
    return float(loss.detach())


def test_the_real_tensorboard_server_shows_the_latest_step_while_training_runs(tmp_path):
    pytest.importorskip("tensorboard")
    from tests.events.test_tensorboard_server import _get, _wait_for, tensorboard_server

    paused, resume, done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[int, tuple[float, float]] = {}  # step -> (loss, fc1 grad norm), from the model
    state: dict[str, object] = {}
    settings = ss.WatchSettings(output_dir=tmp_path / "runs" / "live", tensorboard=tmp_path / "tb")

    def train() -> None:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with ss.HistoryCollector(model, sites="*", cadence=1, settings=settings) as c:
            state["collector"] = c
            for i, (x, y) in enumerate(_batches(12)):
                with c.step(opt, examples=len(y)) as st:
                    loss = _step(model, opt, x, y, st)
                    seen[i] = (loss, float(model[0].weight.grad.norm()))
                if i == 5:  # mid-run: wait (collector open) until the server has answered
                    paused.set()
                    resume.wait(WAIT_S)
        state["counts"] = c.live.counts
        done.set()

    thread = threading.Thread(target=train)
    thread.start()
    try:
        assert paused.wait(WAIT_S)
        with tensorboard_server(tmp_path / "tb") as base:
            rows = _wait_for(  # the live stream flushes when its queue runs empty
                lambda: _get(base, "/data/plugin/scalars/tags"),
                lambda t: "grad/0.weight/norm" in t.get("live", {}),
            )
            assert "live" in rows  # the run is named after its folder, not its hex id
            loss = _wait_for(
                lambda: _get(base, "/data/plugin/scalars/scalars", run="live", tag="loss"),
                lambda r: any(int(s) == 5 for _, s, _ in r),
            )
            norm = _wait_for(
                lambda: _get(
                    base, "/data/plugin/scalars/scalars", run="live", tag="grad/0.weight/norm"
                ),
                lambda r: any(int(s) == 5 for _, s, _ in r),
            )
            # read while training runs: the collector is open and the loop is waiting
            assert not done.is_set() and not state["collector"].closed
            assert [int(s) for _, s, _ in loss] == [0, 1, 2, 3, 4, 5]  # the latest step is 5
            np.testing.assert_array_equal(
                [v for _, _, v in loss], [np.float32(seen[i][0]) for i in range(6)]
            )
            np.testing.assert_allclose(  # the collector's reduction vs torch's norm, float32
                [v for _, _, v in norm], [seen[i][1] for i in range(6)], rtol=1e-6
            )
            text = _get(base, "/data/plugin/text/tags")["live"]
            assert text == ["run/record/text_summary"]
            resume.set()
            loss = _wait_for(
                lambda: _get(base, "/data/plugin/scalars/scalars", run="live", tag="loss"),
                lambda r: len(r) == 12,
            )
            assert [int(s) for _, s, _ in loss] == list(range(12))
    finally:
        resume.set()
        thread.join(WAIT_S)
    counts = state["counts"]
    assert (counts.sent_steps, counts.dropped_steps, counts.failed_deliveries) == (12, 0, 0)


class Blocking(Tracker):
    """A tracker stuck on its first step until released (a hung network, a full disk)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()
        self.steps: list[int] = []

    def on_events(self, events):
        self.entered.set()
        self.release.wait(WAIT_S)
        self.steps.append(events[0].optimizer_step)


def test_a_stuck_tracker_never_blocks_training_steps_are_dropped_and_counted(tmp_path):
    tracker = Blocking()
    settings = ss.WatchSettings(output_dir=tmp_path / "run", tensorboard=tracker)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = 300
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ss.HistoryCollector(model, sites="Linear", settings=settings) as c:
            for i, (x, y) in enumerate(_batches(n)):
                with c.step(opt, examples=len(y)) as st:
                    _step(model, opt, x, y, st)
                if i == 0:
                    assert tracker.entered.wait(WAIT_S)  # the streaming thread holds step 0
            # every step ran and was written while the tracker never returned
            assert tracker.steps == [] and not tracker.release.is_set()
            counts = c.live.counts
            assert counts.submitted_steps == n
            assert counts.dropped_steps == n - 1 - ss.events.live.LIVE_QUEUE_STEPS
            tracker.release.set()  # close() then sends what is queued
    assert tracker.steps == list(range(1 + ss.events.live.LIVE_QUEUE_STEPS))
    assert len([w for w in caught if issubclass(w.category, LiveStreamWarning)]) == 1
    assert ss.open_run(tmp_path / "run").steps.tolist() == list(range(n))  # all on disk


class Raising(Tracker):
    def on_events(self, events):
        raise OSError("disk full")


def test_a_raising_tracker_never_reaches_the_training_step_and_is_warned_about_once(tmp_path):
    settings = ss.WatchSettings(output_dir=tmp_path / "run", tensorboard=Raising())
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with ss.HistoryCollector(model, sites="Linear", settings=settings) as c:
            for x, y in _batches(12):
                with c.step(opt, examples=len(y)) as st:
                    _step(model, opt, x, y, st)
            live = c.live
    assert ss.open_run(tmp_path / "run").steps.tolist() == list(range(12))
    assert len([w for w in caught if issubclass(w.category, SubscriberFailureWarning)]) == 1
    assert live.counts.failed_deliveries == 8  # disabled after eight consecutive failures
    assert "disk full" in live.counts.last_error


def test_close_gives_up_on_a_tracker_that_never_returns_and_says_so():
    tracker = Blocking()
    live = LiveStream([tracker])
    assert live.submit(StepBlockRecord(0), [], [], HistogramDescriptor(), {"loss": 1.0})
    assert tracker.entered.wait(WAIT_S)
    with pytest.warns(LiveStreamWarning, match="did not finish"):
        live.close(timeout=0.2)
    assert not live.submit(StepBlockRecord(1), [], [], HistogramDescriptor(), {})  # closed
    tracker.release.set()


def _final_state(model, opt):
    return (
        [p.detach().clone() for p in model.parameters()],
        [(k, v.clone()) for s in opt.state.values() for k, v in s.items()],
    )


def test_training_with_streaming_on_is_bitwise_equal_to_an_unobserved_twin(tmp_path):
    pytest.importorskip("tensorboard")
    data = _batches(15)

    def run(observed: bool):
        model = _model(3)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        torch.manual_seed(7)  # dropout draws: the RNG must be untouched by streaming
        losses = []
        if not observed:
            for x, y in data:
                losses.append(_step(model, opt, x, y))
            return losses, _final_state(model, opt), snapshot_rng()
        settings = ss.WatchSettings(output_dir=tmp_path / "obs", tensorboard=tmp_path / "tb")
        with ss.HistoryCollector(model, sites="*", cadence=1, settings=settings) as c:
            for x, y in data:
                with c.step(opt, examples=len(y)) as st:
                    losses.append(_step(model, opt, x, y, st))
            assert c.live is not None
        return losses, _final_state(model, opt), snapshot_rng()

    (l0, (p0, s0), r0), (l1, (p1, s1), r1) = run(False), run(True)
    assert l0 == l1
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))
    assert len(s0) == len(s1) and all(torch.equal(a[1], b[1]) for a, b in zip(s0, s1))
    assert r0.equals(r1)
    assert any((tmp_path / "tb" / "obs").iterdir())  # it did stream


def test_wandb_true_streams_an_offline_run_named_after_the_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from tests.events.test_wandb import _history, _wait_for_exit

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wb"))
    # wandb.init without a dir writes ./wandb: should WANDB_DIR ever be missed (wandb reads its
    # environment once per process), the stray run lands in tmp_path, not the checkout
    monkeypatch.chdir(tmp_path)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    settings = ss.WatchSettings(output_dir=tmp_path / "runs" / "baseline", wandb=True)
    with ss.HistoryCollector(model, sites="Linear", cadence=1, settings=settings) as c:
        for x, y in _batches(4):
            with c.step(opt, examples=len(y)) as st:
                losses.append(_step(model, opt, x, y, st))
    (path,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    records = _wait_for_exit(path)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "baseline"
    rows = _history(records)
    assert [r["optimizer_step"] for r in rows] == [0, 1, 2, 3]
    assert [r["loss"] for r in rows] == losses
    assert all("grad/0.weight/norm" in r and "update/2.weight/ratio" in r for r in rows)
