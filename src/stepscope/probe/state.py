"""Parameter snapshots: displacement from init, delta since a snapshot, and true one-step updates.

Three different quantities, never substituted for one another:

- ``displacement_from_init`` = ``||W_t - W_init||`` against a snapshot taken at initialisation;
- ``delta_since_snapshot`` = ``||W_t - W_s||`` against the snapshot taken at optimizer step ``s``
  (by default, the previous probe measurement), with ``start_step=s``, ``end_step=t`` and
  ``interval_steps=t-s`` - a net change over an interval, not a per-step update or path length;
- ``update`` = ``||W_after - W_before||`` across exactly one optimizer step, measured by
  snapshotting before that step and subtracting afterwards (momentum, weight decay and any
  shrinkage included). ``-lr * grad`` is never reported as an update.

Each snapshot discloses its memory cost in bytes (``nbytes``).

Example
-------
>>> import torch
>>> lin = torch.nn.Linear(2, 2)
>>> snap = take_snapshot({"w": lin.weight}, optimizer_step=0)
>>> with torch.no_grad():
...     _ = lin.weight.add_(1.0)
>>> round(distances({"w": lin.weight}, snap)["w"], 6)
2.0
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.stephooks import OuterStepHooks


@dataclass(frozen=True)
class ParamSnapshot:
    """Detached copies of parameters at one optimizer step.

    Attributes
    ----------
    optimizer_step
        The optimizer step count at which the copy was taken.
    tensors
        Parameter qualified name -> detached clone (same device and dtype).
    nbytes
        Memory held by the copies, in bytes.
    """

    optimizer_step: int
    tensors: dict[str, torch.Tensor]
    nbytes: int


def take_snapshot(params: Mapping[str, torch.Tensor], optimizer_step: int) -> ParamSnapshot:
    """Copy ``params`` (no autograd, no RNG) and record the memory it costs."""
    with torch.no_grad():
        tensors = {name: p.detach().clone() for name, p in params.items()}
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    return ParamSnapshot(int(optimizer_step), tensors, int(nbytes))


def refresh_snapshot(
    old: ParamSnapshot | None, params: Mapping[str, torch.Tensor], optimizer_step: int
) -> ParamSnapshot:
    """Like :func:`take_snapshot`, but copy into ``old``'s tensors when the layout matches.

    Saves a fresh allocation per measurement; ``old`` must be owned by the caller (it changes).
    """
    if (
        old is None
        or old.tensors.keys() != params.keys()
        or any(
            old.tensors[k].shape != p.shape
            or old.tensors[k].dtype != p.dtype
            or old.tensors[k].device != p.device
            for k, p in params.items()
        )
    ):
        return take_snapshot(params, optimizer_step)
    with torch.no_grad():
        for name, p in params.items():
            old.tensors[name].copy_(p.detach())
    return ParamSnapshot(int(optimizer_step), old.tensors, old.nbytes)


def distances(params: Mapping[str, torch.Tensor], snapshot: ParamSnapshot) -> dict[str, float]:
    """``||p - snapshot[p]||_2`` (Frobenius) for every parameter present in the snapshot."""
    out: dict[str, float] = {}
    with torch.no_grad():
        for name, p in params.items():
            ref = snapshot.tensors.get(name)
            if ref is not None and ref.shape == p.shape:
                out[name] = float(torch.dist(p.detach(), ref))  # no temporary, unlike norm(p - ref)
    return out


@dataclass(frozen=True)
class StepUpdate:
    """The measured parameter change across exactly one optimizer step.

    Attributes
    ----------
    optimizer_step_before, optimizer_step_after
        The step count before and after (``after = before + 1``).
    update_norm
        Parameter name -> ``||W_after - W_before||``.
    param_norm_before
        Parameter name -> ``||W_before||`` (the denominator of ``update_ratio``).
    snapshot_nbytes
        Memory the before-snapshot held while the step ran.
    steps_verified
        True when an optimizer was given and exactly one ``step()`` call was observed.
    """

    optimizer_step_before: int
    optimizer_step_after: int
    update_norm: dict[str, float]
    param_norm_before: dict[str, float]
    snapshot_nbytes: int
    steps_verified: bool


@dataclass
class UpdateCapture:
    """Yielded by :func:`capture_update`; ``result`` is filled when the block exits normally."""

    optimizer_step: int
    snapshot_nbytes: int
    result: StepUpdate | None = None
    _count: list[int] = field(default_factory=lambda: [0])


@contextmanager
def capture_update(
    params: Mapping[str, torch.Tensor],
    optimizer_step: int,
    optimizer: torch.optim.Optimizer | None = None,
) -> Iterator[UpdateCapture]:
    """Snapshot ``params``, run the block (one optimizer step), and subtract afterwards.

    Parameters
    ----------
    params
        The parameters to watch, by qualified name.
    optimizer_step
        The step count before the step (declared before it runs).
    optimizer
        If given, a step post-hook counts ``step()`` calls (removed on every exit path) and any
        count other than one refuses ``probe_update_steps_invalid``.
    """
    snapshot = take_snapshot(params, optimizer_step)
    capture = UpdateCapture(int(optimizer_step), snapshot.nbytes)
    hooks = None
    if optimizer is not None:  # one count per step() call, also when it nests super().step()

        def _count(*_args: object) -> None:
            capture._count[0] += 1

        hooks = OuterStepHooks(optimizer, post=_count)
    try:
        yield capture
    finally:
        if hooks is not None:
            hooks.remove()
    if optimizer is not None and capture._count[0] != 1:
        raise Refusal(
            "probe_update_steps_invalid",
            f"around_step saw {capture._count[0]} optimizer steps; an update is exactly one",
            ["call optimizer.step() exactly once inside the block"],
        )
    with torch.no_grad():
        before = {name: float(torch.linalg.vector_norm(t)) for name, t in snapshot.tensors.items()}
    capture.result = StepUpdate(
        optimizer_step_before=int(optimizer_step),
        optimizer_step_after=int(optimizer_step) + 1,
        update_norm=distances(params, snapshot),
        param_norm_before=before,
        snapshot_nbytes=snapshot.nbytes,
        steps_verified=optimizer is not None,
    )


def state_versions(model: torch.nn.Module) -> list[Any]:
    """Parameter, buffer and ``.grad`` versions plus ``.grad`` identities: any write shows."""
    params = list(model.parameters())
    grads = [(id(p.grad), p.grad._version) if p.grad is not None else None for p in params]
    return [t._version for t in params] + [t._version for t in model.buffers()] + grads
