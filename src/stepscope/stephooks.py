"""Optimizer step hooks that fire once per ``optimizer.step()`` call, however it is written.

``torch.optim.Optimizer`` runs its step pre- and post-hooks from a wrapper it installs on the
``step`` of every optimizer class it constructs. An optimizer subclass whose own ``step`` calls
``super().step()`` therefore runs the hooks twice per call once the parent class has been
constructed too (``MyAdam.step`` and ``Adam.step`` are both wrapped): pre, pre, post, post. A
hook that ends a step or counts steps would see two. :class:`OuterStepHooks` passes on only the
outermost pair: a pre-hook that fires while the outermost call's wrapper frame is still on the
stack is nested, and so is its post-hook. An exception inside ``step()`` skips the post-hooks;
the next call then finds that frame gone from the stack and starts afresh. Frames are looked at
only for a class where nesting is possible (two classes of its MRO define a wrapped ``step``);
a plain ``torch.optim.Adam`` costs a walk of its MRO per call and holds no frame.

Once ``torch.compile`` is in use (``torch._dynamo`` is loaded: checked at registration and at
every eager call), the hooks are swapped for ``torch.compiler.disable``d ones: a compiled
``optimizer.step()`` graph-breaks around them and they read real tensors, never the fake ones of
a trace (a native kernel handed one crashed the process). ``torch._dynamo`` is not imported
here (half a second); in practice it is loaded already, since constructing a torch optimizer
loads it. Hooks traced before the swap (dynamo loaded after their last eager call) return at
once. Nested calls inside a compiled step are not told apart (its wrapper's frames are
dynamo's): the hooks then run at every level, as torch's own do.

A bottom-level module (it imports only torch) so that the collector
(:mod:`stepscope.collect.optimizer`) and the probe (:mod:`stepscope.probe.state`) share it.

Example
-------
>>> import torch
>>> class Stepper(torch.optim.SGD):
...     def step(self, closure=None):
...         return super().step(closure)
>>> _ = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)  # wraps SGD.step
>>> opt = Stepper([torch.zeros(1, requires_grad=True)], lr=0.1)
>>> seen = []
>>> hooks = OuterStepHooks(opt, post=lambda o, a, k: seen.append("step"))
>>> opt.step()
>>> seen
['step']
>>> hooks.remove()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

__all__ = ["OuterStepHooks", "StepHook", "user_stacklevel"]

#: ``hook(optimizer, args, kwargs)``, as torch calls step hooks. A pre-hook may return
#: ``(args, kwargs)`` to replace ``step``'s arguments (torch's rule; e.g. to wrap a closure), or
#: ``None``; a post-hook's return value is ignored.
StepHook = Callable[[torch.optim.Optimizer, tuple[Any, ...], dict[str, Any]], Any]


_DYNAMO = f"{os.sep}torch{os.sep}_dynamo{os.sep}"


def _step_frame() -> FrameType | None:
    """The frame that called the running hook: torch's step wrapper (past dynamo's own)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and _DYNAMO in frame.f_code.co_filename:
        frame = frame.f_back
    return frame


_OWN = (os.path.dirname(__file__), os.path.dirname(torch.__file__))


def user_stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel``, for its caller, of the first frame outside stepscope
    and torch: a warning from a step hook points at the user's ``optimizer.step()`` line (past
    torch's step wrapper, dynamo's and this module's)."""
    level, frame = 1, sys._getframe(1)  # level 1: warn's caller
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_OWN):
        level, frame = level + 1, frame.f_back
    return level


def _can_nest(cls: type) -> bool:
    """Whether ``cls.step`` may run torch's hooks more than once: two classes of its MRO each
    define a ``step`` that torch has wrapped (a subclass's and a constructed parent's)."""
    wrapped = 0
    for klass in cls.__mro__:
        if getattr(klass.__dict__.get("step"), "hooked", False):
            wrapped += 1
            if wrapped > 1:
                return True
    return False


def _on_stack(frame: FrameType, start: FrameType | None) -> bool:
    while start is not None:
        if start is frame:
            return True
        start = start.f_back
    return False


class OuterStepHooks:
    """``pre`` and ``post`` step hooks on ``optimizer`` that skip nested ``step()`` calls.

    Parameters
    ----------
    optimizer
        A constructed ``torch.optim.Optimizer``.
    pre, post
        Called as ``hook(optimizer, args, kwargs)`` before and after the outermost ``step()``;
        what ``pre`` returns is returned to torch (``(args, kwargs)`` replaces the arguments).
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        pre: StepHook | None = None,
        post: StepHook | None = None,
    ) -> None:
        self._pre_hook, self._post_hook = pre, post
        self._outer: FrameType | None = None  # the outermost call's wrapper frame while it runs
        self._nested = 0
        self._eager = False  # the hooks registered are dynamo-disabled ones
        self.handles = [
            optimizer.register_step_pre_hook(self._pre),
            optimizer.register_step_post_hook(self._post),
        ]
        self.ensure_eager()

    def ensure_eager(self) -> None:
        """With ``torch._dynamo`` loaded, make the registered hooks dynamo-disabled (in place:
        their order among the optimizer's hooks is kept). Cheap when there is nothing to do."""
        if self._eager or not self.handles or "torch._dynamo" not in sys.modules:
            return
        self._eager = True
        for handle, hook in zip(self.handles, (self._pre, self._post)):
            hooks = handle.hooks_dict_ref()
            if hooks is not None and handle.id in hooks:
                hooks[handle.id] = torch.compiler.disable(hook)

    def _pre(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if torch.compiler.is_compiling():  # traced before ensure_eager() could swap
            return None
        if not self._eager:
            self.ensure_eager()
        if _can_nest(type(optimizer)):  # else no frame is looked at, nor held
            caller = _step_frame()  # torch's step wrapper, running the hooks
            if self._outer is not None and caller is not None:
                if _on_stack(self._outer, caller.f_back):
                    self._nested += 1
                    return None
            self._outer = caller  # (replacing a stale frame: that call raised, no post-hook)
        self._nested = 0
        if self._pre_hook is not None:
            return self._pre_hook(optimizer, args, kwargs)  # (args, kwargs) replaces them
        return None

    def _post(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if torch.compiler.is_compiling():
            return
        if self._nested:
            self._nested -= 1
            return
        self._outer = None
        if self._post_hook is not None:
            self._post_hook(optimizer, args, kwargs)

    def remove(self) -> None:
        """Remove both hooks (idempotent)."""
        handles, self.handles = self.handles, []
        self._outer = None
        for h in handles:
            h.remove()
