"""What the spine and histogram reductions share: the input view and the choice of kernel.

:func:`prepare` turns any real tensor into the flat float32/float64 view the kernels read (or
refuses ``stat_dtype_unsupported``); :func:`native_library` and :func:`use_triton` pick the C kernel
on the CPU and the Triton kernel on CUDA for a ``backend`` name (``"auto"``, ``"c"``, ``"torch"``,
``"triton"``), refusing ``settings_invalid`` for a backend that cannot serve.
"""

from __future__ import annotations

import ctypes

import torch

from stepscope.errors import Refusal
from stepscope.stats import _native, _triton

#: (exponent bits, mantissa bits) of the two formats the kernels read.
F32 = (8, 23)
F64 = (11, 52)
BACKENDS = ("auto", "c", "torch", "triton")


def prepare(t: torch.Tensor) -> torch.Tensor:
    """A flat, contiguous float32/float64 view (or exact widening copy) of ``t``."""
    if not isinstance(t, torch.Tensor):
        raise Refusal(
            "stat_dtype_unsupported",
            f"expected a torch.Tensor, got {type(t).__name__}",
            ["pass tensors (torch.as_tensor(x))"],
        )
    if t.is_nested or t.layout is not torch.strided:
        what = "nested" if t.is_nested else str(t.layout).replace("torch.", "")
        raise Refusal(
            "stat_dtype_unsupported",
            f"a {what} tensor has no flat element order to reduce",
            [
                "reduce the stored values: t.coalesce().values() (sparse COO) or t.values() "
                "(CSR/CSC); a nested tensor: torch.cat([x.reshape(-1) for x in t.unbind()])",
                "or t.to_dense() when the implicit zeros should count",
            ],
        )
    t = t.detach()
    if t.is_neg() or t.is_conj():  # lazy views: the memory holds the un-negated values
        t = t.resolve_conj().resolve_neg()
    if t.is_complex():
        raise Refusal(
            "stat_dtype_unsupported",
            f"complex tensors ({t.dtype}) have no ordered spine or signed histogram",
            ["reduce t.real and t.imag (or t.abs()) as separate sites"],
        )
    if t.dtype in (torch.float32, torch.float64):
        pass
    elif t.dtype in (
        torch.float16,
        torch.bfloat16,
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
    ):
        t = t.to(torch.float32)  # exact widening
    elif t.dtype in (torch.int32, torch.int64):
        t = t.to(torch.float64)  # exact below 2**53
    elif t.is_floating_point():  # float8 variants etc.
        t = t.to(torch.float32)
    else:
        raise Refusal(
            "stat_dtype_unsupported",
            f"dtype {t.dtype} is not supported",
            ["convert to a floating or integer dtype first"],
        )
    return t.reshape(-1).contiguous()


def native_library(backend: str, device: torch.device) -> ctypes.CDLL | None:
    """The loaded C kernel library for ``backend`` on ``device``, or None (use the device ops).

    ``"c"`` refuses ``settings_invalid`` when the library is unavailable; an unknown backend name
    refuses too.
    """
    if backend not in BACKENDS:
        raise Refusal(
            "settings_invalid",
            f"unknown kernel backend {backend!r}",
            ["use auto, c, torch or triton"],
        )
    if backend in ("torch", "triton") or device.type != "cpu":
        return None
    lib = _native.load()
    if lib is None and backend == "c":
        raise Refusal(
            "settings_invalid",
            "the C kernel was requested but is unavailable: " + _native.backend_info()["detail"],
            ["install a C compiler (gcc) or use backend='auto'"],
        )
    return lib


def use_triton(backend: str, device: torch.device) -> bool:
    """Whether the fused Triton kernel serves ``device`` (``"triton"`` refuses when it cannot)."""
    if backend == "triton":
        if not _triton.available(device):
            raise Refusal(
                "settings_invalid",
                f"the Triton kernel was requested but cannot serve {device} "
                f"({_triton._STATE['error'] or 'needs CUDA and triton, or TRITON_INTERPRET=1'})",
                ["use backend='auto'"],
            )
        return True
    return backend == "auto" and device.type == "cuda" and _triton.available(device)
