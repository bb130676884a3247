"""Gradient and update rows are what the optimizer consumed: closures that clip, accumulation
through a closure, parameters the optimizer skipped.

The oracle (:class:`tests.collect.consumed.Consumed`) reads the gradients the optimizer gathers
inside its own ``step()``, after any closure, in float64. Each case also runs an unobserved twin
and compares parameters and optimizer state bit for bit.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

import stepscope as ss
from tests.collect.consumed import Consumed, assert_rows_are_consumed, update_presence
from tests.collect.stepkit import disk_settings


class Branchy(nn.Module):
    """A trunk, a branch used only when asked, and a frozen layer."""

    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.frozen = nn.Linear(8, 8)
        self.frozen.requires_grad_(False)
        self.branch = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, use_branch: bool = True) -> torch.Tensor:
        h = torch.tanh(self.frozen(torch.relu(self.trunk(x))))
        if use_branch:
            h = h + self.branch(h)
        return self.head(h)


NAMES = [f"{m}.{p}" for m in ("trunk", "frozen", "branch", "head") for p in ("weight", "bias")]


def _batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(5, 6, generator=g), torch.randint(0, 3, (5,), generator=g)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, use_branch: bool = True):
    return nn.functional.cross_entropy(model(x, use_branch), y)


def _run(tmp_path, loop, spelling: str, observe: bool, make_opt):
    """Run ``loop(model, opt, step_ctx)`` for 3 steps; returns model, opt, oracle."""
    torch.manual_seed(0)
    model = Branchy()
    opt = make_opt(model.parameters())
    oracle = Consumed(opt, model)
    g = torch.Generator().manual_seed(1)
    settings = disk_settings(tmp_path)
    if not observe:
        for _ in range(3):
            loop(model, opt, g, contextlib.nullcontext)
        return model, opt, oracle
    implicit = spelling == "implicit"
    with ss.HistoryCollector(
        model, cadence=1, settings=settings, optimizer=opt if implicit else None
    ) as c:
        for _ in range(3):
            loop(model, opt, g, contextlib.nullcontext if implicit else lambda: c.step(opt))
    return model, opt, oracle


def _assert_pure(a, b) -> None:
    (ma, oa, _), (mb, ob, _) = a, b
    for (k, va), vb in zip(ma.state_dict().items(), mb.state_dict().values()):
        assert torch.equal(va, vb), k
    for i, sa in oa.state_dict()["state"].items():
        for k, v in sa.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, ob.state_dict()["state"][i][k]), (i, k)


def _clip_in_closure(model, opt, g, step):
    x, y = _batch(g)

    def closure():
        opt.zero_grad()
        loss = _loss(model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3)  # clips inside the closure
        return loss

    with step():
        opt.step(closure)


def _accumulate_through_closure(model, opt, g, step):
    """Lightning's automatic accumulation: micro-batches 1-2 run the closure directly (forward
    through the branch + backward), micro-batch 3 inside ``opt.step(closure)`` without it."""
    micro = [_batch(g) for _ in range(3)]
    with step():
        opt.zero_grad()
        for x, y in micro[:2]:
            (_loss(model, x, y, use_branch=True) / 3).backward()
        x, y = micro[2]

        def closure():
            loss = _loss(model, x, y, use_branch=False) / 3
            loss.backward()
            return loss

        opt.step(closure)


@pytest.mark.parametrize("spelling", ["explicit", "implicit"])
def test_a_closure_that_clips_records_the_clipped_gradient(tmp_path, spelling):
    """The rows used to be the pre-clip gradients of the closure's backward."""
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    seen = _run(tmp_path, _clip_in_closure, spelling, True, sgd)
    oracle = seen[2].steps
    assert len(oracle) == 3
    clipped_norm = sum(v[2] for v in oracle[0].values()) ** 0.5
    assert clipped_norm == pytest.approx(1e-3, rel=1e-4)  # the oracle saw the clipped gradient
    assert_rows_are_consumed(tmp_path / "run", oracle, NAMES)
    _assert_pure(seen, _run(tmp_path, _clip_in_closure, spelling, False, sgd))


@pytest.mark.parametrize("spelling", ["explicit", "implicit"])
def test_accumulation_through_a_closure_records_an_early_micro_batch_branch(tmp_path, spelling):
    """The branch's gradient, accumulated in micro-batches 1-2 and consumed by the
    step, used to be ``site_absent`` (the closure's backward never reached it)."""
    adamw = lambda p: torch.optim.AdamW(p, lr=1e-2)  # noqa: E731
    seen = _run(tmp_path, _accumulate_through_closure, spelling, True, adamw)
    oracle = seen[2].steps
    assert all("branch.weight" in s for s in oracle)
    assert_rows_are_consumed(tmp_path / "run", oracle, NAMES)
    _assert_pure(seen, _run(tmp_path, _accumulate_through_closure, spelling, False, adamw))


def _unused_branch(model, opt, g, step):
    x, y = _batch(g)
    with step():
        opt.zero_grad()
        _loss(model, x, y, use_branch=False).backward()
        opt.step()


@pytest.mark.parametrize("name", ["sgd", "adamw"])
@pytest.mark.parametrize("spelling", ["explicit", "implicit"])
def test_parameters_the_optimizer_skipped_have_no_observed_update(tmp_path, name, spelling):
    """A frozen layer and an unused branch (``.grad is None``) used to have observed update
    rows of sum of squares 0; torch's optimizer never stepped them."""
    make = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.1),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1),
    }[name]
    seen = _run(tmp_path, _unused_branch, spelling, True, make)
    oracle = seen[2].steps
    for step, consumed in enumerate(oracle):
        rows = update_presence(tmp_path / "run", step)
        assert sorted(rows) == sorted(NAMES)
        observed = sorted(n for n, (p, _) in rows.items() if p == "observed")
        assert observed == sorted(consumed)  # exactly the parameters the optimizer gathered
        for skipped in ("frozen.weight", "frozen.bias", "branch.weight", "branch.bias"):
            assert rows[skipped] == ("site_absent", ("not_stepped:grad_none",)), skipped
    # the gradient rows agree: the skipped parameters' are absent, the others consumed
    assert_rows_are_consumed(tmp_path / "run", oracle, NAMES)
    _assert_pure(seen, _run(tmp_path, _unused_branch, spelling, False, make))
