"""``OuterStepHooks``: once per ``optimizer.step()`` call, whatever nests inside it.

The independent witness is a plain hook registered next to it, which torch runs at every
level of nesting.
"""

from __future__ import annotations

import pytest
import torch

from stepscope.stephooks import OuterStepHooks


class Nested(torch.optim.SGD):
    """``step`` calls the parent's (wrapped by torch as well): pre, pre, post, post."""

    fail_at: int | None = None

    def step(self, closure=None):  # type: ignore[override]
        out = super().step(closure)
        if self.state.get("calls", 0) == self.fail_at:
            self.state["calls"] = self.state.get("calls", 0) + 1
            raise RuntimeError("step failed after the parent's step")
        self.state["calls"] = self.state.get("calls", 0) + 1
        return out


class TwiceNested(Nested):
    def step(self, closure=None):  # type: ignore[override]
        return super().step(closure)


def _setup(cls):
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # SGD.step is wrapped
    cls([torch.zeros(1, requires_grad=True)], lr=0.1)  # and so is each subclass's
    p = torch.ones(3, requires_grad=True)
    opt = cls([p], lr=0.1)
    calls: list[str] = []
    plain: list[str] = []
    opt.register_step_pre_hook(lambda *_: plain.append("pre"))
    hooks = OuterStepHooks(
        opt, pre=lambda o, a, k: calls.append("pre"), post=lambda o, a, k: calls.append("post")
    )
    return p, opt, calls, plain, hooks


@pytest.mark.parametrize("cls, depth", [(torch.optim.SGD, 1), (Nested, 2), (TwiceNested, 3)])
def test_one_pre_and_one_post_per_call_at_any_depth(cls, depth):
    p, opt, calls, plain, hooks = _setup(cls)
    for _ in range(3):
        p.grad = torch.ones(3)
        opt.step()
    assert len(plain) == 3 * depth  # torch ran the hooks once per level
    assert calls == ["pre", "post"] * 3
    hooks.remove()
    hooks.remove()  # idempotent
    opt.step()
    assert calls == ["pre", "post"] * 3 and len(plain) == 4 * depth


def test_a_step_that_raised_does_not_swallow_the_next_one():
    p, opt, calls, plain, _hooks = _setup(Nested)
    opt.fail_at = 1
    p.grad = torch.ones(3)
    opt.step()
    with pytest.raises(RuntimeError, match="step failed"):
        opt.step()  # the outer post-hooks never run
    assert calls == ["pre", "post", "pre"]
    opt.step()
    opt.step()
    assert calls == ["pre", "post", "pre", "pre", "post", "pre", "post"]
    assert len(plain) == 2 * 4  # torch ran both levels' pre-hooks every time


def test_the_closure_and_arguments_reach_the_hooks():
    p = torch.ones(3, requires_grad=True)
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    opt = Nested([p], lr=0.1)
    seen = []
    hooks = OuterStepHooks(opt, pre=lambda o, a, k: seen.append((o, a, k)))

    def closure():
        opt.zero_grad()
        loss = p.sum()
        loss.backward()
        return loss

    opt.step(closure)
    hooks.remove()
    ((o, args, kwargs),) = seen
    assert (
        o is opt and args[0] is opt and (args[1:] == (closure,) or kwargs == {"closure": closure})
    )


@pytest.mark.parametrize("cls, holds", [(torch.optim.SGD, False), (Nested, True)])
def test_a_frame_is_held_only_where_nesting_is_possible(cls, holds):
    p, opt, _calls, _plain, hooks = _setup(cls)
    during = []
    opt.register_step_pre_hook(lambda *_: during.append(hooks._outer is not None))
    p.grad = torch.ones(3)
    opt.step()
    assert during and set(during) == {holds}
    assert hooks._outer is None  # and none is kept after the call
