"""On a CUDA device the pure-torch kernels give exactly the CPU rows, without host syncs.

Skipped without CUDA; run by ``benchmarks/gpu/gpu_check.sh`` on a GPU machine.
"""

import pytest
import torch

from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_cuda_rows_equal_cpu_rows(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100_003, generator=g, dtype=torch.float64) * 1e3
    x[::101] = 0.0
    x[::103] = float("nan")
    x[::107] = float("inf")
    x = x.to(dtype)
    desc = HistogramDescriptor(bins_per_octave=8)
    cpu_s = reduce_spines([x])
    cpu_h = reduce_histograms([x], desc)
    dev_s = reduce_spines([x.cuda()])
    dev_h = reduce_histograms([x.cuda()], desc)
    assert dev_s.device.type == "cuda" and dev_h.device.type == "cuda"
    assert torch.equal(dev_h.cpu(), cpu_h)
    torch.testing.assert_close(dev_s.cpu(), cpu_s, rtol=1e-9, atol=0, equal_nan=True)


@cuda
def test_cuda_reductions_do_not_synchronise():
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any implicit device->host sync raises
    try:
        reduce_spines([x, x[:10]])
        reduce_histograms([x])
    finally:
        torch.cuda.set_sync_debug_mode("default")


@cuda
def test_cuda_staging_hook_work_does_not_synchronise():
    """What a forward/backward hook runs on CUDA: spine, exact fold, histogram; no sync at all."""
    from stepscope.collect.staging import Staging

    desc = HistogramDescriptor()
    st = Staging(2, torch.device("cuda"), desc)
    x = torch.randn(1 << 16, device="cuda")
    y = torch.randn(300, device="cuda", dtype=torch.float16)
    st.write(0, x, histogram=True)  # warm the cached device tables (one upload per descriptor)
    st.reset()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        st.write(0, x, histogram=True)
        st.write(0, y, histogram=True)
        st.write(1, y, histogram=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = reduce_spines([torch.cat([x.cpu(), y.cpu().float()])])[0]
    torch.testing.assert_close(st.spines[0].cpu(), want, rtol=1e-9, atol=1e-9, equal_nan=True)
