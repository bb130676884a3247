"""Batched histogram reductions: many tensors -> one exact signed log2 count row each.

:func:`reduce_histograms` turns a list of tensors into ``[n_sites, descriptor.width]`` int64 counts
on their device (negative bins, positive bins, then ``SPECIAL_FIELDS``). A value's bin comes from
its bits: a slot table indexed by sign and binary exponent (:func:`slot_tables`) and exact integer
mantissa thresholds inside the octave (:meth:`HistogramDescriptor.mantissa_thresholds`), so bin
edges are exact. The C kernel reads the tables on the CPU; the Triton kernel and the pure-torch
path (device ops only, no host synchronisation) read the same tables on the device.

Example
-------
>>> import torch
>>> from stepscope.stats.descriptor import HistogramDescriptor
>>> d = HistogramDescriptor()
>>> row = reduce_histograms([torch.tensor([1.0, -1.0, 0.0])], d)[0]
>>> int(row[:d.n_bins].sum()), int(row[d.n_bins : 2 * d.n_bins].sum()), int(row[2 * d.n_bins])
(1, 1, 1)
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from stepscope.errors import Refusal
from stepscope.stats import _triton
from stepscope.stats._backend import F32, F64, native_library, prepare, use_triton
from stepscope.stats.descriptor import HistogramDescriptor

#: Bit set in a slot-table entry when the mantissa thresholds refine the slot (in-window exponent).
INWIN = 1 << 30


@functools.lru_cache(maxsize=32)
def slot_tables(desc: HistogramDescriptor, fmt: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Slot table indexed by ``sign << ebits | exponent``, and the exact mantissa thresholds.

    Entry = slot index, plus :data:`INWIN` for exponents inside the window. Exponent 0 (zero and
    subnormals) maps to underflow, the all-ones exponent to +/-inf; the kernels override zero and
    NaN from the mantissa.
    """
    ebits, mbits = fmt
    bias = (1 << (ebits - 1)) - 1
    nb, bpo = desc.n_bins, desc.bins_per_octave
    nb2 = 2 * nb
    emax = (1 << ebits) - 1
    table = np.zeros(1 << (ebits + 1), dtype=np.int32)
    for sign in (0, 1):
        under, over = nb2 + (2 if sign else 1), nb2 + (4 if sign else 3)
        for e in range(emax + 1):
            se = (sign << ebits) | e
            exp = e - bias
            if e == emax:
                table[se] = nb2 + (7 if sign else 6)
            elif e == 0 or exp < desc.lo_exp:  # subnormals lie below 2**(1-bias) <= 2**lo_exp
                table[se] = under
            elif exp >= desc.hi_exp:
                table[se] = over
            else:
                table[se] = ((exp - desc.lo_exp) * bpo + (0 if sign else nb)) | INWIN
    thr = np.array(desc.mantissa_thresholds(mbits), dtype=np.uint32 if mbits == 23 else np.uint64)
    return table, thr


def format_for(x: torch.Tensor, desc: HistogramDescriptor) -> tuple[torch.Tensor, tuple[int, int]]:
    """``x`` in the float format its bins are read in, and that format's bit widths."""
    # float32 subnormals lie below 2**-126; a window reaching below that is binned in float64.
    if x.dtype == torch.float32 and desc.lo_exp >= -126:
        return x, F32
    return x.to(torch.float64), F64


@functools.lru_cache(maxsize=32)
def device_tables(
    desc: HistogramDescriptor, fmt: tuple[int, int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables of :func:`slot_tables` as int64 tensors on ``device`` (cached per device)."""
    table, thr = slot_tables(desc, fmt)
    return torch.from_numpy(table.astype(np.int64)).to(device), torch.from_numpy(
        thr.astype(np.int64)
    ).to(device)


def _torch_histogram(x: torch.Tensor, desc: HistogramDescriptor, row: torch.Tensor) -> None:
    x, fmt = format_for(x, desc)
    if x.numel() == 0:
        return
    ebits, mbits = fmt
    table, thr = device_tables(desc, fmt, x.device)
    bits = x.view(torch.int32 if fmt == F32 else torch.int64).to(torch.int64)
    se = (bits >> mbits) & ((1 << (ebits + 1)) - 1)
    emax = (1 << ebits) - 1
    e = se & emax
    m = bits & ((1 << mbits) - 1)
    nb2 = 2 * desc.n_bins
    j = torch.bucketize(m, thr, right=True) if thr.numel() else torch.zeros_like(m)
    entry = table.index_select(0, se)
    idx = (entry & (INWIN - 1)) + ((entry >> 30) & 1) * j
    idx = torch.where((e == emax) & (m != 0), torch.full_like(idx, nb2 + 5), idx)
    idx = torch.where((e == 0) & (m == 0), torch.full_like(idx, nb2), idx)
    row.index_add_(0, idx, torch.ones_like(idx))


def reduce_histograms(
    tensors: Sequence[torch.Tensor],
    descriptor: HistogramDescriptor | None = None,
    out: torch.Tensor | None = None,
    *,
    backend: str = "auto",
) -> torch.Tensor:
    """Exact signed log2 histogram rows for a list of tensors.

    Parameters
    ----------
    tensors
        One tensor per site, on one device.
    descriptor
        The grid; default :class:`HistogramDescriptor()`.
    out
        Optional preallocated ``[n, descriptor.width]`` int64 buffer; it is zeroed first.
    backend
        ``"auto"``, ``"c"``, ``"torch"`` or ``"triton"``.

    Returns
    -------
    torch.Tensor
        ``[n, width]`` int64: negative bins, positive bins, then ``SPECIAL_FIELDS``.
    """
    desc = descriptor or HistogramDescriptor()
    flats = [prepare(t) for t in tensors]
    device = flats[0].device if flats else torch.device("cpu")
    if out is None:
        out = torch.zeros((len(flats), desc.width), dtype=torch.int64, device=device)
    else:
        if out.shape != (len(flats), desc.width) or out.dtype != torch.int64:
            raise Refusal(
                "stat_payload_invalid",
                f"histogram buffer has shape {tuple(out.shape)}, need ({len(flats)}, {desc.width})",
                ["allocate out with torch.zeros((n_sites, descriptor.width), dtype=torch.int64)"],
            )
        out.zero_()
    lib = native_library(backend, device)
    if lib is not None and out.is_contiguous():
        threads = torch.get_num_threads()
        for i, x in enumerate(flats):
            x, fmt = format_for(x, desc)
            table, thr = slot_tables(desc, fmt)
            fn = lib.stepscope_hist_f32 if fmt == F32 else lib.stepscope_hist_f64
            fn(
                x.data_ptr(),
                x.numel(),
                table.ctypes.data,  # an int: data_as (a ctypes.cast) costs ~10 us a call
                thr.ctypes.data,
                len(thr),
                2 * desc.n_bins,
                desc.width,
                threads,
                out.data_ptr() + i * desc.width * 8,
            )
        return out
    for i, x in enumerate(flats):
        row = out.select(0, i)
        if use_triton(backend, x.device):
            try:
                xf, fmt = format_for(x, desc)
                table_dev, thr_dev = device_tables(desc, fmt, x.device)
                row.add_(_triton.spine_and_histogram(xf, desc, table_dev, thr_dev, fmt)[1])
                continue
            except Exception as exc:  # telemetry never breaks the step: fall back, warn once
                if backend == "triton":
                    raise
                _triton.disable(exc)
        _torch_histogram(x, desc, row)
    return out
