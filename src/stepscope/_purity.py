"""Shared helpers that keep observation pure: RNG snapshots, model-state guards, float64 copies.

Every feature that runs a model on the side (the probe, curvature analyses, dataset-mode
aggregation) wraps its work in :func:`preserved_state` so that training modes, ``.grad`` buffers,
``requires_grad`` flags and every RNG state are exactly what they were before, on every exit path.

Example
-------
>>> import torch
>>> from stepscope._purity import preserved_state
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Dropout(0.5)).train()
>>> with preserved_state(model):
...     _ = model.eval()(torch.randn(4, 3))
>>> model.training
True
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class RngSnapshot:
    """The state of every random generator stepscope could touch."""

    torch_cpu: torch.Tensor
    torch_cuda: tuple[torch.Tensor, ...]
    numpy: dict[str, Any]  # ``get_state(legacy=False)``: any global bit generator, not only MT19937
    python: tuple[Any, ...]

    def equals(self, other: RngSnapshot) -> bool:
        """Bitwise comparison of two snapshots."""
        return (
            torch.equal(self.torch_cpu, other.torch_cpu)
            and len(self.torch_cuda) == len(other.torch_cuda)
            and all(torch.equal(a, b) for a, b in zip(self.torch_cuda, other.torch_cuda))
            and _np_state_equal(self.numpy, other.numpy)
            and self.python == other.python
        )


def _np_state_equal(a: object, b: object) -> bool:
    """Bitwise equality of two numpy RNG states (nested dicts of names, ints, floats, arrays)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_np_state_equal(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def snapshot_rng() -> RngSnapshot:
    """Capture the CPU, CUDA (all devices, if initialised), numpy and Python RNG states."""
    cuda: tuple[torch.Tensor, ...] = ()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = tuple(torch.cuda.get_rng_state_all())
    return RngSnapshot(
        torch_cpu=torch.get_rng_state(),
        torch_cuda=cuda,
        numpy=np.random.get_state(legacy=False),  # noqa: NPY002 - the global state users seed
        python=random.getstate(),
    )


def restore_rng(snapshot: RngSnapshot) -> None:
    """Restore every RNG state captured by :func:`snapshot_rng`."""
    torch.set_rng_state(snapshot.torch_cpu)
    if snapshot.torch_cuda:
        torch.cuda.set_rng_state_all(list(snapshot.torch_cuda))
    np.random.set_state(snapshot.numpy)  # noqa: NPY002
    random.setstate(snapshot.python)


@contextmanager
def preserved_state(model: torch.nn.Module, *, restore_grads: bool = True) -> Iterator[None]:
    """Run a block on ``model`` and restore its observable state afterwards, on every exit path.

    Restored: each submodule's ``training`` flag, each parameter's ``requires_grad`` and ``.grad``
    (the same tensor object, with its values), and every RNG state (:func:`snapshot_rng`).
    Parameters and buffers are *not* restored: code inside must not write them (tests check that).

    Parameters
    ----------
    model
        The module whose state is guarded.
    restore_grads
        Put back the original ``.grad`` tensors (object identity and values).
    """
    modes = [(m, m.training) for m in model.modules()]
    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    grads = [p.grad for p in params]
    grad_values = (
        [None if g is None else g.detach().clone() for g in grads] if restore_grads else []
    )
    rng = snapshot_rng()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
        if restore_grads:
            with torch.no_grad():
                for p, g, v in zip(params, grads, grad_values):
                    if g is not None and v is not None:
                        g.copy_(v)
                    p.grad = g
        restore_rng(rng)


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of ``model`` in float64 (the original is untouched), with ``.grad`` cleared."""
    clone = copy.deepcopy(model).to(torch.float64)
    for p in clone.parameters():
        p.grad = None
    return clone
