"""The collector on a CUDA model: rows stay on the device until one copy per buffer per step,
and observation stays pure. Skipped without CUDA; run by ``benchmarks/gpu/gpu_check.sh``."""

import pytest
import torch
import torch.nn.functional as F

from stepscope import transfer as transfer_mod
from stepscope.collect import ALL_STREAMS, Cadence, HistoryCollector

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def make(width: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(width)]).cuda()
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def train(model, opt, collector, steps=5):
    g = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 16, device="cuda", generator=g)
        if collector is None:
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        else:
            with collector.step(opt):
                loss = model(x).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
        losses.append(loss.detach())
    return torch.stack(losses)


@cuda
def test_cuda_transfers_per_step_do_not_grow_with_sites(monkeypatch):
    counts = []
    for width in (3, 30):
        model, opt = make(width)
        c = HistoryCollector(model, sites="*", streams=ALL_STREAMS, cadence=Cadence(1, 1))
        calls: list[str] = []

        def counted(t, calls=calls, real=transfer_mod.to_host):
            calls.append(t.device.type)
            return real(t)

        monkeypatch.setattr(transfer_mod, "to_host", counted)
        train(model, opt, c, steps=1)
        monkeypatch.undo()
        c.close()
        counts.append(len(calls))
    assert counts[0] == counts[1] <= 3


@cuda
def test_cuda_observed_run_equals_control():
    m0, o0 = make(4)
    l0 = train(m0, o0, None)
    m1, o1 = make(4)
    c = HistoryCollector(m1, sites="*", streams=ALL_STREAMS, cadence=Cadence(1, 1))
    l1 = train(m1, o1, c)
    c.close()
    assert torch.equal(l0, l1)
    assert all(
        torch.equal(a, b) for a, b in zip(m0.state_dict().values(), m1.state_dict().values())
    )
    assert F.mse_loss(l0, l1).item() == 0.0
