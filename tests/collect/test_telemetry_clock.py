"""``with collector.telemetry()``: probe work is telemetry time and never reaches the step's rows."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope.stats import SPINE_FIELDS
from tests.collect.models import HookOracle, Numbers, ResNetish, close, spine_numbers

PROBE_SECONDS = 0.4


def _per_step(h, name):
    s = h.scalars(name)
    cumulative = dict(zip(s.steps.tolist(), s.values.tolist()))
    steps = sorted(cumulative)
    return {
        k: cumulative[k] - (cumulative[steps[i - 1]] if i else 0.0) for i, k in enumerate(steps)
    }


def _recorded(h, site, stream, step) -> Numbers:
    row = np.full(len(SPINE_FIELDS), np.nan)
    for i, name in enumerate(SPINE_FIELDS):
        values = h.series(site, stream, name, steps=(step, step)).values
        assert len(values) == 1
        row[i] = values[0]
    return spine_numbers(row)


def _probe(model, g):
    """A dense-probe stand-in: a forward and backward on a larger batch, then a wait."""
    x = torch.randn(32, 3, 8, 8, generator=g)
    model(x).pow(2).mean().backward()
    time.sleep(PROBE_SECONDS)


def test_probe_inside_the_transaction_is_telemetry_time_and_not_in_the_rows(tmp_path):
    torch.manual_seed(0)
    model = ResNetish()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sites = ["conv1", "layer1.conv1", "fc"]
    oracle = HookOracle(model, sites)
    g = torch.Generator().manual_seed(1)
    s = ss.WatchSettings(output_dir=str(tmp_path / "r"), durable=False, commit_steps=1)
    with ss.HistoryCollector(
        model,
        sites=sites,
        streams=("activation", "gradient", "activation_grad"),
        cadence=1,
        settings=s,
    ) as c:
        for step in range(4):
            x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)
            with c.step(opt, examples=4):
                opt.zero_grad()
                with oracle.forward():
                    out = model(x)
                torch.nn.functional.cross_entropy(out, y).backward()
                oracle.before_step()
                opt.step()
                oracle.after_step()
                if step == 2:
                    with c.telemetry():
                        _probe(model, g)
                        with c.telemetry():  # nested: charged once
                            pass
    oracle.remove()
    h = ss.open_run(tmp_path / "r")
    telemetry = _per_step(h, "clock/telemetry_seconds")
    training = _per_step(h, "clock/training_seconds")
    assert telemetry[2] >= PROBE_SECONDS
    assert training[2] < PROBE_SECONDS  # isolated training seconds exclude the probe
    assert max(telemetry[k] for k in (0, 1, 3)) < PROBE_SECONDS
    checked = 0
    for site in sites:
        for stream in ("activation", "activation_grad", "gradient"):
            key = f"{site}.weight" if stream == "gradient" else site
            for step in range(4):
                want = oracle.numbers(key, stream, step)
                got = _recorded(h, key, stream, step)
                assert close(got, want), (key, stream, step, got, want)
                checked += 1
    assert checked == 36


def test_probe_between_steps_counts_in_the_next_steps_telemetry(tmp_path):
    torch.manual_seed(0)
    model = ResNetish()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    s = ss.WatchSettings(output_dir=str(tmp_path / "r"), durable=False, commit_steps=1)
    with ss.HistoryCollector(model, sites="Linear", cadence=1, settings=s) as c:
        for step in range(3):
            if step == 1:
                with c.telemetry():
                    _probe(model, g)
            x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)
            with c.step(opt, examples=4):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
    h = ss.open_run(tmp_path / "r")
    telemetry = _per_step(h, "clock/telemetry_seconds")
    assert telemetry[1] >= PROBE_SECONDS > max(telemetry[0], telemetry[2])
    totals = h.series("fc", "activation", "total")
    assert totals.values.tolist() == [20.0, 20.0, 20.0]  # 4 x 5 logits, never the probe's 32 x 5


def test_telemetry_window_closes_on_an_exception():
    model = ResNetish()
    with ss.HistoryCollector(model, sites="Linear") as c:
        with pytest.raises(KeyError):
            with c.telemetry():
                raise KeyError("probe failed")
        assert not c._open.window.open
        model(torch.randn(2, 3, 8, 8))
        assert c._reducer.staging(torch.device("cpu")).fired.sum() == 1  # recording again


def test_the_transactions_own_bookkeeping_is_telemetry_not_training(tmp_path):
    """Work the step transaction does around the body (here a slow model-surgery check at its
    entry) is charged to the step's telemetry seconds and kept out of its training seconds."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    s = ss.WatchSettings(output_dir=str(tmp_path / "r"), durable=False)
    slow = 0.03
    with ss.HistoryCollector(model, cadence=1, settings=s) as c:
        real = c._structure.check

        def slow_check(step):
            time.sleep(slow if step == 2 else 0.0)
            return real(step)

        c._structure.check = slow_check
        for _ in range(4):
            with c.step(opt, examples=2):
                model(torch.randn(2, 4)).sum().backward()
                opt.step()
                opt.zero_grad()
    h = ss.open_run(tmp_path / "r")
    telemetry = _per_step(h, "clock/telemetry_seconds")
    training = _per_step(h, "clock/training_seconds")
    assert telemetry[2] >= slow > max(telemetry[1], telemetry[3])
    assert training[2] < slow  # the sleep is not training
