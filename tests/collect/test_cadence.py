"""``cadence="auto"``: the choice rule against hand arithmetic, and the collector applying it."""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stepscope import Refusal, open_run
from stepscope.collect import AutoCadence, HistoryCollector, WatchSettings, choose_stream_cadences


def test_choice_matches_hand_arithmetic():
    # T = 100 ms, target 5%, 3 streams -> budget 5/3 ms each; histogram factor 10 -> costs x 1.3;
    # shared 0.3 ms -> +0.1 ms per stream
    d = choose_stream_cadences(
        {"activation": [0.0009, 0.0009, 0.0011], "gradient": [0.0049], "parameter": [0.0199]},
        [0.0003],
        [0.1, 0.1, 0.1],
        target=0.05,
        histogram_factor=10,
    )
    budget = 0.05 * 0.1 / 3
    expect = {
        "activation": math.ceil(0.001 * 1.3 / budget),  # 1.3 ms / 1.667 ms -> 1
        "gradient": math.ceil(0.005 * 1.3 / budget),  # 6.5 / 1.667 -> 4
        "parameter": math.ceil(0.020 * 1.3 / budget),  # 26 / 1.667 -> 16
    }
    assert (
        {s: c.spine for s, c in d.cadences.items()}
        == expect
        == {"activation": 1, "gradient": 4, "parameter": 16}
    )
    assert {s: c.histogram for s, c in d.cadences.items()} == {s: 10 * k for s, k in expect.items()}
    act = (0.0029 / 3 + 0.0001) * 1.3  # costs are means: the steady state pays the mean
    assert d.expected_overhead == pytest.approx((act / 1 + 0.0065 / 4 + 0.026 / 16) / 0.1)
    assert d.expected_overhead <= 0.05


def test_no_training_time_keeps_every_step_and_says_so():
    d = choose_stream_cadences({"a": [0.01]}, [], [0.0])
    assert d.cadences["a"].spine == 1 and d.expected_overhead is None
    assert d.rule == "no_training_time_measured"


def test_invalid_auto_settings_refuse():
    for kwargs in ({"target": 0}, {"target": 1.5}, {"warmup": 1}, {"histogram_factor": 0}):
        with pytest.raises(Refusal) as err:
            AutoCadence(**kwargs)
        assert err.value.code == "cadence_invalid"


