"""One tensor's spine row written in place: the C kernel, the fused Triton kernel, or torch.

:func:`spine_into` writes a tensor's spine row into a row of the collector's staging buffer and
:func:`spine_and_histogram_into` its spine and histogram counts from one read; both choose, per
call, the fused C kernel on the CPU, the Triton kernel on CUDA (when installed) or the sync-free
pure-torch path, which compute the same quantities. :func:`native_spine_kernels` hands the C
entry points to callers that do their own checks. The batched forms (:func:`reduce_spines`,
:func:`spines_into`) are in :mod:`stepscope.stats.reduce`.

Example
-------
>>> import torch
>>> from stepscope.stats.layout import SPINE_FIELDS, SPINE_WIDTH
>>> from stepscope.stats.spinerow import spine_into
>>> row = torch.empty(SPINE_WIDTH, dtype=torch.float64)
>>> spine_into(torch.tensor([1.0, -2.0, float("nan")]), row)
>>> dict(zip(SPINE_FIELDS, row.tolist()))["nan"], row[SPINE_FIELDS.index("sum")].item()
(1.0, -1.0)
"""

from __future__ import annotations

from typing import Any

import torch

from stepscope.stats import _native, _triton
from stepscope.stats._backend import F32, F64, native_library, prepare, use_triton
from stepscope.stats.binning import device_tables, format_for, reduce_histograms, slot_tables
from stepscope.stats.descriptor import HistogramDescriptor


