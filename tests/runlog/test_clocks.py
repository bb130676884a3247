"""Clocks: exact arithmetic with a scripted timer, deferred CUDA-event resolution."""

import pytest
import torch

from stepscope.runlog import ClockKind, StepClock


class Ticks:
    """A host timer that only moves when the test moves it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_training_is_the_window_minus_our_time_inside_it():
    t = Ticks()
    c = StepClock(timer=t)  # run starts at 100
    t.now = 101.0
    c.begin(0)
    t.now = 104.0
    c.end(0)  # window 3 s, of which 0.5 s were ours
    t.now = 104.75
    (r0,) = c.finish(0, telemetry_in_window=0.5, telemetry=1.25)
    assert (r0.training_seconds, r0.telemetry_seconds, r0.elapsed_seconds) == (2.5, 1.25, 4.75)
    t.now = 110.0
    c.begin(1)  # 5.25 s of something else between steps (evaluation): in neither clock
    t.now = 112.0
    c.end(1)
    (r1,) = c.finish(1, telemetry_in_window=0.0, telemetry=0.0)
    assert (r1.training_total, r1.telemetry_total, r1.elapsed_seconds) == (4.5, 1.25, 12.0)
    assert r1.training_total + r1.telemetry_total <= r1.elapsed_seconds
    assert c.overhead_fraction == 1.25 / 4.5
    assert c.kind is ClockKind.HOST_PERF_COUNTER


def test_finish_without_begin_or_end_is_an_empty_window_not_an_error():
    t = Ticks()
    c = StepClock(timer=t)
    t.now = 105.0
    (r,) = c.finish(0, telemetry_in_window=0.0, telemetry=0.0)
    assert r.training_seconds == 0.0 and r.elapsed_seconds == 5.0


class FakeEvent:
    """Stands in for torch.cuda.Event: device time is set by the test, completion too."""

    device_now = 0.0

    def __init__(self) -> None:
        self.t = None
        self.done = False
        self.synced = False

    def record(self) -> None:
        self.t = FakeEvent.device_now

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.synced = self.done = True

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert end.done, "elapsed_time on an incomplete event would fail on CUDA"
        return (end.t - self.t) * 1000.0  # milliseconds, like CUDA


def test_cuda_rows_wait_for_their_end_event_and_never_synchronise_early():
    events = []

    def factory():
        events.append(FakeEvent())
        return events[-1]

    t = Ticks()
    c = StepClock(timer=t, event_factory=factory)
    assert c.kind is ClockKind.CUDA_EVENT
    FakeEvent.device_now = 10.0
    c.begin(0)
    FakeEvent.device_now = 10.25
    c.end(0)
    assert c.finish(0, telemetry_in_window=0.5, telemetry=0.5) == []  # not complete yet
    FakeEvent.device_now = 11.0
    c.begin(1)
    FakeEvent.device_now = 11.5
    c.end(1)
    events[1].done = True  # step 0's end event completed meanwhile
    rows = c.finish(1, telemetry_in_window=0.0, telemetry=0.1)
    assert [(r.step, r.training_seconds) for r in rows] == [(0, 0.25)]
    assert not any(e.synced for e in events)
    (last,) = c.resolve(block=True)  # at close: synchronise the rest
    assert (last.step, last.training_seconds, last.training_total) == (1, 0.5, 0.75)
    assert events[3].synced
    assert c.summary(closed=True)["training_clock"] == "cuda_event"
    assert c.summary(closed=True)["unresolved_steps"] == 0


def test_cpu_device_uses_the_host_clock():
    assert StepClock("cpu").kind is ClockKind.HOST_PERF_COUNTER


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_real_cuda_events_time_a_device_step():  # runs only on a CUDA machine
    c = StepClock("cuda")
    x = torch.randn(2048, 2048, device="cuda")
    c.begin(0)
    for _ in range(20):
        x = x @ x
        x = x / x.norm()
    c.end(0)
    rows = c.finish(0, 0.0, 0.0) + c.resolve(block=True)
    assert c.kind is ClockKind.CUDA_EVENT and [r.step for r in rows] == [0]
    assert rows[0].training_seconds > 0
