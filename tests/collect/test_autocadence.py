"""``cadence="auto"``: the choice rule against hand arithmetic, and the collector applying it."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from stepscope import Refusal, open_history
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
    assert {s: c.spine for s, c in d.cadences.items()} == expect == {"activation": 1, "gradient": 4, "parameter": 16}
    assert {s: c.histogram for s, c in d.cadences.items()} == {s: 10 * k for s, k in expect.items()}
    assert d.expected_overhead == pytest.approx((0.0013 / 1 + 0.0065 / 4 + 0.026 / 16) / 0.1)
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
    c = HistoryCollector(model, sites="*", cadence=auto, settings=WatchSettings(output_dir=str(tmp_path / "a")))
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
    h = open_history(tmp_path / "a")
    for s, k in chosen.items():
        # the decision is in the artifact, at the step it was made
        rec = h.scalars(f"cadence/{s}/spine_every")
        assert rec.steps.tolist() == [4] and rec.values.tolist() == [float(k)]
        # warm-up: every step; afterwards exactly the chosen cadence's steps
        site = "0" if s == "activation" else "0.weight"
        steps = h.series(site, s, "total").steps.tolist()
        assert steps == [*range(5), *[t for t in range(5, 40) if t % k == 0]], (s, k)
    assert h.run.extra["auto_cadence"] == {"target": 0.05, "warmup": 5, "histogram_factor": 10}
    assert np.isfinite(decision["training_seconds_median"]) and decision["training_seconds_median"] > 0
