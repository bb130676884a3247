"""Cadence and probe-size decisions from measured costs."""

from __future__ import annotations

import json

import pytest
import torch

from stepscope.probe import (
    DenseProbe,
    choose_cadence,
    choose_probe_size,
    plan_cadence,
    time_probe,
)
from tests.probe.probe_testkit import make_data, make_model


def test_densest_cadence_keeps_overhead_at_or_under_target():
    d = choose_cadence([0.2], [0.1], target=0.05, probe_size=128, dtype="float32")
    assert d.cadence_steps == 40 and d.expected_overhead == pytest.approx(0.05)
    assert 0.2 / ((d.cadence_steps - 1) * 0.1) > 0.05  # one denser would exceed it
    assert d.rule == "densest_cadence" and d.dtype == "float32"
    assert choose_cadence([0.001], [1.0]).cadence_steps == 1
    json.dumps(d.to_dict())


def test_unreachable_target_is_recorded_not_forced():
    d = choose_cadence([1.0], [0.01], target=0.05, max_cadence=100)
    assert d.cadence_steps is None and d.expected_overhead is None
    assert d.rule.startswith("infeasible")


def test_largest_probe_that_fits_is_chosen_with_its_measurements():
    costs = {32: [0.01, 0.012], 128: [0.04, 0.041], 512: [0.2, 0.19]}
    d = choose_probe_size(costs, [0.1, 0.1], cadence_steps=10, target=0.05)
    assert d.probe_size == 128 and d.expected_overhead == pytest.approx(0.0405)
    assert d.measurements["probe_seconds_by_size"]["512"] == [0.2, 0.19]
    assert choose_probe_size(costs, [0.001], cadence_steps=1).probe_size is None


def test_bad_timings_are_rejected():
    with pytest.raises(ValueError):
        choose_cadence([], [0.1])
    with pytest.raises(ValueError):
        choose_cadence([float("nan")], [0.1])


def test_time_probe_measures_real_costs_and_keeps_snapshots():
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=8)
    probe.measure(model, step=0, examples_seen=0, epoch=0)
    snaps = (probe.init_snapshot, probe.snapshot)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    probe_s, step_s = time_probe(probe, model, step, repeats=3, warmup=1)
    assert len(probe_s) == len(step_s) == 3 and min(probe_s + step_s) > 0
    assert (probe.init_snapshot, probe.snapshot) == snaps
    assert choose_cadence(probe_s, step_s).cadence_steps >= 1
    decision = plan_cadence(probe, model, step, target=0.5, repeats=2)
    assert decision.probe_size == 8 and decision.dtype == "float32"
    assert len(decision.measurements["probe_seconds"]) == 2 and decision.cadence_steps >= 1
