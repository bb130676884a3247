"""Cadence qualification charges serialisation too (the seed's target is measurement plus
serialisation), and keeps the two parts apart in the decision."""

from __future__ import annotations

import time

import pytest
import torch

from stepscope import open_run
from stepscope.history import HistoryWriter
from stepscope.probe import DenseProbe, plan_cadence, time_probe_parts, write_probe_record
from tests.probe.probe_testkit import make_data, make_model


def test_serialisation_is_timed_and_charged_to_the_probe(tmp_path):
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    written = []

    def slow_write(record):  # a serialiser with a known floor of 30 ms
        time.sleep(0.03)
        written.append(record)

    t = time_probe_parts(probe, model, step, repeats=2, warmup=1, serialize=slow_write)
    assert len(written) == 3  # warm-up included: every measurement was serialised
    assert min(t.serialization_seconds) >= 0.03
    assert t.probe_seconds == pytest.approx(
        [m + s for m, s in zip(t.measure_seconds, t.serialization_seconds)]
    )
    decision = plan_cadence(probe, model, step, target=0.05, repeats=2, serialize=slow_write)
    parts = decision.measurements
    assert min(parts["serialization_seconds"]) >= 0.03
    assert decision.probe_seconds_median >= 0.03 + min(parts["measure_seconds"])
    # a real serialiser: the run's own writer format, into a scratch artifact
    with HistoryWriter(tmp_path / "scratch", durable=False) as w:
        t = time_probe_parts(
            probe, model, step, repeats=1, serialize=lambda r: write_probe_record(w, r)
        )
    assert min(t.serialization_seconds) > 0
    assert "probe/model/loss" in open_run(tmp_path / "scratch").scalar_names
