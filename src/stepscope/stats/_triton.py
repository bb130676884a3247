"""The fused device kernel: spine and histogram of a tensor in one read, with Triton.

Pass 1 (one Triton program per block of :data:`BLOCK` elements) reads each element once and
writes the block's partial spine (counts, finite min/max, float64 sums, and the block's own mean
and ``m2``) into a ``[n_blocks, 12]`` float64 buffer; with a histogram it also bins the block
(slot table and exact mantissa thresholds, as the C kernel) and adds the block's counts to the
row with one atomic add per bin. Pass 2 combines the partials with device ops (sums, min/max and
Chan's formula for ``m2``). No host synchronisation, no data-dependent shape.

Counts are bit-for-bit those of the C kernel (tests run the kernel on the CPU with Triton's
interpreter, ``TRITON_INTERPRET=1``); float sums differ only by summation order.

Used on CUDA tensors when Triton is installed (``available()``); otherwise the pure-torch path of
:mod:`stepscope.stats.reduce` runs.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from typing import overload

import torch

from stepscope.stats.descriptor import HistogramDescriptor

BLOCK = 1024
#: Columns of a block's partial row.
_P = ("finite", "zero", "negative", "nan", "posinf", "neginf", "min", "max", "sum", "sum_sq",
      "sum_abs", "m2")  # fmt: skip


_STATE: dict[str, str | None] = {"error": None}


def installed() -> bool:
    """Triton is importable and has not failed in this process."""
    return _STATE["error"] is None and importlib.util.find_spec("triton") is not None


def available(device: torch.device) -> bool:
    """Whether the Triton path can serve ``device`` (CUDA, or the CPU under the interpreter)."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return False
    return installed()


def disable(exc: BaseException) -> None:
    """Stop using Triton in this process after a failure (warn once; the torch path takes over)."""
    if _STATE["error"] is None:
        _STATE["error"] = f"{type(exc).__name__}: {exc}"
        warnings.warn(
            f"stepscope: the Triton kernel failed ({_STATE['error']}); using the pure-torch "
            "device path for the rest of this process",
            RuntimeWarning,
            stacklevel=3,
        )


