"""Observation is pure: an observed run equals the unobserved same-seed control bitwise."""

import copy

import pytest
import torch
import torch.nn.functional as F

from stepscope.collect import ALL_STREAMS, Cadence, HistoryCollector, WatchSettings
from tests.collect.collect_testkit import SmallNet, batches


def train(
    optimizer_name: str, observe: bool, tmp_path, steps: int = 50, spelling: str = "explicit"
):
    torch.manual_seed(0)
    model = SmallNet()
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        if optimizer_name == "sgd"
        else torch.optim.AdamW(model.parameters(), lr=1e-3)
    )
    collector = None
    if observe:
        collector = HistoryCollector(
            model,
            sites="*",
            streams=ALL_STREAMS,
            cadence=Cadence(1, 1),  # every stream, spine and histogram, every step
            settings=WatchSettings(
                output_dir=str(tmp_path / f"{optimizer_name}-{spelling}"), durable=False
            ),
            optimizer=opt if spelling == "implicit" else None,
        )
    losses = []
    torch.manual_seed(123)  # dropout stream
    for x, y in batches(steps):
        if collector is not None and spelling == "explicit":
            with collector.step(opt, examples=len(y)):
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
        else:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses.append(loss.detach().clone())
    if collector is not None:
        collector.close()
    return torch.stack(losses), model, opt, torch.get_rng_state()


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.view(torch.uint8) if a.dtype == torch.bool else a, b)
    )


@pytest.mark.parametrize("optimizer_name", ["sgd", "adamw"])
@pytest.mark.parametrize("spelling", ["explicit", "implicit"])
def test_observed_run_is_bitwise_equal_to_control(optimizer_name, spelling, tmp_path):
    l0, m0, o0, r0 = train(optimizer_name, False, tmp_path)
    l1, m1, o1, r1 = train(optimizer_name, True, tmp_path, spelling=spelling)
    assert torch.equal(l0, l1)
    for (n, a), (_, b) in zip(m0.state_dict().items(), m1.state_dict().items()):
        assert bitwise_equal(a, b), n  # parameters and BatchNorm running stats / counters
    s0, s1 = o0.state_dict()["state"], o1.state_dict()["state"]
    assert s0.keys() == s1.keys()
    for k in s0:
        for name in s0[k]:
            assert torch.equal(torch.as_tensor(s0[k][name]), torch.as_tensor(s1[k][name])), (
                k,
                name,
            )
    assert torch.equal(r0, r1)
    assert all(p.grad is not None for p in m1.parameters())


def test_collector_does_not_keep_references_that_change_the_model(small_net, tmp_path):
    before = copy.deepcopy(small_net.state_dict())
    c = HistoryCollector(
        small_net,
        sites="*",
        streams=ALL_STREAMS,
        settings=WatchSettings(output_dir=str(tmp_path / "r")),
    )
    c.close()
    after = small_net.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
