"""Gradients with ``optimizer.step(closure)``: the recorded gradient is the one the step consumed.

The backward of a closure runs *inside* ``optimizer.step``, after the pre-step hook. The oracle
here is the closure itself: right after its own ``backward()`` it writes down every parameter's
gradient sum of squares (the last evaluation of a step wins, as the optimizer's last evaluation
is the one its update and its state are built from).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import stepscope as ss
from tests.collect.models import LSTMTagger, ResNetish, TinyGPT
from tests.collect.stepkit import ce, disk_settings, images, tokens


def _recorded(path, site: str, field: str = "sum_squares"):
    h = ss.open_run(path)
    s = h.series(site, "gradient", field)
    return dict(zip(s.steps.tolist(), s.values.tolist()))


def _named_params(model):
    return [(n, p) for n, p in model.named_parameters()]


def _closure_loop(model, opt, batches, loss_fn, collector, explicit=True, snapshots=None):
    """A hand-written closure loop; ``snapshots[step][name]`` = grad sum of squares after each
    backward of the step (the last one stays)."""
    names = _named_params(model)
    for x, y in batches:
        consumed: dict[str, float] = {}

        def closure(x=x, y=y, consumed=consumed):
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            for n, p in names:
                if p.grad is not None:
                    consumed[n] = float(p.grad.double().pow(2).sum())
            return loss

        if explicit:
            with collector.step(opt, examples=len(x)):
                opt.step(closure)
        else:
            opt.step(closure)
        snapshots.append(consumed)


def _assert_consumed(path, model, snapshots, note=True):
    recorded_sites = {site.name for site in ss.open_run(path).sites}
    names = [n for n, _ in _named_params(model) if n in recorded_sites]
    assert len(names) >= 4
    for name in names:
        rec = _recorded(path, name)
        for step, consumed in enumerate(snapshots):
            want = consumed.get(name)
            if want is None:
                continue
            got = rec.get(step, float("nan"))
            assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-30), (name, step, got, want)
    if note:
        obs = ss.open_run(path).observations(stream="gradient")
        observed = [r for r in obs if r.presence.value == "observed"]
        assert observed
        assert {r.phase.value for r in observed} == {"pre_step"}


@pytest.mark.parametrize("max_iter", [1, 3])
def test_lbfgs_records_the_gradient_of_the_steps_last_closure_evaluation(tmp_path, max_iter):
    torch.manual_seed(0)
    model = ResNetish()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=max_iter, history_size=4)
    snapshots: list[dict[str, float]] = []
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        _closure_loop(model, opt, images(6), ce, c, snapshots=snapshots)
    _assert_consumed(tmp_path / "run", model, snapshots)


@pytest.mark.parametrize("explicit", [True, False], ids=["explicit", "implicit"])
def test_hand_written_closure_loop_on_a_gpt_decoder(tmp_path, explicit):
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    snapshots: list[dict[str, float]] = []
    if explicit:
        c = ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path))
    else:
        c = ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path), optimizer=opt)
    with c:
        _closure_loop(model, opt, tokens(6), ce, c, explicit=explicit, snapshots=snapshots)
    assert len(ss.open_run(tmp_path / "run").steps) == 6
    _assert_consumed(tmp_path / "run", model, snapshots)


def test_closure_gradients_are_not_stale_at_step_zero(tmp_path):
    """Before the fix the pre-step hook read gradients before the closure's backward: at step 0
    there were none (absent), later ones were the previous step's."""
    torch.manual_seed(0)
    model = LSTMTagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    snapshots: list[dict[str, float]] = []
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        _closure_loop(
            model, opt, tokens(4, vocab=30), lambda o, y: ce(o, y % 4), c, snapshots=snapshots
        )
    rec = _recorded(tmp_path / "run", "emb.weight")
    assert 0 in rec and not math.isnan(rec[0])
    _assert_consumed(tmp_path / "run", model, snapshots)


def test_closure_observation_is_pure(tmp_path):
    def run(observe: bool):
        torch.manual_seed(0)
        model = ResNetish()
        opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)
        snaps: list = []
        if observe:
            with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
                _closure_loop(model, opt, images(3), ce, c, snapshots=snaps)
        else:

            class Null:
                def step(self, *a, **k):
                    import contextlib

                    return contextlib.nullcontext()

            _closure_loop(model, opt, images(3), ce, Null(), snapshots=snaps)
        return model.state_dict(), opt.state_dict()["state"]

    (a, sa), (b, sb) = run(True), run(False)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    for i in sa:
        for k, v in sa[i].items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, sb[i][k])