def _torch_spine(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The spine row of a flat float tensor with device ops only.

    Written into ``out`` when given (a contiguous ``[SPINE_WIDTH]`` float64 view).
    Sync-free by construction (a test replays it on a fake CUDA tensor): no ``.item()``, no
    tensor built from host data, no data-dependent shape. Passes over the data: one mask pass,
    one stacked count reduction, one ``aminmax`` over the finite values (non-finite ones replaced by
    the first finite element, found with ``argmax``), and the float64 sums.
    """
    x = x.reshape(-1)  # a view: callers pass contiguous tensors of any shape
    n = x.numel()
    f64 = torch.float64
    nan = float("nan")
    if n == 0:  # counts and sums exactly zero, the rest undefined (built on the device)
        z, u = x.new_zeros((), dtype=f64), x.new_full((), nan, dtype=f64)
        return torch.stack((*[z] * 7, u, u, u, z, z, z, u, u), out=out)
    fin = torch.isfinite(x)
    neg, inf = x < 0, torch.isinf(x)
    counts = torch.stack((fin, x == 0, neg & fin, torch.isnan(x), inf & (x > 0), inf & neg))
    counts = counts.sum(dim=1).to(f64)
    finite = counts.select(0, 0)
    has = finite > 0
    # any finite element (x[0] if none), by index on the device: x[t] would read t on the host
    first = x.index_select(0, fin.to(torch.uint8).argmax().reshape(1)).squeeze(0)
    mn, mx = (torch.where(has, m.to(f64), nan) for m in torch.where(fin, x, first).aminmax())
    w = torch.where(fin, x, 0.0).to(f64)
    s = w.sum()
    mean = s / finite
    d = torch.where(fin, w - mean, 0.0)
    parts = (
        x.new_full((), n, dtype=f64),
        *counts.unbind(),
        mn,
        mx,
        torch.maximum(mn.abs(), mx.abs()),
        s,
        torch.dot(w, w),
        w.abs().sum(),
        torch.where(has, mean, nan),
        torch.where(has, torch.dot(d, d), nan),
    )
    return torch.stack(parts, out=out)  # into the staging row: no copy_, no host index


def _device_spine(x: torch.Tensor, out: torch.Tensor, backend: str) -> None:
    """Spine of flat ``x`` off the C kernel: the fused Triton kernel where it serves, else torch."""
    if use_triton(backend, x.device):
        try:
            fmt = F64 if x.dtype == torch.float64 else F32
            _triton.spine_and_histogram(x.reshape(-1), None, fmt=fmt, out=out)
            return
        except Exception as exc:  # telemetry never breaks the step: fall back, warn once
            if backend == "triton":
                raise
            _triton.disable(exc)
    _torch_spine(x, out)


def spine_and_histogram_into(
    tensor: torch.Tensor,
    spine_row: torch.Tensor,
    hist_row: torch.Tensor,
    descriptor: HistogramDescriptor,
    backend: str = "auto",
) -> None:
    """Spine into ``spine_row`` and histogram counts into ``hist_row`` (overwritten), fused.

    On CUDA with Triton one kernel reads the tensor once for both (plus a tiny combine); on the
    CPU the two C kernels run; elsewhere the pure-torch paths.
    """
    x = prepare(tensor)
    if x.device.type == "cpu" and backend != "torch" and spine_row.is_contiguous():
        lib = _native.loaded() if backend == "auto" else native_library(backend, x.device)
        xf, fmt = format_for(x, descriptor)
        if lib is not None and fmt == F32 and hist_row.is_contiguous():  # one read, one call
            slots, cuts = slot_tables(descriptor, fmt)
            hist_row.zero_()
            lib.stepscope_spine_hist_f32(
                *(xf.data_ptr(), xf.numel(), slots.ctypes.data, cuts.ctypes.data, len(cuts)),
                *(2 * descriptor.n_bins, descriptor.width, torch.get_num_threads()),
                *(spine_row.data_ptr(), hist_row.data_ptr()),
            )
            return
    if use_triton(backend, x.device):
        try:
            xf, fmt = format_for(x, descriptor)
            table, thr = device_tables(descriptor, fmt, x.device)
            _, counts = _triton.spine_and_histogram(xf, descriptor, table, thr, fmt, out=spine_row)
            hist_row.copy_(counts)
            return
        except Exception as exc:
            if backend == "triton":
                raise
            _triton.disable(exc)
            backend = "torch"
    spine_into(x, spine_row, backend)
    hist_row.copy_(reduce_histograms([x], descriptor, backend=backend).select(0, 0))


def spine_into(tensor: torch.Tensor, out_row: torch.Tensor, backend: str = "auto") -> None:
    """Write one tensor's spine into ``out_row`` (a contiguous ``[SPINE_WIDTH]`` float64 view).

    The collector's hot path: the same result as :func:`reduce_spines` with less per-call work.
    """
    dtype = tensor.dtype
    if (
        (dtype is torch.float32 or dtype is torch.float64)
        and tensor.is_contiguous()
        and not tensor.is_neg()
    ):
        x = tensor.detach()  # already flat-addressable: skip the reshape/copy checks
    else:
        x = prepare(tensor)
    if x.device.type == "cpu" and backend != "torch":
        lib = _native.loaded() if backend == "auto" else native_library(backend, x.device)
        if lib is not None:
            fn = lib.stepscope_spine_f32 if x.dtype == torch.float32 else lib.stepscope_spine_f64
            fn(x.data_ptr(), x.numel(), torch.get_num_threads(), out_row.data_ptr())
            return
    _device_spine(x, out_row, backend)


def native_spine_kernels(
    device: torch.device, backend: str = "auto"
) -> dict[torch.dtype | str, Any]:
    """The C spine entry points by input dtype, for callers that reach them without
    :func:`spine_into`'s per-call checks (the collector's hot path); empty off the CPU or
    without the C kernel.

    ``kernels[t.dtype](t.data_ptr(), t.numel(), threads, row_address)`` on a contiguous, not
    lazily negated CPU tensor is exactly what :func:`spine_into` runs for it, and
    ``kernels["many"]`` is the multi-tensor call :func:`spines_into` makes for many of them.
    """
    if device.type != "cpu" or backend == "torch":
        return {}
    lib = _native.loaded() if backend == "auto" else native_library(backend, device)
    if lib is None:
        return {}
    return {
        torch.float32: lib.stepscope_spine_f32,
        torch.float64: lib.stepscope_spine_f64,
        "many": lib.stepscope_spine_many,  # spines_into's call for many such tensors
    }
