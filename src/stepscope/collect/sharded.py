"""Sharded tensors (FSDP2 / DTensor): reduce the local shard, count every logical element once.

A ``DTensor`` parameter (``torch.distributed.fsdp.fully_shard`` makes every parameter one) is a
logical tensor whose elements live on several ranks. Each rank reduces **its local shard**
(:func:`local_part`), so the rank segments merged by ``stepscope merge`` (or live, see
:mod:`stepscope.collect.livemerge`) hold the statistics of the full logical parameter: counts
add exactly, ``min``/``max`` merge exactly and ``mean``/``m2`` by Chan's formulas.

Placements
----------
* ``Shard(d)``: the local shard is reduced as it is (an uneven or empty shard is fine).
* ``Replicate()``: the same values live on every rank of that mesh dimension; only the rank
  with coordinate 0 along it reduces them, the others reduce an empty slice (counts 0, no
  moments), so a merge counts each logical element once.
* ``Partial()``: the local tensor is an unreduced summand, not a value:
  ``unsupported:dtensor_partial``.
* Any other tensor subclass (fake tensors, ...) stays ``unsupported:tensor_subclass:<type>``.

The update sample is drawn over the **logical** parameter's flat indices
(:func:`~stepscope.collect.sites.update_indices` on the logical ``numel``); a shard samples the
indices it owns (:func:`local_sample_index`), so the merged sample is the same whatever the
world size.

Example
-------
>>> import torch
>>> local_part(torch.ones(3))[0].shape, is_sharded(torch.ones(3))
(torch.Size([3]), False)
>>> owned_flat_indices(torch.tensor([0, 5, 7, 11]), (4, 3), (1, 0), (2, 3)).tolist()
[[1, 2], [2, 4]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

try:  # torch.distributed may be absent from a build
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
except ImportError:  # pragma: no cover - CPU builds without distributed
    DTensor = None  # type: ignore[assignment,misc]
    compute_local_shape_and_global_offset = None  # type: ignore[assignment]

__all__ = ["is_sharded", "local_part", "local_sample_index", "owned_flat_indices"]


def is_sharded(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``DTensor`` (its values live on several ranks)."""
    return DTensor is not None and isinstance(t, DTensor)


def _duplicate_replica(t: Any) -> bool:  # a DTensor (its class is optional at import)
    """True on a rank whose copy another rank also holds (coordinate != 0 on a Replicate dim)."""
    coords = t.device_mesh.get_coordinate()
    if coords is None:  # this rank is not in the mesh: it owns nothing
        return True
    return any(p.is_replicate() and c != 0 for p, c in zip(t.placements, coords))


def local_part(t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """``(plain tensor this rank reduces, None)`` or ``(None, unsupported reason)``.

    A plain tensor is returned as it is; a ``DTensor`` gives its local shard (an empty slice on
    a duplicate replica; see the module docstring).
    """
    if type(t) is torch.Tensor:
        return t, None
    if not is_sharded(t):
        return None, f"tensor_subclass:{type(t).__name__}"
    dt: Any = t  # a DTensor
    if any(p.is_partial() for p in dt.placements):
        return None, "dtensor_partial"
    local = dt.to_local().detach()
    if _duplicate_replica(dt):
        local = local.reshape(-1)[:0]
    return local, None


def owned_flat_indices(
    logical: torch.Tensor,
    global_shape: Sequence[int],
    global_offset: Sequence[int],
    local_shape: Sequence[int],
) -> torch.Tensor:
    """The logical flat indices a shard owns, as ``[[position in logical], [local flat index]]``.

    Parameters
    ----------
    logical
        Sorted flat indices into the logical (global) tensor (int64, 1-D).
    global_shape
        Shape of the logical tensor.
    global_offset, local_shape
        Where the shard starts in every dimension and its shape (a box of the logical tensor).

    Returns
    -------
    torch.Tensor
        ``[2, m]`` int64: row 0 the positions in ``logical`` that fall in the shard, row 1 the
        matching flat indices into the (contiguous) local shard.
    """
    strides = _row_major_strides(local_shape)
    rem = logical.clone()
    local_flat = torch.zeros_like(logical)
    inside = torch.ones_like(logical, dtype=torch.bool)
    dims = list(zip(global_shape, global_offset, local_shape, strides))
    for size, off, lsize, stride in reversed(dims):  # peel the last dimension first
        coord = rem % size
        rem = rem // size
        inside &= (coord >= off) & (coord < off + lsize)
        local_flat += (coord - off) * stride
    pos = torch.nonzero(inside).reshape(-1)
    return torch.stack([pos, local_flat[pos]])


def _row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(list(shape)):
        strides.append(acc)
        acc *= int(s)
    return list(reversed(strides))


def local_sample_index(param: Any, logical: torch.Tensor | None) -> torch.Tensor | None:
    """Flat indices into this rank's local shard of the sampled logical indices it owns.

    ``logical`` is the row's sorted logical sample (``None``: the whole parameter, which on a
    shard means the whole local shard). A plain tensor keeps ``logical`` unchanged; a duplicate
    replica owns nothing (an empty index).
    """
    if not is_sharded(param):
        return logical
    if _duplicate_replica(param):
        return torch.zeros(0, dtype=torch.int64, device=param.to_local().device)
    if logical is None:
        return None
    local_shape, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    owned = owned_flat_indices(logical.cpu(), tuple(param.shape), offset, local_shape)
    return owned[1].to(param.to_local().device)
