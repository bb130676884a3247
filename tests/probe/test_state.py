"""Displacement from init, delta since snapshot, and the true one-step update."""

from __future__ import annotations

import pytest
import torch

from stepscope import Refusal
from stepscope.probe import DenseProbe
from tests.probe.probe_testkit import make_data, make_model


def _train_step(model, opt, x, y):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def test_update_is_measured_across_one_step_including_momentum_and_decay():
    model = make_model("mlp_nobias")
    x, y = make_data("mlp_nobias")
    lr, mom, wd = 0.1, 0.9, 0.01
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=mom, weight_decay=wd)
    probe = DenseProbe(x, y, size=8)
    _train_step(model, opt, x, y)  # step 0 -> 1: fills the momentum buffer
    w = model[0].weight
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grad, before = w.grad.detach().clone(), w.detach().clone()
    buf = opt.state[w]["momentum_buffer"].detach().clone()
    with probe.around_step(model, step=1, optimizer=opt) as upd:
        opt.step()
    # independent analytic SGD update: buf' = mom*buf + (g + wd*w); dW = -lr * buf'
    expected = (-lr * (mom * buf + grad + wd * before)).norm().item()
    result = probe.update()
    assert result.update_norm["0.weight"] == pytest.approx(expected, rel=1e-5)
    assert result.update_norm["0.weight"] != pytest.approx(lr * grad.norm().item(), rel=1e-2)
    assert upd.snapshot_nbytes == 4 * sum(p.numel() for p in model.parameters())
    rec = probe.measure(model, step=2, examples_seen=48, epoch=0)
    layer = rec.layers["0"]
    assert layer.update == pytest.approx(expected, rel=1e-5) and layer.update_step == 1
    assert layer.update_ratio == pytest.approx(expected / before.norm().item(), rel=1e-5)
    assert rec.cost["update_snapshot_nbytes"] == upd.snapshot_nbytes
    # a later measurement does not re-report that update
    assert probe.measure(model, step=3, examples_seen=0, epoch=0).layers["0"].update is None


@pytest.mark.parametrize("steps", [0, 2])
def test_around_step_refuses_anything_but_exactly_one_step(steps):
    model = make_model("mlp")
    x, y = make_data("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = DenseProbe(x, y, size=8)
    with pytest.raises(Refusal) as err:
        with probe.around_step(model, step=0, optimizer=opt):
            for _ in range(steps):
                _train_step(model, opt, x, y)
    assert err.value.code == "probe_update_steps_invalid"
    assert not opt._optimizer_step_post_hooks  # the counting hooks were removed
    assert not opt._optimizer_step_pre_hooks


def test_update_without_snapshot_refuses_and_measure_reports_none():
    model = make_model("mlp")
    x, y = make_data("mlp")
    probe = DenseProbe(x, y, size=8)
    with pytest.raises(Refusal) as err:
        probe.update()
    assert err.value.code == "snapshot_missing"
    rec = probe.measure(model, step=5, examples_seen=0, epoch=0)
    layer = rec.layers["0"]
    assert layer.update is None and layer.update_ratio is None
    assert layer.displacement_from_init is None and layer.delta_since_snapshot is None
    assert layer.validity["init_snapshot_present"] is False


def test_displacement_and_delta_since_snapshot_carry_their_steps():
    model = make_model("mlp")
    x, y = make_data("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    probe = DenseProbe(x, y, size=8)
    w0 = model[0].weight.detach().clone()
    rec0 = probe.measure(model, step=0, examples_seen=0, epoch=0)
    assert rec0.layers["0"].displacement_from_init == 0.0
    assert rec0.cost["init_snapshot_nbytes"] is not None
    for _ in range(3):
        _train_step(model, opt, x, y)
    w3 = model[0].weight.detach().clone()
    rec3 = probe.measure(model, step=3, examples_seen=72, epoch=0)
    for _ in range(2):
        _train_step(model, opt, x, y)
    rec5 = probe.measure(model, step=5, examples_seen=120, epoch=0)
    w5 = model[0].weight.detach()
    layer = rec5.layers["0"]
    assert layer.displacement_from_init == pytest.approx((w5 - w0).norm().item(), rel=1e-6)
    assert layer.delta_since_snapshot == pytest.approx((w5 - w3).norm().item(), rel=1e-6)
    assert (layer.delta_since_snapshot_start_step, layer.delta_since_snapshot_end_step) == (3, 5)
    assert layer.delta_since_snapshot_interval_steps == 2
    assert rec3.layers["0"].delta_since_snapshot_interval_steps == 3
    assert layer.param_l2 == pytest.approx(w5.norm().item(), rel=1e-6)
    assert layer.bias.param_l2 == pytest.approx(model[0].bias.norm().item(), rel=1e-6)


class NestedSGD(torch.optim.SGD):
    """Its ``step`` calls the parent's, which torch has wrapped too: the hooks run twice."""

    def step(self, closure=None):  # type: ignore[override]
        return super().step(closure)


def test_around_step_counts_a_subclass_calling_super_step_as_one_step():
    """Used to refuse ``probe_update_steps_invalid`` ("saw 2 optimizer steps")."""
    model = make_model("mlp_nobias")
    x, y = make_data("mlp_nobias")
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # SGD.step is wrapped
    opt = NestedSGD(model.parameters(), lr=0.1)
    probe = DenseProbe(x, y, size=8)
    w = model[0].weight
    before = w.detach().clone()
    with probe.around_step(model, step=0, optimizer=opt):
        _train_step(model, opt, x, y)
    assert probe.update().update_norm["0.weight"] == pytest.approx(
        (w.detach() - before).norm().item(), rel=1e-6
    )