class AcceleratedLike(torch.optim.Optimizer):
    """What accelerate's ``AcceleratedOptimizer`` looks like to a hook: a torch optimizer
    subclass that never ran ``Optimizer.__init__`` and forwards to ``.optimizer``."""

    def __init__(self, optimizer):  # deliberately no super().__init__()
        self.optimizer = optimizer

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure=None):
        return self.optimizer.step(closure)


def test_an_accelerate_style_wrapper_is_unwrapped(tmp_path):
    torch.manual_seed(0)
    model = ResNetish()
    opt = AcceleratedLike(torch.optim.AdamW(model.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(5)
    want = []
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        for x, y in images(4):
            with c.step(opt, examples=len(x)):
                opt.zero_grad()
                ce(model(x), y).backward()
                want.append(float(model.fc.weight.grad.double().pow(2).sum()))
                opt.step()
    del g
    rec = _recorded(tmp_path / "run", "fc.weight")
    np.testing.assert_allclose([rec[i] for i in range(4)], want, rtol=1e-9)
    blocks = ss.open_run(tmp_path / "run").step_blocks()
    assert [b.truth.applied.value for b in blocks] == ["yes"] * 4


def test_real_accelerate_optimizer_is_unwrapped(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    torch.manual_seed(0)
    acc = accelerate.Accelerator(cpu=True)
    base = ResNetish()
    model, opt = acc.prepare(base, torch.optim.SGD(base.parameters(), lr=0.1))
    assert isinstance(opt, accelerate.optimizer.AcceleratedOptimizer)
    want = []
    try:
        with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
            for x, y in images(3):
                with c.step(opt, examples=len(x)):
                    opt.zero_grad()
                    acc.backward(ce(model(x), y))
                    want.append(float(base.fc.weight.grad.double().pow(2).sum()))
                    opt.step()
    finally:
        accelerate.state.AcceleratorState._reset_state(reset_partial_state=True)
    rec = _recorded(tmp_path / "run", "fc.weight")
    np.testing.assert_allclose([rec[i] for i in range(3)], want, rtol=1e-9)
    blocks = ss.open_run(tmp_path / "run").step_blocks()
    assert [b.truth.applied.value for b in blocks] == ["yes"] * 3


def test_an_object_that_wraps_no_optimizer_is_refused(tmp_path):
    model = ResNetish()

    class NotAnOptimizer:
        def step(self):
            pass

    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        with pytest.raises(ss.Refusal) as err:
            with c.step(NotAnOptimizer()):
                pass
        assert err.value.code == "optimizer_unsupported"


class LightningLike:
    """Lightning's ``LightningOptimizer``: the torch optimizer lives in ``._optimizer``."""

    def __init__(self, optimizer):
        self._optimizer = optimizer

    def step(self, closure=None):
        return self._optimizer.step(closure=closure)

    def zero_grad(self):
        self._optimizer.zero_grad()


def test_lightning_style_accumulation_with_the_last_backward_inside_step(tmp_path):
    """Automatic optimization with accumulate_grad_batches=3: the first two micro-batches run
    their closure (forward + backward) directly, the last one inside ``optimizer.step(closure)``;
    the transaction spans the window. The recorded gradient is the accumulated one consumed."""
    torch.manual_seed(0)
    model = TinyGPT()
    opt = LightningLike(torch.optim.AdamW(model.parameters(), lr=1e-3))
    data = tokens(12)
    named = _named_params(model)
    consumed: list[dict[str, float]] = []
    with ss.HistoryCollector(model, cadence=1, settings=disk_settings(tmp_path)) as c:
        for window in range(4):
            micro = data[3 * window : 3 * window + 3]
            with c.step(opt, examples=sum(len(x) for x, _ in micro)):
                for k, (x, y) in enumerate(micro):

                    def closure(x=x, y=y):
                        loss = ce(model(x), y) / 3
                        loss.backward()
                        return loss

                    if k < 2:
                        closure()
                    else:
                        seen = {}

                        def last(closure=closure, seen=seen):
                            loss = closure()
                            for n, p in named:
                                seen[n] = float(p.grad.double().pow(2).sum())
                            return loss

                        opt.step(closure=last)
                        opt.zero_grad()
                        consumed.append(seen)
    _assert_consumed(tmp_path / "run", model, consumed)
    h = ss.open_run(tmp_path / "run")
    assert h.series("ln_f", "activation", "total").values.tolist() == [
        float(sum(3 * x.shape[1] * 32 for x, _ in data[3 * w : 3 * w + 3])) for w in range(4)
    ]
