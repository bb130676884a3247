"""Cases for the fused Triton kernel under Triton's CPU interpreter.

Run by ``test_triton.py`` in a subprocess with ``TRITON_INTERPRET=1`` set before anything imports
triton (Triton decides interpreter vs compiler at import time), not collected directly.
"""

import os

import pytest
import torch

from stepscope.stats import (
    SPINE_FIELDS,
    SPINE_WIDTH,
    HistogramDescriptor,
    reduce_histograms,
    reduce_spines,
    spine_and_histogram_into,
)

assert os.environ.get("TRITON_INTERPRET") == "1", "run through tests/stats/test_triton.py"
pytest.importorskip("triton")

COUNTS = len(SPINE_FIELDS[:7])


def data(dtype: torch.dtype, n: int = 5003, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-60, 30, (n,), generator=g).double()
    )
    x[::50] = 0.0
    x[::97] = float("nan")
    x[::101] = float("inf")
    x[::103] = -float("inf")
    x[n // 2] = -0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bpo", [1, 4, 8])
def test_triton_histogram_counts_equal_the_c_kernel_bit_for_bit(dtype, bpo):
    x = data(dtype)
    desc = HistogramDescriptor(bins_per_octave=bpo)
    want = reduce_histograms([x], desc, backend="c")
    assert torch.equal(reduce_histograms([x], desc, backend="triton"), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 1023, 1024, 5003])
def test_triton_spine_equals_the_c_kernel(dtype, n):
    x = data(dtype, n=n) if n else torch.empty(0, dtype=dtype)
    want = reduce_spines([x], backend="c")[0]
    got = reduce_spines([x], backend="triton")[0]
    assert torch.equal(got[:COUNTS], want[:COUNTS])  # counts exact
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-300, equal_nan=True)


def test_fused_call_writes_both_rows_in_one_kernel(monkeypatch):
    from stepscope.stats import _triton

    launches = []
    real = _triton.spine_and_histogram
    monkeypatch.setattr(
        _triton, "spine_and_histogram", lambda *a, **k: launches.append(1) or real(*a, **k)
    )
    x, desc = data(torch.float32), HistogramDescriptor()
    spine = torch.empty(SPINE_WIDTH, dtype=torch.float64)
    hist = torch.full((desc.width,), -1, dtype=torch.int64)
    spine_and_histogram_into(x, spine, hist, desc, backend="triton")
    assert launches == [1]
    assert torch.equal(hist, reduce_histograms([x], desc, backend="c")[0])
    torch.testing.assert_close(spine, reduce_spines([x], backend="c")[0], equal_nan=True)
