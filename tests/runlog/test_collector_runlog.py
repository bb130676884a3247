"""The collector's run log: same rows as RunLog, skipped branches absent (not zero), clocks."""

import time

import numpy as np
import torch

import stepscope as ss
from stepscope.history import Presence
from tests.runlog.runlog_testkit import BATCH, STEPS, STEPS_PER_EPOCH

W2 = "blocks.2.fc.weight"


def _collect(sdnet_train, path, *, streams=("gradient", "parameter"), **kw):
    made = []

    def make(model, opt):
        c = ss.HistoryCollector(
            model,
            sites=lambda n, m: isinstance(m, torch.nn.Linear),
            streams=streams,
            cadence=1,
            settings=ss.WatchSettings(output_dir=str(path), durable=False),
        )
        made.append(c)
        return c, lambda examples, epoch: c.step(opt, examples=examples, epoch=epoch)

    truth = sdnet_train(make, **kw)
    made[0].close()
    return truth, made[0]


def test_collector_rows_match_the_logged_values_and_axes(tmp_path, sdnet_train):
    truth, _c = _collect(sdnet_train, tmp_path / "run")
    h = ss.open_run(tmp_path / "run")
    v = h.view()
    assert h.scalars("loss").values.tolist() == [truth.loss[s] for s in range(STEPS)]
    lr = v.scalar("lr")
    assert lr.values.tolist() == [truth.lr[s] for s in range(STEPS)]
    assert lr.examples_seen.tolist() == [BATCH * (s + 1) for s in range(STEPS)]
    assert lr.epoch.tolist() == [s // STEPS_PER_EPOCH for s in range(STEPS)]
    val = v.evals("validation")
    assert [(r.optimizer_step, r.examples_seen) for r in val] == [
        (0, 0),
        (4, 64),
        (8, 128),
        (12, 192),
    ]
    assert [r.metrics["ce"] for r in val] == [truth.val_ce[s] for s in (0, 4, 8, 12)]
    b1 = v.branch("blocks.1")
    assert b1.active_units.tolist() == [truth.row_active[s] for s in range(STEPS)]


def _w2_gradient(path):
    s = ss.open_run(path).series(W2, "gradient", "sum_squares")
    return s, s.presence_names()


def test_a_skipped_branch_with_stale_zero_grads_is_not_scheduled_not_zero(tmp_path, sdnet_train):
    # zero_grad(set_to_none=False): a skipped block keeps a zero-filled .grad tensor
    truth, _ = _collect(sdnet_train, tmp_path / "run", set_to_none=False)
    s, presence = _w2_gradient(tmp_path / "run")
    skipped = [st for st in range(STEPS) if not truth.block2_runs[st]]
    ran = [st for st in range(STEPS) if truth.block2_runs[st]]
    assert skipped and ran
    assert s.steps.tolist() == list(range(STEPS))
    assert [presence[st] for st in skipped] == [Presence.NOT_SCHEDULED.value] * len(skipped)
    assert np.isnan(s.values[skipped]).all() and not s.valid[skipped].any()
    np.testing.assert_allclose(s.values[ran], [truth.grad_sq[st] for st in ran], rtol=1e-12)
    assert all(truth.grad_sq[st] > 0 for st in ran)
    # the same site's parameter stream is still measured at skipped steps (momentum moves it)
    p = ss.open_run(tmp_path / "run").series(W2, "parameter", "sum_squares")
    assert p.valid.all()


def test_without_the_mask_stale_zero_grads_would_read_as_measured(tmp_path, sdnet_train):
    # the contrast that shows the mask is what makes the difference
    truth, _ = _collect(sdnet_train, tmp_path / "run", set_to_none=False, masks=False)
    s, _presence = _w2_gradient(tmp_path / "run")
    skipped = [st for st in range(STEPS) if not truth.block2_runs[st]]
    assert [truth.grad_sq[st] for st in skipped] == [0.0] * len(skipped)
    assert s.valid[skipped].all() and (s.values[skipped] == 0).all()


def test_grads_set_to_none_are_absent_and_the_mask_marks_them_not_scheduled(tmp_path, sdnet_train):
    truth, _ = _collect(sdnet_train, tmp_path / "a", masks=False)
    _, presence = _w2_gradient(tmp_path / "a")
    skipped = [st for st in range(STEPS) if not truth.block2_runs[st]]
    assert {presence[st] for st in skipped} == {Presence.SITE_ABSENT.value}
    _collect(sdnet_train, tmp_path / "b")
    _, presence = _w2_gradient(tmp_path / "b")
    assert {presence[st] for st in skipped} == {Presence.NOT_SCHEDULED.value}


def test_collector_clocks_add_up_and_match_its_telemetry(tmp_path, sdnet_train):
    _, c = _collect(sdnet_train, tmp_path / "run", streams=("activation", "gradient"))
    v = ss.open_run(tmp_path / "run").view()
    clk = v.clocks()
    assert clk.steps.tolist() == list(range(STEPS))
    assert (clk.training_seconds + clk.telemetry_seconds <= clk.elapsed_seconds).all()
    training, telemetry = clk.per_step()
    assert (training > 0).all() and (telemetry > 0).all()  # hooks ran: our time is not zero
    assert clk.telemetry_seconds[-1] == c.telemetry_seconds  # same sums, same order
    assert v.summary["closed"] and v.summary["training_clock"] == "host_perf_counter"
    # the run's totals add what came after the last step (its write, at least) to the rows'
    trailing = v.summary["trailing_telemetry_seconds"]
    assert trailing > 0
    assert v.summary["telemetry_seconds"] == clk.telemetry_seconds[-1] + trailing
    assert (
        v.summary["overhead_fraction"]
        == v.summary["telemetry_seconds"] / (clk.training_seconds[-1])
    )


def test_telemetry_after_the_last_step_is_counted_in_the_run_total(tmp_path):
    """A final probe or checkpoint after the last step used to be charged to a step that was
    never written, and so to nothing: the run's telemetry total left it out."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = ss.HistoryCollector(
        model, cadence=1, settings=ss.WatchSettings(output_dir=str(tmp_path / "run"))
    )
    for _ in range(2):
        with c.step(opt, examples=4):
            model(torch.ones(4, 3)).pow(2).mean().backward()
            opt.step()
    with c.telemetry():  # the final probe of a run
        time.sleep(0.05)
    c.close()
    v = ss.open_run(tmp_path / "run").view()
    rows = v.clocks().telemetry_seconds[-1]
    assert v.summary["trailing_telemetry_seconds"] >= 0.05
    assert v.summary["telemetry_seconds"] == rows + v.summary["trailing_telemetry_seconds"]


def test_ram_collector_keeps_run_log_rows():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ss.HistoryCollector(model, optimizer=None) as c:
        c.log_eval("train_probe", {"accuracy_fraction": torch.tensor(0.25)}, sample_count=8)
        for _step in range(3):
            with c.step(opt, examples=4, epoch=0) as st:
                loss = model(torch.ones(4, 3)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                st.log("loss", loss)
        v = c.run_view()
    assert v.scalar("loss").examples_seen.tolist() == [4, 8, 12]
    (e,) = v.evals("train_probe")
    assert (e.optimizer_step, e.examples_seen, e.metrics) == (0, 0, {"accuracy_fraction": 0.25})
    assert v.clocks().steps.tolist() == [0, 1, 2]
    assert v.clocks().training_clock == "host_perf_counter"


def test_host_clock_rows_are_published_live_with_their_step():
    from stepscope.events import EventBus, Subscriber

    class Keep(Subscriber):
        def __init__(self):
            self.events = []

        def on_events(self, events):
            self.events.extend(events)

    bus = EventBus()
    keep = bus.subscribe(Keep())
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = ss.WatchSettings(event_bus=bus, ram_policy="drop_oldest")
    with ss.HistoryCollector(model, settings=settings) as c:
        for _ in range(3):
            with c.step(opt, examples=4):
                model(torch.ones(4, 3)).sum().backward()
                opt.step()
        view = c.run_view()
    bus.close()
    live = [(e.optimizer_step, e.value) for e in keep.events if e.name == "clock/training_seconds"]
    stored = view.clocks()
    assert live == list(zip(stored.steps.tolist(), stored.training_seconds.tolist()))
