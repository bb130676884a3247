"""Preallocated per-device staging buffers: one row per (stream, site), one host copy per phase.

Hooks write fixed-width reduction rows into a buffer that lives on the observed tensors' device;
nothing leaves the device until :meth:`Staging.to_host` copies the whole buffer at the step
boundary. The number of host transfers per step is therefore independent of the number of sites
(a test counts calls of :func:`to_host`).
"""

from __future__ import annotations

import numpy as np
import torch

from stepscope.stats import (
    SPINE_WIDTH,
    HistogramDescriptor,
    merge_spine_rows,
    reduce_histograms,
    reduce_spines,
    spine_into,
)

#: Device-to-host copies performed by staging (tests read this to prove the transfer invariant).
TRANSFERS = {"count": 0}


def to_host(t: torch.Tensor) -> np.ndarray:
    """The one place where staged rows leave the device."""
    TRANSFERS["count"] += 1
    return np.array(t.detach().to("cpu").numpy(), copy=True)  # own the memory: buffers are reused


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
        if self.fired[row] == 0:
            spine_into(tensor, self.spines[row], self.backend)
        else:  # a module called twice in one step (micro-batches, weight sharing): fold exactly
            part = reduce_spines([tensor], backend=self.backend)
            self.spines[row] = merge_spine_rows(self.spines[row], part[0])
        self.fired[row] += 1
        if histogram:
            counts = reduce_histograms([tensor], self.descriptor, backend=self.backend)[0]
            if self.hist_fired[row]:
                self.hist[row] += counts
            else:
                self.hist[row] = counts
            self.hist_fired[row] = True

    def to_host(self, with_histograms: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """Copy the spine buffer (and the histogram buffer on histogram steps) to the host."""
        spines = to_host(self.spines)
        hist = to_host(self.hist) if with_histograms and self.hist_fired.any() else None
        return spines, hist
