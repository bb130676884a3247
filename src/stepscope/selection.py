"""Selecting modules ("sites") by type name, qualified-name glob, or predicate.

A selector is one of:

- a module type name, e.g. ``"Linear"`` (matches ``type(module).__name__``);
- a glob over qualified names, matched against the *whole* name (``"1"`` selects module ``1``,
  never ``10``; ``"encoder.*"`` selects the children of ``encoder``);
- a callable ``(qualified_name, module) -> bool``;
- a list of any of these (union).

The root module (qualified name ``""``) is never selected by a glob; a type name or a predicate
can select it (e.g. ``"Linear"`` on a bare ``nn.Linear``). An empty result refuses ``selection_empty`` before anything runs.

Example
-------
>>> import torch
>>> m = torch.nn.Sequential(*[torch.nn.Linear(2, 2) for _ in range(12)])
>>> [name for name, _ in select_modules(m, "1")]
['1']
>>> len(select_modules(m, "Linear"))
12
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence

import torch

from stepscope.errors import Refusal

Selector = str | Callable[[str, torch.nn.Module], bool] | Sequence["Selector"]


def _matcher(selector: Selector) -> Callable[[str, torch.nn.Module], bool]:
    if callable(selector) and not isinstance(selector, str):
        return selector  # type: ignore[return-value]
    if isinstance(selector, str):
        if not selector:
            raise Refusal(
                "selection_invalid",
                "an empty string selects nothing",
                ["name a module type or glob"],
            )
        pattern = re.compile(fnmatch.translate(selector))
        return lambda name, module: (
            type(module).__name__ == selector
            or (bool(name) and pattern.fullmatch(name) is not None)
        )
    if isinstance(selector, Sequence):
        parts = [_matcher(s) for s in selector]
        return lambda name, module: any(p(name, module) for p in parts)
    raise Refusal(
        "selection_invalid",
        f"unsupported selector {selector!r}",
        ["use a type name, a glob over qualified names, a predicate, or a list of these"],
    )


def select_modules(model: torch.nn.Module, selector: Selector) -> list[tuple[str, torch.nn.Module]]:
    """Return ``[(qualified_name, module), ...]`` in ``named_modules`` order.

    Raises
    ------
    Refusal
        ``selection_empty`` when nothing matches (listing a few available names);
        ``selection_invalid`` for an unsupported selector form.
    """
    match = _matcher(selector)
    chosen = [(name, mod) for name, mod in model.named_modules() if match(name, mod)]
    if not chosen:
        names = [n for n, _ in model.named_modules() if n][:8]
        types = sorted({type(m).__name__ for _, m in model.named_modules()})[:8]
        raise Refusal(
            "selection_empty",
            f"selection {selector!r} matched no module",
            [f"qualified names start with {names}", f"module types include {types}"],
        )
    return chosen
