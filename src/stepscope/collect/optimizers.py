"""Optimizer hooks: which rows an optimizer owns, and when its gradients are read.

* :func:`unwrap_optimizer` follows wrappers that expose the real optimizer as ``.optimizer``
  (accelerate's ``AcceleratedOptimizer``, which the Hugging Face ``Trainer`` uses) or
  ``._optimizer`` (Lightning's ``LightningOptimizer``) down to the ``torch.optim.Optimizer``
  whose step hooks fire; anything else refuses ``optimizer_unsupported``.
* :class:`OptimizerWatch` holds one optimizer's step hooks and the ``gradient``, ``parameter``
  and ``update`` rows of the parameters in its ``param_groups``. Each optimizer reduces only
  its own rows, so with two optimizers neither writes (fake, zero) updates of the other's
  parameters.
* Gradient timing. Without a closure, the pre-step hook reads the gradients: after the step's
  last backward, before the optimizer changes anything. With ``optimizer.step(closure)``
  (LBFGS, Lightning's automatic optimization) the backward runs *inside* the step, after the
  pre-step hook; the hook then arms post-accumulate-grad hooks on the owned parameters, each of
  which re-reads its gradient after every accumulation, so the row holds the gradient of the
  step's last backward (for LBFGS with several closure evaluations per step: the last one's).
  They are removed by the post-step hook.

Example
-------
>>> import torch
>>> inner = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
>>> class Wrapped:  # what accelerate / HF hand to a callback
...     def __init__(self, optimizer):
...         self.optimizer = optimizer
>>> unwrap_optimizer(Wrapped(inner)) is inner
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from stepscope.collect.sites import PARAM_STREAMS, Row
from stepscope.errors import Refusal
from stepscope.stephooks import OuterStepHooks

__all__ = ["OptimizerWatch", "closure_of", "unwrap_optimizer"]

_WRAPPER_ATTRS = ("optimizer", "_optimizer")


def _hookable(obj: Any) -> bool:
    # a constructed torch optimizer: its step is patched to run the registered step hooks
    return isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "_optimizer_step_pre_hooks")


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` whose step hooks fire for ``optimizer``.

    Wrappers are followed through ``.optimizer`` / ``._optimizer`` (several levels deep).

    Raises
    ------
    Refusal
        ``optimizer_unsupported`` when no hookable torch optimizer is found.
    """
    seen: set[int] = set()
    current = optimizer
    while id(current) not in seen:
        seen.add(id(current))
        inner = next(
            (
                getattr(current, a)
                for a in _WRAPPER_ATTRS
                if getattr(current, a, None) is not None and getattr(current, a) is not current
            ),
            None,
        )
        if inner is None:
            break
        current = inner
    if not _hookable(current):
        raise Refusal(
            "optimizer_unsupported",
            f"{type(optimizer).__name__} is not a torch.optim.Optimizer with step hooks and "
            "exposes none as .optimizer or ._optimizer.",
            [
                "pass the underlying torch.optim.Optimizer",
                "or a wrapper that exposes it as .optimizer",
            ],
        )
    return current


def closure_of(
    optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], Any] | None:
    """The closure passed to ``optimizer.step`` (positional or keyword), if any.

    A step hook's ``args`` start with the optimizer itself (``step``'s ``self``).
    """
    if args and args[0] is optimizer:
        args = args[1:]
    closure = args[0] if args else kwargs.get("closure")
    return closure if callable(closure) else None


class OptimizerWatch:
    """One optimizer's step hooks and the parameter rows it owns.

    Parameters
    ----------
    optimizer
        A hookable ``torch.optim.Optimizer`` (see :func:`unwrap_optimizer`).
    rows
        All rows of the collector; the ones of parameters in ``optimizer.param_groups`` are owned.
    on_pre, on_post
        Called as ``on_pre(watch, closure)`` and ``on_post(watch)`` from the step hooks.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        rows: Sequence[Row],
        on_pre: Callable[[OptimizerWatch, Callable[[], Any] | None], None],
        on_post: Callable[[OptimizerWatch], None],
    ) -> None:
        self.optimizer = optimizer
        self._all_rows = list(rows)
        self._owned_count = -1
        self.rows: dict[str, list[Row]] = {}
        self.param_ids: frozenset[int] = frozenset()  # ids of the parameters it steps
        self.refresh()
        self._grad_handles: list[Any] = []
        self.hooks = OuterStepHooks(  # once per step() call, also when it nests super().step()
            optimizer,
            pre=lambda o, a, k: on_pre(self, closure_of(o, a, k)),
            post=lambda _o, _a, _k: on_post(self),
        )

    def refresh(self) -> None:
        """Recompute ownership when the optimizer's parameter list changed (add_param_group)."""
        count = sum(len(g["params"]) for g in self.optimizer.param_groups)
        if count == self._owned_count:
            return
        self._owned_count = count
        owned = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        self.param_ids = frozenset(owned)
        self.rows = {
            s: [r for r in self._all_rows if r.stream == s and id(r.param) in owned]
            for s in PARAM_STREAMS
        }

    def invalidate(self) -> None:
        """Recompute ownership at the next :meth:`owned` (rows were rebound: model surgery)."""
        self._owned_count = -1

    def owned(self, stream: str) -> list[Row]:
        """This optimizer's rows of ``stream`` (``gradient``, ``parameter`` or ``update``)."""
        self.refresh()
        return self.rows[stream]

    def arm_gradient_hooks(self, on_grad: Callable[[Row, torch.Tensor], None]) -> None:
        """Read each owned gradient after every accumulation (a closure's backward)."""
        self.disarm_gradient_hooks()
        for row in self.owned("gradient"):
            param = row.param
            if param is not None and param.requires_grad:
                self._grad_handles.append(
                    param.register_post_accumulate_grad_hook(
                        lambda p, row=row: on_grad(row, p.grad) if p.grad is not None else None
                    )
                )

    def disarm_gradient_hooks(self) -> None:
        """Remove the closure's gradient hooks (idempotent)."""
        handles, self._grad_handles = self._grad_handles, []
        for h in handles:
            h.remove()

    def remove(self) -> None:
        """Remove every hook of this watch (idempotent)."""
        try:
            self.disarm_gradient_hooks()
        finally:
            self.hooks.remove()