def test_collector_measures_then_applies_and_records_its_choice(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    auto = AutoCadence(target=0.05, warmup=5)
    c = HistoryCollector(
        model, sites="*", cadence=auto, settings=WatchSettings(output_dir=str(tmp_path / "a"))
    )
    for _ in range(40):
        with c.step(opt, examples=16):
            loss = F.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 4, (16,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    c.close()
    decision = c.cadence_decision
    assert decision is not None and decision["decided_at_step"] == 4
    chosen = {s: c.cadences[s].spine for s in c.streams}
    assert all(k >= 1 for k in chosen.values())
    h = open_run(tmp_path / "a")
    for s, k in chosen.items():
        # the decision is in the artifact, at the step it was made
        rec = h.scalars(f"cadence/{s}/spine_every")
        assert rec.steps.tolist() == [4] and rec.values.tolist() == [float(k)]
        # warm-up: the measuring pattern (nothing due at s % 4 == 3); then the chosen cadence
        site = "0" if s == "activation" else "0.weight"
        steps = h.series(site, s, "total").steps.tolist()
        warm = [t for t in range(5) if t % 4 != 3]
        assert steps == [*warm, *[t for t in range(5, 40) if t % k == 0]], (s, k)
    assert h.run.extra["auto_cadence"] == {"target": 0.05, "warmup": 5, "histogram_factor": 10}
    assert (
        np.isfinite(decision["training_seconds_median"]) and decision["training_seconds_median"] > 0
    )


def _sleepy_run(
    tmp_path,
    between_s: float,
    body_s: float,
    write_sleep=None,
    steps: int = 24,
    background_writer: bool = True,
):
    """A tiny model whose step body sleeps ``body_s``; the user loop sleeps ``between_s``."""
    import time

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c = HistoryCollector(
        model,
        sites="*",
        cadence=AutoCadence(target=0.05, warmup=20),
        settings=WatchSettings(output_dir=str(tmp_path / "run"), background_writer=background_writer),
    )
    if write_sleep is not None:
        real, calls = c.writer.write_step, itertools.count(1)

        def slow_write(*a, **k):
            time.sleep(write_sleep(next(calls)))
            return real(*a, **k)

        c.writer.write_step = slow_write
    for _ in range(steps):
        time.sleep(between_s)  # data loading, the user's own logging: not training, not telemetry
        with c.step(opt):
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(body_s)
    c.close()
    return c.cadence_decision


class _FakeClock:
    """``time.perf_counter`` that moves only when the test says so (no wall clock decides)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_warmup_times_the_step_body_not_the_gap_between_steps(tmp_path, monkeypatch):
    import time

    clock = _FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    # torch's per-hook dispatch is measured once in CPU time, outside any clock: zero it here
    monkeypatch.setattr("stepscope.collect.cadence.hook_dispatch_seconds", lambda: 0.0)
    d = _sleepy_run(tmp_path, between_s=0.03, body_s=0.01)
    # the training time is the transaction body (10 ms), not body + the user's 30 ms gap; the
    # clock moves only in the test's sleeps, so nothing else is charged and the figure is exact
    assert d["training_seconds_median"] == pytest.approx(0.01, abs=1e-9)


def test_warmup_charges_the_write_and_commit_spikes_the_steady_state_pays(tmp_path, monkeypatch):
    import time

    clock = _FakeClock()
    monkeypatch.setattr(time, "perf_counter", clock)
    monkeypatch.setattr(time, "sleep", clock.sleep)
    monkeypatch.setattr("stepscope.collect.cadence.hook_dispatch_seconds", lambda: 0.0)
    # every 4th write is a 12 ms "commit": the steady state pays 3 ms per step on average
    d = _sleepy_run(tmp_path, 0.0, 0.01, write_sleep=lambda n: 0.012 if n % 4 == 0 else 0.0)
    train = d["training_seconds_median"]
    per_step_telemetry = d["expected_overhead"] * train
    assert per_step_telemetry >= 0.002, d  # a median would have dropped every spike
    assert d["fixed_seconds"] > 0.0


def test_meter_recovers_costs_and_its_prediction_matches_a_simulated_steady_state():
    from stepscope.collect.cadence import WarmupMeter

    F, S, C, H, HS, T = (
        0.001,
        0.0004,
        {"a": 0.002, "b": 0.0005},
        {"a": 0.004, "b": 0.001},
        0.002,
        0.1,
    )
    auto = AutoCadence(target=0.05, warmup=40)
    cad = auto.warmup_cadence()

    def step_cost(step, cadences):
        """Streams' seconds and the step's own shared seconds (its write is carried onward)."""
        spine = {s: cadences[s].spine_due(step) for s in C}
        hist = {s: cadences[s].histogram_due(step) for s in C}
        streams = {s: (C[s] if spine[s] else 0.0) + (H[s] if hist[s] else 0.0) for s in C}
        own = F + (S if any(spine.values()) else 0.0) + (HS if any(hist.values()) else 0.0)
        return streams, own

    meter = WarmupMeter(auto, list(C))
    carried = 0.0
    for step in range(auto.warmup):
        streams, own = step_cost(step, dict.fromkeys(C, cad))
        write = own / 2  # half of the shared work happens after the block is built
        meter.record(step, T, streams, carried + sum(streams.values()) + own - write, carried)
        carried = write
    choice = meter.decide()
    assert choice.fixed_seconds == pytest.approx(F)
    assert choice.shared_seconds_median == pytest.approx(S)
    assert choice.stream_seconds_median == pytest.approx(C)
    # steady state with the chosen cadences, brute force over many steps
    chosen = choice.cadences
    total = 0.0
    horizon = 100 * max(c.histogram for c in chosen.values())
    for step in range(horizon):
        streams, own = step_cost(step, chosen)
        total += sum(streams.values()) + own
    measured = total / horizon / T
    assert measured == pytest.approx(choice.expected_overhead, abs=0.015)
    assert choice.expected_overhead <= 0.05


def _simulated_warmup(meter, T, F, hook_s=0.0, hook_calls=0):
    """Record a warm-up whose every step costs F of its own, plus hooks inside the body."""
    carried = 0.0
    for step in range(meter.auto.warmup):
        spine = step % 4 != 3
        streams = {s: (0.001 if spine else 0.0) for s in meter.streams}
        # the hooks run inside the timed body: a training clock sees T plus their seconds
        body = T + hook_s + hook_calls * meter.dispatch_s
        meter.record(step, body, streams, carried + sum(streams.values()) + F / 2, carried,
                     hook_s, hook_calls)  # fmt: skip
        carried = F / 2
    return meter.decide()


def test_meter_moves_the_hooks_seconds_from_training_to_the_fixed_cost():
    from stepscope.collect.cadence import WarmupMeter

    meter = WarmupMeter(AutoCadence(target=0.05, warmup=40), ["a", "b"])
    meter.dispatch_s = 2e-6  # torch's call path per hooked call (measured at construction)
    choice = _simulated_warmup(meter, T=0.1, F=0.001, hook_s=0.0004, hook_calls=50)
    # own: F + the hooks' Python (0.4 ms) + 50 dispatches (0.1 ms); training: T without them
    assert choice.fixed_seconds == pytest.approx(0.001 + 0.0004 + 50 * 2e-6)
    assert choice.training_seconds_median == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("policy", "steps_per_commit"),
    [((1024, 10.0), 100.0), ((32, 10.0), 32.0), ((1024, None), 1024.0), ((4, 0.05), 1.0)],
)
def test_one_measured_commit_is_spread_over_the_steps_between_commits(policy, steps_per_commit):
    from stepscope.collect.cadence import WarmupMeter

    meter = WarmupMeter(AutoCadence(target=0.05, warmup=40), ["a"], commit_policy=policy)
    meter.dispatch_s = 0.0
    meter.commit_s = 0.05
    # T = 0.1 s, F = 0: commit_seconds=10 means a commit every 100 steps
    choice = _simulated_warmup(meter, T=0.1, F=0.0)
    assert choice.fixed_seconds == pytest.approx(0.05 / max(1.0, steps_per_commit))


@pytest.mark.parametrize("background_writer", [False, True])
def test_auto_warmup_measures_a_real_commit_and_the_hook_dispatch(tmp_path, background_writer):
    d = _sleepy_run(tmp_path, 0.0, 0.005, background_writer=background_writer)
    if background_writer:  # commits run on the writer thread: none is charged to training
        assert d["commit_seconds"] == 0
    else:  # the warm-up's rows were committed on the training thread and timed
        assert d["commit_seconds"] > 0
    assert 0 < d["hook_dispatch_seconds"] < 1e-3
    h = open_run(tmp_path / "run")
    # that commit made the warm-up durable at the decision step
    assert h.commits[0]["step_hi"] == d["decided_at_step"] - 1