@functools.lru_cache(maxsize=2)
def _kernel(interpret: bool):
    """Build the kernel (``interpret`` keys the cache: Triton reads the flag at decoration)."""
    import triton  # lazy: optional extra
    import triton.language as tl  # lazy: optional extra

    @triton.jit
    def spine_hist(
        x_ptr, part_ptr, hist_ptr, table_ptr, thr_ptr, n,
        MBITS: tl.constexpr, EBITS: tl.constexpr, NTHR: tl.constexpr, NB2: tl.constexpr,
        WIDTH_P2: tl.constexpr, HIST: tl.constexpr, IS64: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        x = tl.load(x_ptr + offs, mask=m, other=0.0)
        if IS64:
            u = x.to(tl.int64, bitcast=True)
        else:
            u = x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
        absmask = (1 << (EBITS + MBITS)) - 1
        expmask = ((1 << EBITS) - 1) << MBITS
        a = u & absmask
        fin = m & (a < expmask)
        nan_ = m & (a > expmask)
        isinf = m & (a == expmask)
        sign = (u >> (EBITS + MBITS)) & 1
        zero = m & (a == 0)
        neg = fin & (sign == 1) & (a != 0)
        xd = tl.where(fin, x.to(tl.float64), 0.0)
        one = tl.full([BLOCK], 1.0, tl.float64)
        nfin = tl.sum(tl.where(fin, one, 0.0), axis=0)
        s = tl.sum(xd, axis=0)
        mean = s / tl.maximum(nfin, 1.0)
        d = tl.where(fin, xd - mean, 0.0)
        row = part_ptr + pid.to(tl.int64) * 12
        tl.store(row + 0, nfin)
        tl.store(row + 1, tl.sum(tl.where(zero, one, 0.0), axis=0))
        tl.store(row + 2, tl.sum(tl.where(neg, one, 0.0), axis=0))
        tl.store(row + 3, tl.sum(tl.where(nan_, one, 0.0), axis=0))
        tl.store(row + 4, tl.sum(tl.where(isinf & (sign == 0), one, 0.0), axis=0))
        tl.store(row + 5, tl.sum(tl.where(isinf & (sign == 1), one, 0.0), axis=0))
        tl.store(row + 6, tl.min(tl.where(fin, xd, float("inf")), axis=0))
        tl.store(row + 7, tl.max(tl.where(fin, xd, float("-inf")), axis=0))
        tl.store(row + 8, s)
        tl.store(row + 9, tl.sum(xd * xd, axis=0))
        tl.store(row + 10, tl.sum(tl.abs(xd), axis=0))
        tl.store(row + 11, tl.sum(d * d, axis=0))
        if HIST:
            se = (u >> MBITS) & ((1 << (EBITS + 1)) - 1)  # logical: u is signed for float64
            e = se & ((1 << EBITS) - 1)
            mant = u & ((1 << MBITS) - 1)
            entry = tl.load(table_ptr + se, mask=m, other=0)
            j = tl.zeros([BLOCK], dtype=tl.int64)
            for q in tl.static_range(NTHR):
                j += (mant >= tl.load(thr_ptr + q)).to(tl.int64)
            slot = (entry & 0x3FFFFFFF) + ((entry >> 30) & 1) * j
            slot = tl.where((e == (1 << EBITS) - 1) & (mant != 0), NB2 + 5, slot)
            slot = tl.where(a == 0, NB2, slot)
            slot = tl.where(m, slot, WIDTH_P2 - 1)  # padding bin, never part of the row
            counts = tl.histogram(slot.to(tl.int32), WIDTH_P2)
            tl.atomic_add(hist_ptr + tl.arange(0, WIDTH_P2), counts.to(tl.int64))

    return spine_hist


@overload
def spine_and_histogram(
    x: torch.Tensor,
    desc: HistogramDescriptor,
    table: torch.Tensor | None = None,
    thr: torch.Tensor | None = None,
    fmt: tuple[int, int] = (8, 23),
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def spine_and_histogram(
    x: torch.Tensor,
    desc: None,
    table: torch.Tensor | None = None,
    thr: torch.Tensor | None = None,
    fmt: tuple[int, int] = (8, 23),
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, None]: ...


def spine_and_histogram(
    x: torch.Tensor,
    desc: HistogramDescriptor | None,
    table: torch.Tensor | None = None,
    thr: torch.Tensor | None = None,
    fmt: tuple[int, int] = (8, 23),
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Spine row (``[SPINE_WIDTH]`` float64) and, with ``desc``, the histogram row of flat ``x``.

    ``x`` is a contiguous float32 or float64 tensor (``fmt`` its exponent and mantissa bits);
    ``table``/``thr`` the device slot table and thresholds of :func:`stepscope.stats.binning.device_tables`;
    the spine is written into ``out`` when given.
    """
    n = x.numel()
    nblocks = max(1, -(-n // BLOCK))
    part = torch.empty((nblocks, len(_P)), dtype=torch.float64, device=x.device)
    hist = None
    width = 0
    width_p2 = 1
    if desc is not None:
        width = desc.width
        width_p2 = 1 << width.bit_length()  # > width: the last bin pads masked lanes
        hist = torch.zeros(width_p2, dtype=torch.int64, device=x.device)
    dummy = part  # unused pointers when no histogram is taken
    kernel = _kernel(os.environ.get("TRITON_INTERPRET") == "1")
    kernel[(nblocks,)](
        x,
        part,
        hist if hist is not None else dummy,
        table if table is not None else dummy,
        thr if thr is not None else dummy,
        n,
        MBITS=fmt[1],
        EBITS=fmt[0],
        NTHR=0 if thr is None else thr.numel(),
        NB2=0 if desc is None else 2 * desc.n_bins,
        WIDTH_P2=width_p2,
        HIST=desc is not None,
        IS64=x.dtype == torch.float64,
        BLOCK=BLOCK,
    )
    return _combine(part, n, out), None if hist is None else hist[:width]


def _combine(part: torch.Tensor, n: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Pass 2: the spine row from the block partials (device ops only; columns by ``select``,
    plain indexing may build an index tensor on the host)."""
    f64, nan = torch.float64, float("nan")
    col = {name: part.select(1, k) for k, name in enumerate(_P)}
    counts = part.narrow(1, 0, 6).sum(dim=0)
    nb = col["finite"]
    finite = counts.select(0, 0)
    has = finite > 0
    s = col["sum"].sum()
    mean = s / finite
    block_mean = torch.where(nb > 0, col["sum"] / nb.clamp(min=1.0), mean)
    m2 = col["m2"].sum() + (nb * (block_mean - mean).square()).sum()
    mn = torch.where(has, col["min"].amin(), nan)
    mx = torch.where(has, col["max"].amax(), nan)
    return torch.stack(
        (
            part.new_full((), n, dtype=f64),
            *counts.unbind(),
            mn,
            mx,
            torch.maximum(mn.abs(), mx.abs()),
            s,
            col["sum_sq"].sum(),
            col["sum_abs"].sum(),
            torch.where(has, mean, nan),
            torch.where(has, m2, nan),
        ),
        out=out,
    )
