"""Reductions: a hooked tensor becomes a staged row, and telemetry never raises.

:class:`Reducer` owns the per-device :class:`~stepscope.collect.staging.Staging` buffers of one
collector. Every hook of the collector hands its tensor here:

* :meth:`Reducer.reduce` writes one row (activations, activation gradients, a closure's
  gradient);
* :meth:`Reducer.reduce_many` writes the due parameter-sized rows of a stream (gradients,
  parameters, updates) with one multi-tensor call per device; a batch the native call refuses
  falls back to one reduction per row.

A tensor that cannot be reduced (see :func:`~stepscope.collect.capture.reducible`) is recorded
``unsupported`` with its reason, a reduction that raises is recorded ``capture_failed`` with the
exception's type; neither reaches the training step. The seconds spent are charged to the
step's stream (:meth:`~stepscope.collect.stepstate.StepState.charge`) and profiled under
``collector.reduce`` as stepscope's own work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from stepscope.collect import capture
from stepscope.collect.capture import reducible
from stepscope.collect.sites import Row
from stepscope.collect.staging import Staging, by_device
from stepscope.collect.stepstate import StepState
from stepscope.errors import Refusal
from stepscope.stats import HistogramDescriptor
from stepscope.transfer import internal_scope

__all__ = ["Reducer"]

_CPU = torch.device("cpu")


class Reducer:
    """The staging buffers of one collector and the reductions that fill them.

    Parameters
    ----------
    n_rows
        Number of row keys of the collector (every staging buffer has that many rows).
    descriptor, backend
        Histogram grid and kernel backend of the staging buffers.
    recording
        Returns the step being recorded, or ``None`` when nothing may be recorded now (no
        step, or a :meth:`~stepscope.HistoryCollector.telemetry` window is open).
    """

    def __init__(
        self,
        n_rows: int,
        descriptor: HistogramDescriptor,
        backend: str,
        recording: Callable[[], StepState | None],
    ) -> None:
        self.n_rows, self.descriptor, self.backend = n_rows, descriptor, backend
        self.recording = recording
        self.stagings: dict[torch.device, Staging] = {}
        self._cpu: Staging | None = None  # the CPU buffer, once allocated (the hot path's)

    def staging(self, device: torch.device) -> Staging:
        """The staging buffer of ``device`` (allocated at its first use)."""
        st = self.stagings.get(device)
        if st is None:
            st = Staging(self.n_rows, device, self.descriptor, self.backend)
            self.stagings[device] = st
            if device == _CPU:
                self._cpu = st
        return st

    def reset(self) -> None:
        """Empty every buffer (a step begins)."""
        for st in self.stagings.values():
            st.reset()

    def to_host(
        self, with_histograms: bool
    ) -> dict[torch.device, tuple[np.ndarray, np.ndarray | None]]:
        """Every buffer's rows on the host: one copy per buffer (and per histogram buffer)."""
        return {dev: st.to_host(with_histograms) for dev, st in self.stagings.items()}

    def reduce(self, row: Row, tensor: torch.Tensor) -> None:
        """Reduce ``tensor`` into ``row`` when the row's stream is due this step."""
        state = self.recording()
        if state is None or not state.spine_due[row.stream]:
            return
        t0 = time.perf_counter()
        try:
            if self._write_plain(state, row, tensor):  # the activation hooks' common case
                state.charge(row.stream, time.perf_counter() - t0)
                return
            with internal_scope("collector.reduce"):  # profiled as stepscope's work, not the user's
                x, note = reducible(tensor)  # detached: no graph is built
                if x is None:
                    state.unsupported[row.index] = note or "unknown"
                else:
                    self.staging(x.device).write(row.index, x, state.hist_due[row.stream])
                    if note is not None:
                        state.row_notes[row.index] = note
        except Exception as e:  # telemetry never raises into the training step
            if isinstance(e, Refusal) and e.code == "stat_dtype_unsupported":  # no ordered stats
                state.unsupported[row.index] = f"dtype:{str(tensor.dtype).replace('torch.', '')}"
            else:
                state.failed[row.index] = type(e).__name__
        state.charge(row.stream, time.perf_counter() - t0)

    def _write_plain(self, state: StepState, row: Row, tensor: torch.Tensor) -> bool:
        """A plain contiguous float CPU tensor on a fresh row, no histogram due and no profiler
        recording: straight to the C kernel (what the general path runs for it, without its
        checks and indirections); ``False`` (nothing written) otherwise."""
        cpu = self._cpu
        return (
            cpu is not None
            and type(tensor) is torch.Tensor
            and tensor.is_cpu
            and tensor.layout is torch.strided
            and not state.hist_due[row.stream]
            and not torch.autograd._profiler_enabled()
            and not capture.capture_probe()
            and cpu.write_plain(row.index, tensor)
        )

    def reduce_many(self, stream: str, pairs: Sequence[tuple[Row, torch.Tensor]]) -> None:
        """Parameter-sized streams: every due tensor of a device in one multi-tensor reduction.

        Tensors that cannot be reduced are recorded as :meth:`reduce` records them; a batch the
        native call refuses falls back to one reduction per row (telemetry never raises).
        """
        state = self.recording()
        if not pairs or state is None or not state.spine_due[stream]:
            return
        t0 = time.perf_counter()
        with internal_scope("collector.reduce"):  # profiled as stepscope's work, not the user's
            self._write_many(state, stream, pairs)
        state.charge(stream, time.perf_counter() - t0)

    def _write_many_native(self, pairs: Sequence[tuple[Row, torch.Tensor]]) -> bool:
        """Every pair in one C call when all are plain CPU float tensors on fresh rows
        (:meth:`Staging.write_many_native`); ``False`` (nothing written) otherwise."""
        if not pairs or not pairs[0][1].is_cpu or capture.capture_probe():
            return False  # (during a CUDA graph capture every row is recorded unsupported)
        rows, tensors = [r.index for r, _ in pairs], [t for _, t in pairs]
        return self.staging(_CPU).write_many_native(rows, tensors)

    def _write_many(
        self, state: StepState, stream: str, pairs: Sequence[tuple[Row, torch.Tensor]]
    ) -> None:
        if not state.hist_due[stream]:  # the common case: one native call, no per-row Python
            try:
                if self._write_many_native(pairs):
                    return
            except Exception:  # nothing counts as written: the general path records every row
                pass
        by_index: dict[int, Row] = {}
        ready: list[tuple[int, torch.Tensor]] = []
        for row, tensor in pairs:
            try:
                x, note = reducible(tensor)
            except Exception as e:
                state.failed[row.index] = type(e).__name__
                continue
            if x is None:
                state.unsupported[row.index] = note or "unknown"
                continue
            if note is not None:
                state.row_notes[row.index] = note
            by_index[row.index] = row
            ready.append((row.index, x))
        histogram = state.hist_due[stream]
        for dev, (idx, ts) in by_device(ready).items():
            staging = self.staging(dev)
            try:
                staging.write_many(idx, ts, histogram)
            except Exception:  # e.g. a dtype the kernels refuse: record each row on its own
                for i, t in zip(idx, ts):
                    if staging.fired[i] == 0:
                        self.reduce(by_index[i], t)
