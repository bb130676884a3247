"""The collector's own reductions are charged to stepscope (part b), never to the user's ops.

Oracle: the same training step profiled without a collector. With the collector on, the ops
the accounting leaves to the user (``internal=False``) must be exactly the control's, name for
name and count for count; everything the collector added must sit under a
``stepscope.internal/`` scope.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

import stepscope as ss
from stepscope.transfer import INTERNAL_PREFIX, internal_scope


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )


def _user_ops(collector_on: bool, streams=None) -> tuple[Counter, Counter]:
    model = small_cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 4, (4,), generator=g)
    kwargs = {} if streams is None else {"streams": streams}
    collector = (
        ss.HistoryCollector(model, cadence=1, optimizer=opt, **kwargs) if collector_on else None
    )

    def step() -> None:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    try:
        for _ in range(2):  # warm-up: first-call discovery is not the steady state
            if collector is not None:
                with collector.step(opt):
                    step()
            else:
                step()
        with ss.session(device_time=False) as s:
            if collector is not None:
                with collector.step(opt):
                    step()
            else:
                step()
    finally:
        if collector is not None:
            collector.close()
    ops = s.result.join.ops
    user = Counter(op.name for op in ops if not op.internal)
    internal = Counter(op.name for op in ops if op.internal)
    return user, internal


@pytest.mark.parametrize("streams", [None, ("activation", "gradient", "parameter", "update")])
def test_a_capture_with_the_collector_on_charges_none_of_its_ops_to_the_user(streams):
    control, control_internal = _user_ops(False)
    observed, internal = _user_ops(True, streams)
    assert not any(n.startswith(INTERNAL_PREFIX) for n in control)
    leaked = observed - control
    assert not leaked, f"collector ops charged to the user: {dict(leaked)}"
    # and the collector did reduce something, inside its scopes
    assert any(n.startswith(INTERNAL_PREFIX) for n in internal)
    assert sum(internal.values()) > sum(control_internal.values())


def test_internal_scope_is_a_no_op_without_a_profiler():
    assert not torch.autograd._profiler_enabled()
    with internal_scope("x") as a, internal_scope("y") as b:
        assert a is None and b is None
