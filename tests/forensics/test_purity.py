"""The flight recorder observes purely, removes its hooks, and finds a non-finite gradient.

Same seed with and without a collector carrying a flight recorder (every step read, a trigger
fired, the cadence made dense): bitwise-equal losses, parameters, optimizer state and RNG state.
After ``close()`` no forward or optimizer hook of the recorder is left.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope.forensics import Predicate
from tests.collect.models import TinyGPT


def run(recorder: ss.FlightRecorder | None, steps: int = 30, nan_at: int | None = None):
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(1)
    c = None
    if recorder is not None:
        c = ss.HistoryCollector(
            model, settings=ss.WatchSettings(ram_policy="drop_oldest", flight_recorder=recorder)
        )
    losses = []
    for step in range(steps):
        x = torch.randint(0, 40, (4, 16), generator=data)
        ctx = c.step(opt) if c is not None else None
        if ctx is not None:
            ctx.__enter__()
        loss = torch.nn.functional.cross_entropy(
            model(x).reshape(-1, 40), x.roll(-1, 1).reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        if step == nan_at:
            model.h[1].mlp[2].weight.grad[0, 0] = math.nan
        opt.step()
        if c is not None:
            c.log("loss", loss.detach())
            ctx.__exit__(None, None, None)
        losses.append(loss.detach().clone())
    if c is not None:
        c.close()
    return model, opt, losses, c


def test_observation_with_a_flight_recorder_is_bitwise_pure() -> None:
    fire = Predicate(lambda r: r.step == 12, name="at_12")
    model_a, opt_a, loss_a, c = run(ss.FlightRecorder(window=16, dense_steps=4, triggers=(fire,)))
    rng_a = torch.get_rng_state()
    model_b, opt_b, loss_b, _ = run(None)
    assert c is not None and [r["step"] for r in c.forensics.rows] == [12]
    assert all(torch.equal(a, b) for a, b in zip(loss_a, loss_b))
    for (n, a), (_, b) in zip(model_a.state_dict().items(), model_b.state_dict().items()):
        assert torch.equal(a, b), n
    sa, sb = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert all(torch.equal(sa[k][f], sb[k][f]) for k in sa for f in sa[k])
    assert torch.equal(rng_a, torch.get_rng_state())


def test_close_removes_every_recorder_hook() -> None:
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = sum(len(m._forward_hooks) for m in model.modules())
    pre, post = len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks)
    c = ss.HistoryCollector(model, settings=ss.WatchSettings(flight_recorder=ss.FlightRecorder()))
    with c.step(opt):
        model(torch.randint(0, 40, (2, 8))).sum().backward()
        opt.step()
    assert len(opt._optimizer_step_post_hooks) > post
    c.close()
    assert sum(len(m._forward_hooks) for m in model.modules()) == before
    assert (len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks)) == (pre, post)


def test_a_nan_gradient_fires_non_finite_at_its_step_naming_the_parameter() -> None:
    _, _, _, c = run(ss.FlightRecorder(window=16, dense_steps=2), steps=24, nan_at=20)
    assert c is not None
    rows = c.forensics.rows
    assert rows and rows[0]["step"] == 20
    channels = {x["channel"] for x in rows[0]["crossings"] if x["trigger"] == "non_finite"}
    assert "h.1.mlp.2.weight/grad_rms" in channels


def test_the_implicit_spelling_reads_each_step_into_its_own_row() -> None:
    """``HistoryCollector(optimizer=opt)`` ends a step in the optimizer's post-hook: the
    recorder's post-hook runs before it, so each update lands in its own step's row."""
    from tests.forensics.spikekit import Independent, independent_hooks

    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rec, handles = independent_hooks(model, opt, Independent())
    fire = Predicate(lambda r: r.step == 9, name="at_9")
    settings = ss.WatchSettings(flight_recorder=ss.FlightRecorder(window=16, triggers=(fire,)))
    c = ss.HistoryCollector(model, optimizer=opt, settings=settings)
    data = torch.Generator().manual_seed(1)
    for step in range(12):
        rec.step = step
        x = torch.randint(0, 40, (4, 16), generator=data)
        out = model(x).reshape(-1, 40)
        loss = torch.nn.functional.cross_entropy(out, x.roll(-1, 1).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    c.close()
    for h in handles:
        h.remove()
    (spike,) = c.forensics.spikes()
    steps, got = spike.column("h.0.mlp.0.weight", "update_rms")
    assert steps.tolist() == list(range(10))
    want = [rec.values[("h.0.mlp.0.weight", "update_rms")][s] for s in range(10)]
    np.testing.assert_allclose(got, want, rtol=2e-5, equal_nan=False)


def test_a_failing_hook_stops_the_recorder_with_one_warning_never_the_step(monkeypatch) -> None:
    from stepscope.forensics.reading import SiteReader

    def broken(self, *a):
        raise RuntimeError("boom")

    monkeypatch.setattr(SiteReader, "_post_step_body", broken)
    with pytest.warns(RuntimeWarning, match="flight recorder stopped"):
        _, _, losses, c = run(ss.FlightRecorder(window=8), steps=4)
    assert c is not None and not c.forensics.live and len(losses) == 4
