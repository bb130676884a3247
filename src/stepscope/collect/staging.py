"""Staging: what a hook may reduce, and its reduction into per-device staging rows.

Preallocated per-device staging buffers: one row per (stream, site), one host copy per phase.

Hooks write fixed-width reduction rows into a buffer that lives on the observed tensors' device;
nothing leaves the device until the step boundary copies the whole buffer
(:func:`stepscope.collect.write.host_copy`). The number of host transfers per step is therefore
independent of the number of sites (a test counts calls of :func:`stepscope.transfer.to_host`,
the one copy every layer uses).

Reductions: a hooked tensor becomes a staged row, and telemetry never raises.

:class:`Reducer` owns the per-device :class:`~stepscope.collect.staging.Staging` buffers of one
collector. Every hook of the collector hands its tensor here:

* :meth:`Reducer.reduce` writes one row (activations, activation gradients, a closure's
  gradient); :meth:`Reducer.direct` is an activation hook's common case whole (a plain
  output of the dtype and rank its row is bound to, straight into the C kernel);
* :meth:`Reducer.reduce_many` writes the due parameter-sized rows of a stream (gradients,
  parameters, updates) with one multi-tensor call per device; the tensors the native call
  cannot take (sparse, half precision, strided) fall back to the general path, the others
  stay in the one call.

A tensor that cannot be reduced (see :func:`~stepscope.collect.staging.reducible`) is recorded
``unsupported`` with its reason, a reduction that raises is recorded ``capture_failed`` with the
exception's type; neither reaches the training step. The seconds spent are charged to the
step's stream (:meth:`~stepscope.collect.step.StepState.charge`) and profiled under
``collector.reduce`` as stepscope's own work.

What a hook may reduce: the tensor inside a module's output, and whether it is reducible.

Output rule (documented in ``docs/sites.md``)
-------------------------------------------------
A module's activation is the **first tensor found depth-first** in its output: a tensor is
itself; a ``dict``/``Mapping`` (``ModelOutput``, ``OrderedDict``) is searched in insertion order
of its values; a dataclass in field order; a ``tuple``/``list`` in order; ``None`` values are
skipped; other objects are not searched, nor anything nested deeper than
:data:`MAX_DEPTH` levels. ``WatchSettings(output_keys={glob: path})`` names the tensor instead: a
dotted path of mapping keys, attribute names and sequence indices (``"logits"``,
``"0"``, ``"hidden_states.-1"``), for the sites whose qualified name matches ``glob``.
An output with no tensor records ``unsupported`` with reason ``no_tensor_output``; a named path
that does not resolve records ``unsupported`` with reason ``output_key_missing``.

Reducibility
------------
:func:`reducible` decides before any kernel runs: complex dtypes, dtypes with no order
(``unsupported:complex``; a dtype the kernels refuse, ``unsupported:dtype``), tensor subclasses
other than ``DTensor`` such as fake tensors (``unsupported:tensor_subclass``, whose storage the
native kernel must not read; a ``DTensor`` reduces its local shard, see :mod:`.distributed`) and
hooks firing during CUDA-graph stream capture (``unsupported:cuda_graph_capture``: the capture's
replays are not observed). Sparse tensors are reduced over their stored values with the
disclosure ``sparse_values`` (implicit zeros are not counted).

Example
-------
>>> import torch
>>> t = torch.ones(2, 3)
>>> find_tensor({"loss": None, "logits": (t,)}) is t, find_tensor([None, "x"])
(True, None)
>>> find_path({"logits": (t,)}, "logits.0") is t
True
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from stepscope.collect.distributed import local_part
from stepscope.collect.sites import SiteRow
from stepscope.collect.step import StepState
from stepscope.errors import Refusal
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
from stepscope.transfer import internal_scope

__all__ = ["Reducer"]

# ------------------------------------------------------------------ (staging)
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
        #: what :meth:`_native_many` keeps per row list (built at its first call)
        self._many_plans: dict[tuple[int, ...], tuple[Any, ...] | None] = {}

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
        if not histogram and self._native_one(row, tensor):
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

    def _native_one(self, row: int, tensor: torch.Tensor) -> bool:
        """The C spine kernel straight into a fresh ``row`` when it takes ``tensor`` as it is (a
        contiguous, not lazily negated float32/float64 CPU tensor): what :func:`spine_into`
        runs for it, without its per-call checks; ``False`` (nothing written) otherwise."""
        if self.fired[row] != 0:
            return False
        fn = self._native().get(tensor.dtype)
        if fn is None or not tensor.is_cpu or not tensor.is_contiguous() or tensor.is_neg():
            return False
        fn(tensor.data_ptr(), tensor.numel(), torch.get_num_threads(), self._base + row * _ROW)
        self.fired[row] = 1
        return True

    def _native_many(self, rows: list[int], tensors: list[torch.Tensor]) -> Sequence[int] | None:
        """The parameter-sized streams' common case in one native call, without per-row Python.

        Writes what :meth:`write_many` writes without histograms (the same C call on the same
        data) for every tensor that is a plain contiguous float32/float64 CPU tensor or
        parameter (not lazily negated), when every row is fresh this step and no row repeats.
        Returns the positions it did not write (a sparse gradient, a half-precision tensor:
        the caller's general path takes those), or ``None`` when it wrote nothing.

        The rows of a stream are the same at every due step, so what depends on them only
        (their index array, each row's address, the argument arrays) is built once per row
        list and kept (:meth:`_many_plan`); a call fills in the tensors' addresses and sizes.
        """
        kernels = self._kernels if self._kernels is not None else self._native()
        many = kernels.get("many")
        if many is None:
            return None
        plan = self._many_plans.get(key := tuple(rows))
        if plan is None:
            plan = self._many_plan(key)
            if plan is None:  # a row repeats
                return None
        idx, ptrs, ns, kinds, args, _ = plan
        if self.fired[idx].any():
            return None
        odd: list[int] | None = None
        f32, f64, strided = torch.float32, torch.float64, torch.strided
        for i, t in enumerate(tensors):
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
                if odd is None:
                    odd = []
                odd.append(i)
                continue
            ptrs[i] = t.data_ptr()  # user-space pointers are < 2**63
            ns[i] = t.numel()
            kinds[i] = dtype is f64
        threads = torch.get_num_threads()
        if odd is None:  # the common case: every tensor in one call
            many(len(key), args[0], args[1], args[2], threads, args[3])
            self.fired[idx] = 1  # (every row was fresh)
            return ()
        if len(odd) == len(key):
            return None
        # the others in one call of their own (its arrays built for it)
        sub = np.delete(idx, odd)
        p, n, k = np.delete(ptrs, odd), np.delete(ns, odd), np.delete(kinds, odd)
        out = sub * _ROW + self._base
        many(len(sub), p.ctypes.data, n.ctypes.data, k.ctypes.data, threads, out.ctypes.data)
        self.fired[sub] = 1
        return odd

    #: row lists kept by :meth:`_many_plan` (a few per stream; forgotten past this many)
    MAX_MANY_PLANS = 64

    def _many_plan(self, key: tuple[int, ...]) -> tuple[Any, ...] | None:
        """For the row list ``key``: its index array, the pointer / size / dtype arrays the
        native call reads (filled per call) and their addresses with the rows' output
        addresses; ``None`` (kept too) when a row repeats."""
        n = len(key)
        plan: tuple[Any, ...] | None = None
        if len(set(key)) == n:
            idx = np.array(key, dtype=np.int64)
            ptrs, ns = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
            kinds = np.zeros(n, dtype=np.int32)
            out = idx * _ROW + self._base
            addresses = (ptrs.ctypes.data, ns.ctypes.data, kinds.ctypes.data, out.ctypes.data)
            plan = (idx, ptrs, ns, kinds, addresses, out)  # (out kept alive with its address)
        if len(self._many_plans) >= self.MAX_MANY_PLANS:
            self._many_plans.clear()
        self._many_plans[key] = plan
        return plan

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


def by_device(pairs: list[tuple[int, torch.Tensor]]) -> dict[torch.device, tuple[list, list]]:
    """Group ``(row, tensor)`` pairs by the tensor's device (detached), in order."""
    out: dict[torch.device, tuple[list, list]] = {}
    for row, t in pairs:
        rows, ts = out.setdefault(t.device, ([], []))
        rows.append(row)
        ts.append(t.detach())
    return out


# ------------------------------------------------------------------ (reduce)
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

    def reduce(self, row: SiteRow, tensor: torch.Tensor) -> None:
        """Reduce ``tensor`` into ``row`` when the row's stream is due this step.

        A plain contiguous float CPU tensor on a fresh row, with no histogram due and no
        profiler recording (the activation hooks' common case), goes straight to the C kernel
        (:meth:`Staging._native_one`); anything else is checked (:func:`reducible`) first.
        """
        state = self.recording()
        if state is None or not state.spine_due[row.stream]:
            return
        t0 = time.perf_counter()
        histogram = state.hist_due[row.stream]
        try:
            cpu = self._cpu
            if (
                cpu is not None
                and not histogram
                and type(tensor) is torch.Tensor
                and tensor.is_cpu
                and tensor.layout is torch.strided
                and not torch.autograd._profiler_enabled()
                and not cuda_graph_capturing()
                and cpu._native_one(row.index, tensor)
            ):
                state.charge(row.stream, time.perf_counter() - t0)
                return
            with internal_scope("collector.reduce"):  # profiled as stepscope's work, not the user's
                x, note = reducible(tensor)  # detached: no graph is built
                if x is None:
                    state.unsupported[row.index] = note or "unknown"
                else:
                    self.staging(x.device).write(row.index, x, histogram)
                    if note is not None:
                        state.row_notes[row.index] = note
        except Exception as e:  # telemetry never raises into the training step
            if isinstance(e, Refusal) and e.code == "stat_dtype_unsupported":  # no ordered stats
                state.unsupported[row.index] = f"dtype:{str(tensor.dtype).replace('torch.', '')}"
            else:
                state.failed[row.index] = type(e).__name__
        state.charge(row.stream, time.perf_counter() - t0)

    def direct(
        self, entry: tuple[SiteRow, torch.dtype, int], tensor: torch.Tensor, state: StepState
    ) -> bool:
        """An activation hook's common case, whole: ``tensor`` (a module's plain output) into
        the fresh row of ``entry`` straight through the C kernel, when it has the dtype and rank
        the row is bound to and :meth:`reduce` would take the same path for it; ``False``
        (nothing written) otherwise (the caller then takes the general path)."""
        row, dtype, dim = entry
        cpu = self._cpu
        if (
            cpu is None
            or not state.spine_due["activation"]
            or state.hist_due["activation"]
            or tensor.dtype is not dtype
            or not tensor.is_cpu
            or tensor.layout is not torch.strided
            or tensor.dim() != dim
            or torch.autograd._profiler_enabled()
            or cuda_graph_capturing()
            or under_transform(tensor)
        ):
            return False
        t0 = time.perf_counter()
        if not cpu._native_one(row.index, tensor):
            return False
        row.numel = tensor.numel()
        state.charge("activation", time.perf_counter() - t0)
        return True

    def reduce_many(self, stream: str, pairs: Sequence[tuple[SiteRow, torch.Tensor]]) -> None:
        """Parameter-sized streams: every due tensor of a device in one multi-tensor reduction.

        Tensors that cannot be reduced are recorded as :meth:`reduce` records them; a batch the
        native call refuses falls back to one reduction per row (telemetry never raises).
        """
        state = self.recording()
        if not pairs or state is None or not state.spine_due[stream]:
            return
        t0 = time.perf_counter()
        with internal_scope("collector.reduce"):  # profiled as stepscope's work, not the user's
            self._stage_many(state, stream, pairs)
        state.charge(stream, time.perf_counter() - t0)

    def _stage_many(
        self, state: StepState, stream: str, pairs: Sequence[tuple[SiteRow, torch.Tensor]]
    ) -> None:
        if not state.hist_due[stream] and pairs[0][1].is_cpu and not cuda_graph_capturing():
            # the common case: one native call, no per-row Python (during a CUDA graph capture
            # every row is recorded unsupported)
            rows, tensors = [r.index for r, _ in pairs], [t for _, t in pairs]
            try:
                odd = self.staging(_CPU)._native_many(rows, tensors)
            except Exception:  # nothing counts as written: the general path records every row
                odd = None
            if odd is not None:  # the general path takes what the native call did not
                if not odd:
                    return
                pairs = [pairs[k] for k in odd]
        by_index: dict[int, SiteRow] = {}
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


# ------------------------------------------------------------------ (capture)
MAX_DEPTH = 4


def _children(value: Any) -> list[Any] | None:
    if isinstance(value, Mapping):
        return list(value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, (tuple, list)):
        return list(value)
    return None


def find_tensor(output: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor depth-first in ``output`` (the rule above), or ``None``."""
    if isinstance(output, torch.Tensor):
        return output
    if depth >= MAX_DEPTH:
        return None
    children = _children(output)
    for child in children or ():
        if child is not None:
            found = find_tensor(child, depth + 1)
            if found is not None:
                return found
    return None


def find_path(output: Any, path: str) -> torch.Tensor | None:
    """The tensor at a dotted ``path`` of keys, attributes and indices (``None``: not there)."""
    value = output
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, (tuple, list)):
            try:
                value = value[int(part)]
            except (ValueError, IndexError):
                return None
        else:
            value = getattr(value, part, None)
        if value is None:
            return None
    return value if isinstance(value, torch.Tensor) else None


def module_output(output: Any, key: str | None) -> tuple[torch.Tensor | None, str | None]:
    """``(tensor, None)``, or ``(None, reason)`` when the output holds no reducible tensor."""
    if key is None:
        t = find_tensor(output)
        return (t, None) if t is not None else (None, "no_tensor_output")
    t = find_path(output, key)
    return (t, None) if t is not None else (None, f"output_key_missing:{key}")


def _not_capturing() -> bool:
    return False


#: the CUDA-graph capture probe (tests substitute it on the CPU)
cuda_graph_capturing = (
    torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else _not_capturing
)


def reducible(t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """``(tensor to reduce, disclosure or None)``, or ``(None, unsupported reason)``."""
    if cuda_graph_capturing():
        return None, "cuda_graph_capture"
    t = t.detach()
    if type(t) is not torch.Tensor:  # a DTensor: its local shard (see .sharded)
        local, reason = local_part(t)
        if local is None:  # FakeTensor, other subclasses (detach keeps them), Partial DTensors
            return None, reason
        t = local
    if t.layout is torch.strided and not t.is_meta and not t.is_complex():
        return t, None  # the common case, decided as the checks below decide it
    note = None
    if t.layout is not torch.strided:
        if t.layout is torch.sparse_coo:
            t = t.coalesce().values()
        elif t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
            t = t.values()
        else:
            return None, f"layout:{str(t.layout).replace('torch.', '')}"
        note = "sparse_values"
    if t.is_complex():  # other dtypes the kernels refuse are caught by the collector
        return None, f"complex:{str(t.dtype).replace('torch.', '')}"
    if t.device.type == "meta":
        return None, "meta_tensor"
    return t, note


#: Unsupported reason (and ``skipped_calls:`` disclosure) of a call under a ``torch.func`` transform.
TORCH_FUNC = "torch_func"

_functorch = getattr(torch._C, "_functorch", None)


def under_transform(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``torch.func`` (functorch) wrapper: a module called inside ``vmap``,
    ``grad`` or ``jvp``. Its values live in the transform's batched view, not in a storage a
    kernel may read."""
    return (
        _functorch is not None
        and _functorch.peek_interpreter_stack() is not None
        and _functorch.is_functorch_wrapped_tensor(t)
    )


_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread (a checkpoint recompute
    is the only forward that happens there)."""
    return _graph_task_id() != -1
