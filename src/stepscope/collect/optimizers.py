"""Optimizer hooks: which rows an optimizer owns, and when its gradients are read.

* :func:`unwrap_optimizer` follows wrappers that expose the real optimizer as ``.optimizer``
  (accelerate's ``AcceleratedOptimizer``, which the Hugging Face ``Trainer`` uses) or
  ``._optimizer`` (Lightning's ``LightningOptimizer``) down to the ``torch.optim.Optimizer``
  whose step hooks fire; anything else refuses ``optimizer_unsupported``.
* :class:`OptimizerWatch` holds one optimizer's step hooks and the ``gradient``, ``parameter``
  and ``update`` rows of the parameters in its ``param_groups``. Each optimizer reduces only
  its own rows, so with two optimizers neither writes (fake, zero) updates of the other's
  parameters.
* Gradient timing: the rows hold the ``.grad`` the optimizer consumes. Without a closure, the
  pre-step hook reads them (after the step's last backward and any clipping or unscaling done
  before ``step()``). With ``optimizer.step(closure)`` (LBFGS, Lightning's automatic and manual
  optimization, whose precision plugin wraps the user's closure with its clipping) the backward,
  clipping and unscaling run *inside* the step: the pre-step hook hands torch the closure
  wrapped by :func:`read_after`, which reads the gradients right after the closure returns and
  before the optimizer reads ``.grad`` (for LBFGS with several closure evaluations per step:
  each evaluation replaces the rows, the last one's stays).

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

from stepscope.collect.sites import PARAM_STREAMS, SiteRow
from stepscope.errors import Refusal
from stepscope.stephooks import OuterStepHooks

__all__ = ["OptimizerWatch", "closure_of", "read_after", "unwrap_optimizer", "with_closure"]

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


def with_closure(
    optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any], closure: Callable[[], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``step``'s ``(args, kwargs)`` with its closure (as :func:`closure_of` found it) replaced.

    >>> opt, old, new = object(), (lambda: 1), (lambda: 2)
    >>> with_closure(opt, (opt, old), {}, new)[0][1] is new
    True
    >>> with_closure(opt, (opt,), {"closure": old}, new)[1]["closure"] is new
    True
    """
    lead = 1 if args and args[0] is optimizer else 0
    if len(args) > lead:
        return (*args[:lead], closure, *args[lead + 1 :]), kwargs
    return args, {**kwargs, "closure": closure}


def read_after(closure: Callable[[], Any], read: Callable[[], None]) -> Callable[[], Any]:
    """``closure`` followed by ``read()``: what the optimizer calls instead of ``closure``.

    The closure's result is returned unchanged; ``read`` must never raise (the collector's
    telemetry guard is inside it).

    >>> seen = []
    >>> wrapped = read_after(lambda: seen.append("backward") or 1.5, lambda: seen.append("read"))
    >>> wrapped(), seen
    (1.5, ['backward', 'read'])
    """

    def closure_then_read() -> Any:
        result = closure()
        read()
        return result

    return closure_then_read


class OptimizerWatch:
    """One optimizer's step hooks and the parameter rows it owns.

    Parameters
    ----------
    optimizer
        A hookable ``torch.optim.Optimizer`` (see :func:`unwrap_optimizer`).
    rows
        All rows of the collector; the ones of parameters in ``optimizer.param_groups`` are owned.
    on_pre, on_post
        Called as ``on_pre(watch, closure)`` and ``on_post(watch)`` from the step hooks;
        ``on_pre`` may return a closure to run in place of the step's own (see
        :func:`read_after`), or ``None``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        rows: Sequence[SiteRow],
        on_pre: Callable[[OptimizerWatch, Callable[[], Any] | None], Callable[[], Any] | None],
        on_post: Callable[[OptimizerWatch], None],
    ) -> None:
        self.optimizer = optimizer
        self._all_rows = list(rows)
        self._owned_count = -1
        self.rows: dict[str, list[SiteRow]] = {}
        self.param_ids: frozenset[int] = frozenset()  # ids of the parameters it steps
        self.refresh()
        self._on_pre = on_pre
        self.hooks = OuterStepHooks(  # once per step() call, also when it nests super().step()
            optimizer, pre=self._pre, post=lambda _o, _a, _k: on_post(self)
        )

    def _pre(
        self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        closure = closure_of(optimizer, args, kwargs)
        replacement = self._on_pre(self, closure)
        if replacement is None or closure is None:
            return None
        return with_closure(optimizer, args, kwargs, replacement)

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

    def owned(self, stream: str) -> list[SiteRow]:
        """This optimizer's rows of ``stream`` (``gradient``, ``parameter`` or ``update``)."""
        self.refresh()
        return self.rows[stream]

    def remove(self) -> None:
        """Remove every hook of this watch (idempotent)."""
        self.hooks.remove()
