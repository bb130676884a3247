"""``torch.compile`` in both orders: training runs, the collector causes no
graph break (counted by ``torch._dynamo.explain``), activation rows of compiled forwards are
``unsupported`` with reason ``torch_compile``, and optimizer-side streams are recorded exactly."""

import pytest
import torch

from stepscope.collect import Cadence, HistoryCollector
from stepscope.history import Presence
from stepscope.history.batch import member_of


def make():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


@pytest.mark.parametrize("order", ["compile_then_collect", "collect_then_compile"])
def test_compiled_models_train_without_graph_breaks_from_the_collector(order):
    torch._dynamo.reset()
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if order == "compile_then_collect":
        compiled = torch.compile(model, backend="eager")
        c = HistoryCollector(compiled, cadence=Cadence(1, 1))
    else:
        c = HistoryCollector(model, cadence=Cadence(1, 1))
        compiled = torch.compile(model, backend="eager")
    grads = []
    for _ in range(3):
        with c.step(opt):
            loss = compiled(torch.randn(5, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            grads.append(model[0].weight.grad.detach().double().pow(2).sum().item())
            opt.step()
    explain = torch._dynamo.explain(compiled)(torch.randn(5, 4))
    c.close()
    assert explain.graph_break_count == 0
    assert [s.name for s in c.sites] == ["0.weight", "0.bias", "2.weight", "2.bias", "0", "1", "2"]
    by_stream = {b.stream.value: b for b in c.last_batches}
    act = by_stream["activation"]
    assert [member_of(Presence, p) for p in act.presence] == [Presence.UNSUPPORTED] * 3
    assert act.row_disclosures == (("unsupported:torch_compile",),) * 3
    grad = by_stream["gradient"]
    assert all(member_of(Presence, p) is Presence.OBSERVED for p in grad.presence)
    assert grad.spines[0][11] == grads[-1]  # sum_squares of 0.weight's gradient


def test_a_model_compiled_on_a_quiet_step_still_reads_unsupported_when_due():
    """Quiet steps take the module hooks off; a model compiled then (traced without them) is
    still noticed by the model's own hooks, so due steps read ``torch_compile``, never absent."""
    torch._dynamo.reset()
    model = make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, cadence=Cadence(3, None))
    compiled = None
    presence = {}
    for step in range(7):
        if step == 2:  # a quiet step
            compiled = torch.compile(model, backend="eager")
        with c.step(opt):
            loss = (compiled or model)(torch.randn(5, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        for b in c.last_batches:
            if b.stream.value == "activation":
                presence[step] = [member_of(Presence, p) for p in b.presence]
    c.close()
    assert presence[0] == [Presence.OBSERVED] * 3
    assert presence[3] == presence[6] == [Presence.UNSUPPORTED] * 3
