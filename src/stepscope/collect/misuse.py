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

import contextlib
import sys
import warnings
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.stephooks import _OWN

__all__ = ["MisuseGuard", "MisuseWarning"]


class MisuseWarning(UserWarning):
    """A collector was used in a way that records less than the user probably meant."""


#: Frames a misuse warning looks past: stepscope's, torch's and ``contextlib``'s (where a
#: ``step()`` is entered through an ``ExitStack`` or a ``@contextmanager`` wrapper), as
#: :func:`stepscope.stephooks.user_stacklevel` does for the first two.
_SKIP = (*_OWN, contextlib.__file__)


def _stacklevel() -> int:
    """``warnings.warn``'s ``stacklevel``, for its caller, of the user's line."""
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_SKIP):
        level, frame = level + 1, frame.f_back
    return level


def _grad_versions(model: torch.nn.Module) -> dict[int, tuple[int, int]]:
    """Each parameter's gradient identity and in-place version (a backward changes one)."""
    return {id(p): (id(p.grad), p.grad._version) for p in model.parameters() if p.grad is not None}


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
        self._grads = _grad_versions(model)  # a backward after this is training

    def warn_once(self, key: str, message: str) -> None:
        """Warn ``message`` as a :class:`MisuseWarning` unless ``key`` was warned already."""
        if key in self._warned:
            return
        self._warned.add(key)
        warnings.warn(message, MisuseWarning, stacklevel=_stacklevel())

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
            if groups is None or self._seen(opt):
                continue
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

    def _seen(self, opt: Any) -> bool:
        try:
            return opt in self._checked
        except TypeError:  # not weak-referenceable: checked every time (cheap)
            return False

    def log_after_close(self, name: str, step: int) -> None:
        """``st.log(name, ...)`` after the ``with collector.step(...)`` block of ``step`` ended."""
        self.warn_once(
            "log_after_close",
            f"st.log({name!r}, ...) was called after its step ({step}) closed; the value is "
            f"recorded at step {step}. Call st.log() inside the `with collector.step(...) as st:` "
            f"block, or collector.log({name!r}, value, step={step}) to say so.",
        )

    def at_close(self, steps_recorded: int) -> None:
        """At close: the model trained (a backward changed a gradient) but no step was recorded."""
        if steps_recorded or _grad_versions(self._model) == self._grads:
            return
        self.warn_once(
            "no_steps",
            "the collector closed with 0 steps recorded, yet the model trained (its gradients "
            "changed): wrap each training step in "
            "`with collector.step(optimizer, examples=n):`, or pass optimizer= to "
            "HistoryCollector to record every optimizer.step()",
        )
