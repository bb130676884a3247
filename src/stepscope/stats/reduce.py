"""Batched, device-side reductions: many tensors -> one fixed-width row each, no host sync.

:func:`reduce_spines` turns a list of tensors (one per site) into a ``[n_sites, SPINE_WIDTH]``
float64 tensor on their device; :func:`reduce_histograms` (:mod:`stepscope.stats.binning`) into
``[n_sites, descriptor.width]`` int64 counts. Decoding a row on the host
(``RunningStats.from_vector`` / ``Histogram.from_vector``) gives the same object as ``.update()``
on that tensor.

On the CPU a fused C kernel reads each tensor once (see ``_kernels.c``); elsewhere, or when the
C kernel is unavailable, a pure-torch path computes the same quantities with device ops only (no
``.item()``, no data-dependent shapes). Both paths are exact for every count and histogram bin.
The row layout (:data:`SPINE_FIELDS`, :data:`SPINE_WIDTH`, ...) and the numpy merge live in the
torch-free :mod:`stepscope.stats.layout`, one tensor's row written in place (:func:`spine_into`,
:func:`spine_and_histogram_into`, the kernel dispatch) in :mod:`stepscope.stats.spinerow`.

Example
-------
>>> import torch
>>> from stepscope.stats.layout import SPINE_FIELDS
>>> from stepscope.stats.reduce import reduce_spines
>>> rows = reduce_spines([torch.tensor([1.0, -2.0, float("nan")]), torch.zeros(4)])
>>> dict(zip(SPINE_FIELDS, rows[0].tolist()))["nan"], rows[1, 2].item()
(1.0, 4.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from stepscope.errors import Refusal
from stepscope.stats import _native
from stepscope.stats._backend import F32, F64, native_library, prepare
from stepscope.stats.binning import format_for, slot_tables
from stepscope.stats.descriptor import HistogramDescriptor
from stepscope.stats.layout import SPINE_WIDTH, merge_rows_with
from stepscope.stats.layout import merge_spine_rows as merge_numpy_rows
from stepscope.stats.spinerow import (
    _device_spine,
    spine_and_histogram_into,
    spine_into,
)

__all__ = [
    "host_spine",
    "merge_spine_into",
    "merge_spine_rows",
    "reduce_spines",
    "spines_into",
]

Rows = TypeVar("Rows", np.ndarray, torch.Tensor)


def reduce_spines(
    tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """Spine rows for a list of tensors.

    Parameters
    ----------
    tensors
        One tensor per site, all on the same device. Any real dtype; complex refuses
        ``stat_dtype_unsupported``.
    out
        Optional preallocated ``[len(tensors), SPINE_WIDTH]`` float64 buffer on that device (the
        collector's staging buffer). Returned when given.
    backend
        ``"auto"`` (C kernel on the CPU when available, the fused Triton kernel on CUDA when
        Triton is installed), ``"c"``, ``"torch"`` or ``"triton"``.

    Returns
    -------
    torch.Tensor
        ``[n, SPINE_WIDTH]`` float64, fields in :data:`SPINE_FIELDS` order. Counts are exact
        integers; ``min, max, absmax, mean, m2`` are NaN where a row has no finite value.
    """
    flats = [prepare(t) for t in tensors]
    device = flats[0].device if flats else torch.device("cpu")
    if out is None:
        out = torch.empty((len(flats), SPINE_WIDTH), dtype=torch.float64, device=device)
    elif out.shape != (len(flats), SPINE_WIDTH) or out.dtype != torch.float64:
        raise Refusal(
            "stat_payload_invalid",
            f"staging buffer has shape {tuple(out.shape)}/{out.dtype}, "
            f"need ({len(flats)}, {SPINE_WIDTH})/float64",
            ["allocate out with torch.empty((n_sites, SPINE_WIDTH), dtype=torch.float64)"],
        )
    lib = native_library(backend, device)
    if lib is not None and out.is_contiguous():
        threads = torch.get_num_threads()
        base = out.data_ptr()
        for i, x in enumerate(flats):
            fn = lib.stepscope_spine_f32 if x.dtype == torch.float32 else lib.stepscope_spine_f64
            fn(x.data_ptr(), x.numel(), threads, base + i * SPINE_WIDTH * 8)
        return out
    for i, x in enumerate(flats):
        _device_spine(x, out.select(0, i), backend)
    return out


def host_spine(tensor: torch.Tensor) -> tuple[np.ndarray, tuple[int, int] | None]:
    """One tensor's spine row on the host, and its exact int64 ``(min, max)`` for int64 input.

    What :meth:`RunningStats.update` reads back: the float64 row rounds integers above 2**53, so
    for a non-empty int64 tensor the extremes are also taken in int64 (``None`` otherwise).
    """
    row = reduce_spines([tensor])[0].cpu().numpy()
    if tensor.dtype is not torch.int64 or not tensor.numel():
        return row, None
    lo, hi = (int(v) for v in torch.aminmax(tensor.detach()))
    return row, (lo, hi)


def spines_into(
    tensors: Sequence[torch.Tensor],
    out: torch.Tensor,
    rows: Sequence[int],
    backend: str = "auto",
    hist: torch.Tensor | None = None,
    descriptor: HistogramDescriptor | None = None,
) -> None:
    """Spines of many tensors into rows of ``out``, in one native call on the CPU.

    The multi-tensor form of :func:`spine_into` (like ``torch._foreach_*``): the collector hands
    it every due tensor of a parameter-sized stream (gradient, parameter, update) at once, so the
    per-tensor Python and ctypes overhead is paid once per stream and step, not once per tensor.
    With ``hist`` the same call also overwrites each tensor's ``hist`` row with its histogram
    counts on ``descriptor``, reading each tensor once (:func:`spine_and_histogram_into` for many).

    Parameters
    ----------
    tensors
        The tensors, any real dtype (CPU ones go to the C kernel; others use :func:`spine_into`).
    out
        A contiguous ``[n_rows, SPINE_WIDTH]`` float64 buffer (the staging buffer).
    rows
        ``out`` row of each tensor.
    backend
        ``"auto"``, ``"c"`` or ``"torch"``.
    hist, descriptor
        Optional contiguous ``[n_rows, descriptor.width]`` int64 buffer (the staging histogram
        buffer) and its grid (default :class:`HistogramDescriptor()`).

    Examples
    --------
    >>> import torch
    >>> out = torch.zeros(3, SPINE_WIDTH, dtype=torch.float64)
    >>> spines_into([torch.ones(4), torch.arange(3.0)], out, [2, 0])
    >>> out[2, 0].item(), out[0, 10].item()  # total of row 2, sum of row 0
    (4.0, 3.0)
    >>> d = HistogramDescriptor()
    >>> h = torch.zeros(3, d.width, dtype=torch.int64)
    >>> spines_into([torch.ones(4)], out, [1], hist=h, descriptor=d)
    >>> int(h[1].sum()), int(h[1, d.n_bins + 48 * 4])  # 4 counts, all in the bin of 1.0
    (4, 4)
    """
    lib = None
    if backend != "torch" and out.device.type == "cpu" and out.is_contiguous():
        lib = _native.loaded() if backend == "auto" else native_library(backend, out.device)
    if hist is not None:
        _spines_and_histograms_into(lib, tensors, out, rows, backend, hist, descriptor)
        return
    if lib is None or out.dtype != torch.float64:
        for t, r in zip(tensors, rows):
            spine_into(t, out.select(0, r), backend)
        return
    keep, ptrs, kinds, outs = [], [], [], []  # keep: widened copies alive until the call returns
    base, stride = out.data_ptr(), SPINE_WIDTH * 8
    f32, f64 = torch.float32, torch.float64
    for t, r in zip(tensors, rows):
        if t.device.type != "cpu":
            spine_into(t, out.select(0, r), backend)
            continue
        if not ((t.dtype is f32 or t.dtype is f64) and t.is_contiguous() and not t.is_neg()):
            t = prepare(t)
            keep.append(t)
        ptrs.append((t.data_ptr(), t.numel()))
        kinds.append(t.dtype is f64)
        outs.append(base + r * stride)
    if not ptrs:
        return
    pn = np.array(ptrs, dtype=np.int64)  # [k, 2]: pointer, numel (user-space pointers < 2**63)
    p = np.ascontiguousarray(pn[:, 0])
    n = np.ascontiguousarray(pn[:, 1])
    k = np.array(kinds, dtype=np.int32)
    o = np.array(outs, dtype=np.int64)
    lib.stepscope_spine_many(
        len(ptrs),
        p.ctypes.data,
        n.ctypes.data,
        k.ctypes.data,
        torch.get_num_threads(),
        o.ctypes.data,
    )


def _spines_and_histograms_into(
    lib: Any,
    tensors: Sequence[torch.Tensor],
    out: torch.Tensor,
    rows: Sequence[int],
    backend: str,
    hist: torch.Tensor,
    descriptor: HistogramDescriptor | None,
) -> None:
    """:func:`spines_into` with histograms: one ``stepscope_spine_hist_many`` call for the CPU
    tensors it can take, :func:`spine_and_histogram_into` for the rest."""
    desc = descriptor or HistogramDescriptor()
    native = lib is not None and out.dtype == torch.float64 and hist.is_contiguous()
    if hist.shape[1:] != (desc.width,) or hist.dtype != torch.int64:
        raise Refusal(
            "stat_payload_invalid",
            f"histogram buffer has shape {tuple(hist.shape)}/{hist.dtype}, need (n, {desc.width})/int64",
            ["allocate hist with torch.zeros((n_rows, descriptor.width), dtype=torch.int64)"],
        )
    keep, ptrs, kinds, outs, houts = [], [], [], [], []
    f32, f64 = torch.float32, torch.float64
    for t, r in zip(tensors, rows):
        if native and t.device.type == "cpu":
            x = t.detach()
            if not ((x.dtype is f32 or x.dtype is f64) and x.is_contiguous() and not x.is_neg()):
                x = prepare(x)
            x, fmt = format_for(x, desc)  # float64 where the window reaches float32 subnormals
            keep.append(x)
            ptrs.append((x.data_ptr(), x.numel()))
            kinds.append(fmt == F64)
            outs.append(out.data_ptr() + r * SPINE_WIDTH * 8)
            houts.append(hist.data_ptr() + r * desc.width * 8)
        else:
            spine_and_histogram_into(t, out.select(0, r), hist.select(0, r), desc, backend)
    if not ptrs:
        return
    (t32, h32), (t64, h64) = slot_tables(desc, F32), slot_tables(desc, F64)
    pn = np.array(ptrs, dtype=np.int64)
    p, n = np.ascontiguousarray(pn[:, 0]), np.ascontiguousarray(pn[:, 1])
    k = np.array(kinds, dtype=np.int32)
    o, ho = np.array(outs, dtype=np.int64), np.array(houts, dtype=np.int64)
    tables = np.array([t32.ctypes.data, t64.ctypes.data], dtype=np.int64)
    thrs = np.array([h32.ctypes.data, h64.ctypes.data], dtype=np.int64)
    nthrs = np.array([len(h32), len(h64)], dtype=np.int32)
    lib.stepscope_spine_hist_many(
        *(len(ptrs), p.ctypes.data, n.ctypes.data, k.ctypes.data, torch.get_num_threads()),
        *(o.ctypes.data, ho.ctypes.data, tables.ctypes.data, thrs.ctypes.data, nthrs.ctypes.data),
        *(2 * desc.n_bins, desc.width),
    )


def merge_spine_into(row: torch.Tensor, part: torch.Tensor, backend: str = "auto") -> None:
    """Fold spine row ``part`` into ``row`` in place: :func:`merge_spine_rows` for one row.

    Both are contiguous ``[SPINE_WIDTH]`` float64 views on one device. On the CPU one native call
    does it (the same operations in the same order as :func:`merge_spine_rows`, so the folded row
    is bit for bit the same; a test checks it on edge cases); elsewhere, or without the C kernel,
    the device ops of :func:`merge_spine_rows`.

    Examples
    --------
    >>> import torch
    >>> from stepscope.stats.layout import SPINE_FIELDS
    >>> a = reduce_spines([torch.tensor([1.0, 2.0])])[0]
    >>> merge_spine_into(a, reduce_spines([torch.tensor([3.0])])[0])
    >>> a[0].item(), a[SPINE_FIELDS.index("mean")].item()
    (3.0, 2.0)
    """
    native = backend != "torch" and row.device.type == "cpu"
    if native and row.is_contiguous() and part.is_contiguous():
        lib = _native.loaded() if backend == "auto" else native_library(backend, row.device)
        if lib is not None:
            lib.stepscope_spine_merge(row.data_ptr(), part.data_ptr())
            return
    row.copy_(merge_spine_rows(row, part))


def merge_spine_rows(a: Rows, b: Rows) -> Rows:
    """Merge spine rows ``a`` and ``b`` (``[..., SPINE_WIDTH]``), numpy arrays or torch tensors.

    :func:`stepscope.stats.layout.merge_spine_rows` (counts and sums add, extremes by
    ``fmin``/``fmax``, Chan's formulas for ``mean``/``m2``). With tensors the same operations run
    in the same order on their device (no host synchronisation; bit for bit the numpy result) —
    the collector folds a module that fires twice in one step this way.
    """
    if isinstance(a, torch.Tensor):
        return merge_rows_with(torch, a, b)
    return merge_numpy_rows(a, b)
