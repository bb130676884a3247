"""Which modules compute below the analysis dtype (HF float32 internals inside a float64 model).

``analyze_curvature`` runs a float64 copy of the model, but a module may still cast inside its
forward (HF ``LlamaRMSNorm`` normalises in float32, eager attention may softmax in float32): the
factors and derivatives through it are then only float32-accurate (about 4e-8 relative). While
the analysis forward runs, a :class:`torch.overrides.TorchFunctionMode` notes every floating
result of lower precision than the reference dtype and the innermost module that produced it;
the result is recorded, never hidden (``metadata["lower_precision_internals"]``,
``metadata["derivative_dtype"] = "mixed"``).

Example
-------
>>> import torch
>>> class Cast(torch.nn.Module):
...     def forward(self, x):
...         return x.float().double()
>>> model = torch.nn.Sequential(torch.nn.Linear(2, 2), Cast()).double()
>>> with watch_precision(model, torch.float64) as lowered:
...     _ = model(torch.ones(1, 2, dtype=torch.float64))
>>> lowered
{'1': ['float32']}
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode


class _Watch(TorchFunctionMode):
    def __init__(self, reference: torch.dtype) -> None:
        super().__init__()
        self.bits = torch.finfo(reference).bits
        self.stack: list[str] = []
        self.found: dict[str, set[str]] = {}

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None):
        out = func(*args, **(kwargs or {}))
        if (
            self.stack
            and isinstance(out, Tensor)
            and out.is_floating_point()
            and torch.finfo(out.dtype).bits < self.bits
        ):
            name = str(out.dtype).removeprefix("torch.")
            self.found.setdefault(self.stack[-1], set()).add(name)
        return out


@contextmanager
def watch_precision(model: nn.Module, reference: torch.dtype) -> Iterator[dict[str, list[str]]]:
    """Yield ``module name -> lower-precision dtypes`` its forward produced (filled on exit)."""
    watch = _Watch(reference)
    result: dict[str, list[str]] = {}
    handles = []

    def enter(name: str) -> Any:
        def hook(*_: Any) -> None:
            watch.stack.append(name)

        return hook

    def leave(*_: Any) -> None:  # returns None: the module's output is left as it is
        watch.stack.pop()

    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter(name)))
        handles.append(module.register_forward_hook(leave))
    try:
        with watch:
            yield result
    finally:
        for handle in handles:
            handle.remove()
        result.update({k: sorted(v) for k, v in watch.found.items()})


__all__ = ["watch_precision"]
