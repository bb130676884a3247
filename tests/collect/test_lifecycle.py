"""Hooks are removed on every exit path; close is idempotent; refusals come before any forward."""

import pytest
import torch
import torch.nn.functional as F

from stepscope import Refusal
from stepscope.collect import ALL_STREAMS, HistoryCollector, WatchSettings
from tests.collect.collect_testkit import batches


def hook_count(model: torch.nn.Module) -> int:
    return sum(
        len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        for m in model.modules()
    )


def opt_hook_count(opt: torch.optim.Optimizer) -> int:
    return len(opt._optimizer_step_pre_hooks) + len(opt._optimizer_step_post_hooks)


def one_step(model, opt, x, y):
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def test_close_removes_everything_and_is_idempotent(small_net):
    opt = torch.optim.SGD(small_net.parameters(), lr=0.1)
    with HistoryCollector(small_net, sites="*", streams=ALL_STREAMS, optimizer=opt) as c:
        assert hook_count(small_net) > 0 and opt_hook_count(opt) == 2
        one_step(small_net, opt, *batches(1)[0])
    assert hook_count(small_net) == 0 and opt_hook_count(opt) == 0
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(Refusal) as err:
        with c.step(opt):
            pass
    assert err.value.code == "collector_closed"


@pytest.mark.parametrize("exc_type", [RuntimeError, KeyboardInterrupt])
def test_exception_inside_a_step_removes_hooks_and_keeps_committed_data(
    small_net, tmp_path, exc_type
):
    from stepscope import open_run

    opt = torch.optim.SGD(small_net.parameters(), lr=0.1)
    c = HistoryCollector(
        small_net,
        sites="*",
        streams=ALL_STREAMS,
        settings=WatchSettings(output_dir=str(tmp_path / "r")),
    )
    data = batches(3)
    for x, y in data[:2]:
        with c.step(opt):
            one_step(small_net, opt, x, y)
    with pytest.raises(exc_type):
        with c.step(opt):
            small_net(data[2][0])
            raise exc_type("interrupted")
    assert c.closed and hook_count(small_net) == 0 and opt_hook_count(opt) == 0
    assert list(open_run(tmp_path / "r").steps) == [0, 1]  # the failed step is not recorded


def test_empty_selection_refuses_at_construction(small_net):
    calls = []
    small_net.register_forward_pre_hook(lambda *a: calls.append(1))
    with pytest.raises(Refusal) as err:
        HistoryCollector(small_net, sites="LSTM")
    assert err.value.code == "selection_empty" and calls == []
    assert hook_count(small_net) == 1  # only the test's own hook


def test_bad_streams_and_settings_refuse(small_net):
    with pytest.raises(Refusal) as err:
        HistoryCollector(small_net, streams=("weights",))
    assert err.value.code == "stream_unknown"
    with pytest.raises(Refusal) as err:
        WatchSettings(ram_policy="shed")
    assert err.value.code == "settings_invalid"
    with pytest.raises(Refusal) as err:
        HistoryCollector(small_net, cadence=0)
    assert err.value.code == "cadence_invalid"
    with pytest.raises(Refusal) as err:
        HistoryCollector(small_net, sites="drop", streams=("parameter",))
    assert err.value.code == "selection_empty"  # Dropout owns no parameter


def test_nested_transactions_refuse(small_net):
    c = HistoryCollector(small_net, sites="fc")
    with pytest.raises(Refusal) as err:
        with c.step():
            with c.step():
                pass
    assert err.value.code == "step_transaction_nested"
    assert c.closed  # the refusal escaped the outer step: the collector closed itself
