"""Preallocated per-device staging buffers: one row per (stream, site), one host copy per phase.

Hooks write fixed-width reduction rows into a buffer that lives on the observed tensors' device;
nothing leaves the device until :meth:`Staging.to_host` copies the whole buffer at the step
boundary. The number of host transfers per step is therefore independent of the number of sites
(a test counts calls of :func:`stepscope.transfer.to_host`, the one copy every layer uses).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stepscope import transfer
from stepscope.stats import (
    SPINE_WIDTH,
    HistogramDescriptor,
    reduce_histograms,
    spine_and_histogram_into,
    spine_into,
    spines_into,
)
from stepscope.stats.reduce import merge_spine_into
from stepscope.stats.spinerow import native_spine_kernels

_ROW = SPINE_WIDTH * 8  # bytes per spine row (float64)


class Staging:
    """Spine and histogram rows of one device for every (stream, site) row key.

    Parameters
    ----------
    n_rows
        Number of row keys (fixed after the collector's plan is built).
    device
        Where the observed tensors live.
    descriptor
        Histogram grid.
    backend
        Kernel backend for :func:`reduce_spines`.
    """

    def __init__(
        self,
        n_rows: int,
        device: torch.device,
        descriptor: HistogramDescriptor,
        backend: str = "auto",
    ) -> None:
        self.device, self.descriptor, self.backend = device, descriptor, backend
        self.spines = torch.full(
            (n_rows, SPINE_WIDTH), float("nan"), dtype=torch.float64, device=device
        )
        self.hist = torch.zeros((n_rows, descriptor.width), dtype=torch.int64, device=device)
        #: where a repeated call's spine is reduced before it is folded into its row
        self.scratch = torch.empty(SPINE_WIDTH, dtype=torch.float64, device=device)
        #: C spine entry points by dtype (resolved at the first write; empty: none serves)
        self._kernels: dict[torch.dtype | str, Any] | None = None
        self._base = 0  # address of the spine buffer (rows are _ROW bytes apart)
        self.fired = np.zeros(n_rows, dtype=np.int32)  # host-side: how often each row was written
        self.hist_fired = np.zeros(n_rows, dtype=bool)

    def reset(self) -> None:
        """Forget the previous step (host-side flags only; device rows are overwritten on use)."""
        self.fired[:] = 0
        self.hist_fired[:] = False

    def reset_row(self, row: int) -> None:
        """Forget what ``row`` holds this step, so the next write replaces it (not merges)."""
        self.fired[row] = 0
        self.hist_fired[row] = False

    def write(self, row: int, tensor: torch.Tensor, histogram: bool) -> None:
        """Reduce ``tensor`` into ``row`` (merging exactly if the row already fired this step)."""
        if not histogram and self.write_plain(row, tensor):
            return
        # rows by .select: plain [row] indexing may build an index tensor on the host
        spine = self.spines.select(0, row)
        if self.fired[row] == 0 and histogram:  # one fused read where the device has one
            spine_and_histogram_into(
                tensor, spine, self.hist.select(0, row), self.descriptor, self.backend
            )
            self.fired[row] += 1
            self.hist_fired[row] = True
            return
        if self.fired[row] == 0:
            spine_into(tensor, spine, self.backend)
        else:  # a module called twice in one step (micro-batches, weight sharing): fold exactly
            spine_into(tensor, self.scratch, self.backend)
            merge_spine_into(spine, self.scratch, self.backend)
        self.fired[row] += 1
        if histogram:
            counts = reduce_histograms([tensor], self.descriptor, backend=self.backend)
            hist = self.hist.select(0, row)
            if self.hist_fired[row]:
                hist.add_(counts.select(0, 0))
            else:
                hist.copy_(counts.select(0, 0))
            self.hist_fired[row] = True

    def _native(self) -> dict[torch.dtype | str, Any]:
        """The C entry points (resolved at the first use; empty: none serves this buffer)."""
        kernels = self._kernels
        if kernels is None:
            kernels = self._kernels = native_spine_kernels(self.device, self.backend)
            self._base = self.spines.data_ptr() if kernels else 0
        return kernels

    def write_plain(self, row: int, tensor: torch.Tensor) -> bool:
        """:meth:`write` of a fresh row without a histogram when the C kernel takes ``tensor``
        as it is; ``False`` (nothing written) otherwise."""
        if self.fired[row] == 0 and self._spine_native(row, tensor):
            self.fired[row] = 1
            return True
        return False

    def _spine_native(self, row: int, tensor: torch.Tensor) -> bool:
        """The activation hot path: the C kernel straight into ``row`` (what :func:`spine_into`
        runs for a contiguous float32/float64 CPU tensor, without its per-call checks)."""
        fn = self._native().get(tensor.dtype)
        if fn is None or not tensor.is_cpu or not tensor.is_contiguous() or tensor.is_neg():
            return False
        fn(tensor.data_ptr(), tensor.numel(), torch.get_num_threads(), self._base + row * _ROW)
        return True

    def write_many_native(self, rows: list[int], tensors: list[torch.Tensor]) -> bool:
        """The parameter-sized streams' common case in one native call, without per-row Python.

        Writes what :meth:`write_many` writes without histograms (the same C call on the same
        data) when every tensor is a plain contiguous float32/float64 CPU tensor or parameter
        (not lazily negated), every row is fresh this step and no row repeats; otherwise
        writes nothing and returns ``False`` (the caller takes the general path).
        """
        many = self._native().get("many")
        if many is None:
            return False
        idx = np.fromiter(rows, dtype=np.int64, count=len(rows))
        if self.fired[idx].any() or len(np.unique(idx)) != len(idx):
            return False
        ptrs, ns, kinds = [], [], []
        f32, f64, strided = torch.float32, torch.float64, torch.strided
        for t in tensors:
            kind = type(t)
            dtype = t.dtype
            if (
                (kind is not torch.Tensor and kind is not torch.nn.Parameter)
                or (dtype is not f32 and dtype is not f64)
                or not t.is_cpu
                or t.layout is not strided
                or not t.is_contiguous()
                or t.is_neg()
            ):
                return False
            ptrs.append(t.data_ptr())
            ns.append(t.numel())
            kinds.append(dtype is f64)
        p = np.array(ptrs, dtype=np.int64)  # user-space pointers are < 2**63
        n = np.array(ns, dtype=np.int64)
        k = np.array(kinds, dtype=np.int32)
        o = idx * _ROW + self._base
        many(
            len(p),
            p.ctypes.data,
            n.ctypes.data,
            k.ctypes.data,
            torch.get_num_threads(),
            o.ctypes.data,
        )
        self.fired[idx] += 1
        return True

    def write_many(self, rows: list[int], tensors: list[torch.Tensor], histogram: bool) -> None:
        """:meth:`write` for many rows at once: one multi-tensor spine call for the fresh rows.

        The parameter-sized streams (gradient, parameter, update) come here with every due
        tensor of the step; a row that already fired this step folds exactly through
        :meth:`write`.
        """
        fresh = [k for k, r in enumerate(rows) if self.fired[r] == 0]
        if len(fresh) < len(rows):
            seen = set(fresh)
            for k in range(len(rows)):
                if k not in seen:
                    self.write(rows[k], tensors[k], histogram)
            rows, tensors = [rows[k] for k in fresh], [tensors[k] for k in fresh]
        if histogram:  # spine and histogram of each tensor in one read, one native call
            spines_into(
                tensors, self.spines, rows, self.backend, hist=self.hist, descriptor=self.descriptor
            )
            self.hist_fired[rows] = True
        else:
            spines_into(tensors, self.spines, rows, self.backend)
        self.fired[rows] += 1

    def to_host(self, with_histograms: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Copy the spine buffer (and the histogram buffer on histogram steps) to the host."""
        spines = transfer.to_host(self.spines)  # looked up at each call (tests patch it)
        hist = transfer.to_host(self.hist) if with_histograms and self.hist_fired.any() else None
        return spines, hist


def by_device(pairs: list[tuple[int, torch.Tensor]]) -> dict[torch.device, tuple[list, list]]:
    """Group ``(row, tensor)`` pairs by the tensor's device (detached), in order."""
    out: dict[torch.device, tuple[list, list]] = {}
    for row, t in pairs:
        rows, ts = out.setdefault(t.device, ([], []))
        rows.append(row)
        ts.append(t.detach())
    return out
