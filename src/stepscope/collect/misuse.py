"""Misuse is never silent: the collector's warnings (once each) and refusals for common mistakes.

Each mistake below once recorded nothing, or something wrong, without a word. Now:

* training without ``with collector.step(optimizer):`` (forwards and backwards ran, 0 steps
  recorded) warns when the collector closes;
* ``st.log(...)`` after its ``with`` block ended warns, and the value is kept at its own step
  (it no longer lands on the next step, or nowhere);
* ``collector.step()`` with no optimizer while the ``update`` stream is watched warns (the update
  rows are then ``unsupported``: there is no optimizer step to read);
* ``collector.step(opt)`` with an optimizer holding none of the model's parameters refuses
  ``optimizer_foreign`` (its steps would be recorded as the model's, ``applied=no``).

Warnings are :class:`MisuseWarning` (a :class:`UserWarning`, so ``-W error::UserWarning`` and
``warnings.simplefilter`` treat it as usual), raised once per collector and mistake, at the user's
line (:func:`stepscope.stephooks.user_stacklevel`).

Example
-------
>>> import warnings, torch, stepscope as ss
>>> model = torch.nn.Linear(3, 1)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with warnings.catch_warnings(record=True) as seen:
...     warnings.simplefilter("always")
...     with ss.HistoryCollector(model, settings=ss.WatchSettings(in_memory=True)) as c:
...         model(torch.randn(4, 3)).sum().backward(); opt.step()  # no `with c.step(opt):`
>>> print(seen[0].message)  # doctest: +ELLIPSIS
the collector closed with 0 steps recorded, yet the model trained ...
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.stephooks import user_stacklevel

__all__ = ["MisuseGuard", "MisuseWarning"]


class MisuseWarning(UserWarning):
    """A collector was used in a way that records less than the user probably meant."""


def _unwrap(optimizer: Any) -> Any:
    """The torch optimizer inside a wrapper exposing ``.optimizer`` (accelerate, HF)."""
    seen = 0
    while not hasattr(optimizer, "param_groups") and hasattr(optimizer, "optimizer"):
        optimizer, seen = optimizer.optimizer, seen + 1
        if seen > 8:
            break
    return optimizer


class MisuseGuard:
    """The misuse checks of one collector (each warning at most once)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model
        self._warned: set[str] = set()
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()

    def warn_once(self, key: str, message: str) -> None:
        """Warn ``message`` as a :class:`MisuseWarning` unless ``key`` was warned already."""
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(message, MisuseWarning, stacklevel=user_stacklevel())

    def check_optimizers(self, optimizers: Iterable[Any], streams: Iterable[str]) -> None:
        """At ``collector.step(...)``: refuse a foreign optimizer, warn when there is none."""
        opts = list(optimizers)
        if not opts and "update" in streams:
            self.warn_once(
                "no_optimizer",
                "collector.step() was given no optimizer, so the update stream records nothing "
                "(its rows are 'unsupported'); pass it: `with collector.step(optimizer):`",
            )
        for given in opts:
            opt = _unwrap(given)
            groups = getattr(opt, "param_groups", None)
            try:
                if groups is None or opt in self._checked:
                    continue
            except TypeError:  # not weak-referenceable: checked every time (cheap)
                pass
            held = {id(p) for g in groups for p in g.get("params", ())}
            if held and not held & {id(p) for p in self._model.parameters()}:
                raise Refusal(
                    "optimizer_foreign",
                    f"collector.step() was given a {type(opt).__name__} that holds none of the "
                    f"watched model's parameters ({len(held)} others); its steps would be "
                    "recorded as the model's.",
                    [
                        "pass the optimizer built from the watched model: "
                        "`opt = torch.optim.SGD(model.parameters(), lr=...)`, then "
                        "`with collector.step(opt):`",
                        "or watch the model that optimizer trains: ss.HistoryCollector(that_model)",
                    ],
                )
            try:
                self._checked.add(opt)
            except TypeError:
                pass

    def log_after_close(self, name: str, step: int) -> None:
        """``st.log(name, ...)`` after the ``with collector.step(...)`` block of ``step`` ended."""
        self.warn_once(
            "log_after_close",
            f"st.log({name!r}, ...) was called after its step ({step}) closed; the value is "
            f"recorded at step {step}. Call st.log() inside the `with collector.step(...) as st:` "
            f"block, or collector.log({name!r}, value, step={step}) to say so.",
        )

    def at_close(self, steps_recorded: int, hook_calls: int) -> None:
        """At close: the model trained (hooks ran or gradients exist) but no step was recorded."""
        if steps_recorded:
            return
        grads = any(p.grad is not None for p in self._model.parameters())
        if not (hook_calls or grads):
            return
        self.warn_once(
            "no_steps",
            "the collector closed with 0 steps recorded, yet the model trained (forwards or "
            "gradients were seen): wrap each training step in "
            "`with collector.step(optimizer, examples=n):`, or pass optimizer= to "
            "HistoryCollector to record every optimizer.step()",
        )
