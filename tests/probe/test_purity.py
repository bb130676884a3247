"""Observation is pure: a measured training run is bitwise the unobserved same-seed run."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from stepscope import Refusal
from stepscope._purity import snapshot_rng
from stepscope.probe import DenseProbe
from tests.probe.probe_testkit import make_data


def _model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1),
        nn.BatchNorm2d(3),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Dropout(0.5),
        nn.Linear(3 * 7 * 7, 8),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Linear(8, 5),
    )


def _run(observe: bool, steps: int = 6):
    torch.manual_seed(123)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    x, y = make_data("cnn", n=48)
    probe = DenseProbe(x, y, size=12, seed=5) if observe else None
    losses = []
    for step in range(steps):
        batch = torch.randperm(48)[:16]  # consumes the global RNG: the data order stream
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()
        if probe is not None:
            grad_obj = model[0].weight.grad
            grad_val = grad_obj.clone()
            probe.measure(model, step=step, examples_seen=16 * step, epoch=0)
            assert model[0].weight.grad is grad_obj and torch.equal(grad_obj, grad_val)
            assert model.training
            with probe.around_step(model, step=step, optimizer=opt):
                opt.step()
        else:
            opt.step()
        losses.append(loss.detach())
    return model, opt, torch.stack(losses), snapshot_rng()


def test_measuring_every_step_is_bitwise_the_unobserved_run():
    m_obs, o_obs, l_obs, r_obs = _run(True)
    m_ref, o_ref, l_ref, r_ref = _run(False)
    assert torch.equal(l_obs, l_ref)  # dropout masks and batches identical (via the losses)
    for a, b in zip(m_obs.state_dict().values(), m_ref.state_dict().values()):
        assert torch.equal(a, b)  # parameters and BatchNorm running stats
    for a, b in zip(m_obs.parameters(), m_ref.parameters()):
        assert torch.equal(a.grad, b.grad)
        assert torch.equal(o_obs.state[a]["momentum_buffer"], o_ref.state[b]["momentum_buffer"])
    assert r_obs.equals(r_ref)


def test_measure_leaves_rng_modes_flags_and_buffers_unchanged():
    torch.manual_seed(0)
    model = _model().train()
    model[5].weight.requires_grad_(False)
    x, y = make_data("cnn", n=20)
    probe = DenseProbe(x, y, size=8)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = snapshot_rng()
    probe.measure(model, step=0, examples_seen=0, epoch=0)
    assert snapshot_rng().equals(rng)
    assert all(m.training for m in model.modules())
    assert model[5].weight.requires_grad is False
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


class _Counter(nn.Module):
    """Writes a buffer on every forward, even in eval mode (an impure model)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def test_a_model_that_writes_state_in_eval_is_refused():
    x, y = torch.randn(6, 3), torch.randint(0, 2, (6,))
    with pytest.raises(Refusal) as err:
        DenseProbe(x, y, size=4).measure(_Counter(), step=0, examples_seen=0, epoch=0)
    assert err.value.code == "probe_state_changed"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_measure_matches_cpu_and_keeps_cuda_rng():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 4))
    x, y = make_data("mlp")
    cpu = DenseProbe(x, y, size=8).measure(model, step=0, examples_seen=0, epoch=0)
    model.cuda()
    torch.cuda.manual_seed(1)
    rng = snapshot_rng()
    gpu = DenseProbe(x, y, size=8).measure(model, step=0, examples_seen=0, epoch=0)
    assert snapshot_rng().equals(rng)
    for name in cpu.layers:
        assert gpu.layers[name].fisher_trace == pytest.approx(
            cpu.layers[name].fisher_trace, rel=1e-4
        )
    assert gpu.model.confusion == cpu.model.confusion
