"""Fixed samples of many CPU tensors in preallocated buffers: one C call for all of them.

The update stream samples every parameter at the same flat indices before and after each
optimizer step. :class:`SampleGather` lays those samples out once (one float32 and one float64
buffer, each tensor's sample a contiguous slice) and fills them with a single call of
``stepscope_gather_many`` (``_kernels.c``): ``gather(subtract=False)`` copies the samples,
``gather(subtract=True)`` replaces each by ``sample_now - sample_then``, rounded once in the
tensor's dtype (bit for bit ``after.index_select(0, idx).sub_(before)``). float64 tensors stay
float64: a float32 copy would round a small ``after - before`` away.

Only plain, contiguous CPU float32/float64 tensors qualify (:func:`gatherable`); every index is
checked against its tensor's size when the plan is built, and :meth:`SampleGather.bind` re-reads
the storage addresses before each call (an optimizer writes in place, but ``load_state_dict`` or
``.to()`` may swap a tensor's storage) and refuses a tensor at a new address whose dtype, device,
layout or size no longer matches, so the kernel never reads outside a tensor's memory.

Example
-------
>>> import torch
>>> from stepscope.stats import _native
>>> w, b = torch.arange(10.0), torch.tensor([1.0, 2.0], dtype=torch.float64)
>>> plan = SampleGather([w, b], [torch.tensor([7, 2]), None], _native.loaded())
>>> plan.bind([w, b]) and plan.gather(subtract=False)
>>> _ = w.add_(0.5), b.mul_(3)
>>> plan.bind([w, b]) and plan.gather(subtract=True)
>>> [s.tolist() for s in plan.samples]  # after - before
[[0.5, 0.5], [2.0, 4.0]]
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["SampleGather", "gatherable"]

_KIND = {torch.float32: 0, torch.float64: 1}


def gatherable(t: torch.Tensor) -> bool:
    """Whether ``t`` is a plain, contiguous, strided CPU float32/float64 tensor (or parameter).

    Tensor subclasses (``DTensor``, fake tensors) are not: their storage is not their values.
    """
    return (
        (type(t) is torch.nn.Parameter or type(t) is torch.Tensor)
        and t.dtype in _KIND
        and t.is_cpu
        and t.layout is torch.strided
        and t.is_contiguous()
        and not t.is_neg()
    )


class SampleGather:
    """Where each tensor's sample lives, and the arrays of one ``stepscope_gather_many`` call.

    Parameters
    ----------
    tensors
        :func:`gatherable` tensors; their dtype and size are fixed by the plan.
    indices
        Per tensor, 1-D integer flat indices into it (each in ``[0, numel)``; refused with
        ``ValueError`` otherwise), or ``None`` for the whole tensor.
    lib
        The loaded kernel library (:func:`stepscope.stats._native.loaded`).

    Attributes
    ----------
    samples
        Per tensor, its sample: a contiguous view into the plan's float32 or float64 buffer,
        overwritten by every :meth:`gather` (copy it to keep it).
    """

    def __init__(
        self,
        tensors: Sequence[torch.Tensor],
        indices: Sequence[torch.Tensor | None],
        lib: ctypes.CDLL,
    ) -> None:
        if len(tensors) != len(indices):
            raise ValueError(f"{len(tensors)} tensors but {len(indices)} index tensors")
        self._fn = lib.stepscope_gather_many
        self.count = len(tensors)
        self._shape: list[tuple[torch.dtype, int]] = []
        self._indices: list[torch.Tensor | None] = []  # kept alive: the kernel reads them
        sizes = [0, 0]  # elements of the float32 and the float64 buffer
        offsets, ns = [], []
        for t, idx in zip(tensors, indices):
            if not gatherable(t):
                raise ValueError(f"not a contiguous CPU float32/float64 tensor: {t.dtype}")
            numel = t.numel()
            if idx is not None:
                idx = idx.detach().to("cpu", torch.int64).reshape(-1).contiguous()
                if idx.numel() and not (int(idx.min()) >= 0 and int(idx.max()) < numel):
                    raise ValueError(f"sample indices outside [0, {numel})")
            n = numel if idx is None else idx.numel()
            kind = _KIND[t.dtype]
            offsets.append(sizes[kind])
            sizes[kind] += n
            ns.append(n)
            self._shape.append((t.dtype, numel))
            self._indices.append(idx)
        self._buffers = (
            torch.empty(sizes[0], dtype=torch.float32),
            torch.empty(sizes[1], dtype=torch.float64),
        )
        kinds = [_KIND[dtype] for dtype, _ in self._shape]
        self.samples = [self._buffers[k].narrow(0, off, n) for k, off, n in zip(kinds, offsets, ns)]
        self._kinds = np.array(kinds, dtype=np.int32)
        self._ns = np.array(ns, dtype=np.int64)
        self._idx = np.array(
            [0 if i is None else i.data_ptr() for i in self._indices], dtype=np.int64
        )
        self._dst = np.array([s.data_ptr() for s in self.samples], dtype=np.int64)
        self._ptrs = [t.data_ptr() for t in tensors]
        self._storages = [t.untyped_storage() for t in tensors]  # keeps each address valid
        self._src = np.array(self._ptrs, dtype=np.int64)

    def bind(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Read the tensors' storage addresses for the next :meth:`gather`.

        An address is re-read on every call; a tensor found at a new address is checked again
        (dtype, device, layout, contiguity, size). Returns ``False`` (and binds nothing) when one
        no longer fits the plan: build a new plan then. A tensor still at the address last read
        is checked for dtype, size and contiguity only (the plan holds the storage found there,
        so no other allocation can take that address; a narrower or transposed view of that same
        memory is refused like a moved tensor that no longer fits).
        """
        if len(tensors) != self.count:
            return False
        moved: list[tuple[int, torch.Tensor, int]] = []
        shapes = self._shape
        for k, t in enumerate(tensors):
            ptr = t.data_ptr()
            if ptr != self._ptrs[k]:
                if not self._fits(k, t):
                    return False
                moved.append((k, t, ptr))
            else:
                dtype, numel = shapes[k]
                if t.dtype is not dtype or t.numel() != numel or not t.is_contiguous():
                    return False
        for k, t, ptr in moved:
            self._ptrs[k] = ptr
            self._storages[k] = t.untyped_storage()
        if moved:
            self._src[:] = self._ptrs
        return True

    def _fits(self, k: int, t: torch.Tensor) -> bool:
        dtype, numel = self._shape[k]
        return t.dtype is dtype and t.numel() == numel and gatherable(t)

    def gather(self, subtract: bool) -> None:
        """Fill :attr:`samples` from the bound tensors (``subtract``: ``now - sample``, in place)."""
        self._fn(
            self.count,
            self._src.ctypes.data,
            self._kinds.ctypes.data,
            self._idx.ctypes.data,
            self._ns.ctypes.data,
            self._dst.ctypes.data,
            int(subtract),
        )
