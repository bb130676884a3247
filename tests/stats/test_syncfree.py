"""The device path never synchronises: replay the reductions on fake CUDA tensors (no GPU needed)
and audit every aten op they dispatch.

A reduction on an accelerator must not call ``.item()`` (``aten._local_scalar_dense``), build
tensors from host data (``aten.lift_fresh`` / a host tensor copied to the device), or produce a
data-dependent shape (``nonzero``, ``masked_select``, ``unique``: FakeTensor refuses those too).
``benchmarks/gpu/gpu_check.sh`` runs the same reductions on a real GPU under
``torch.cuda.set_sync_debug_mode("error")``.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from stepscope.collect.staging import Staging
from stepscope.stats import (
    SPINE_WIDTH,
    HistogramDescriptor,
    _triton,
    binning,
    merge_spine_rows,
    reduce_histograms,
    reduce_spines,
)

aten = torch.ops.aten
SYNCING = {
    aten._local_scalar_dense,  # .item(), bool(t), float(t)
    aten.lift_fresh,  # torch.tensor(host data)
    aten.nonzero,
    aten.masked_select,
    aten._unique2,
    aten.unique_consecutive,
}


class SyncAudit(TorchDispatchMode):
    """Records every op; flags syncing ops and any host tensor flowing in or out of an op."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.violations: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append(str(func))
        if func.overloadpacket in SYNCING:
            self.violations.append(f"{func}: synchronises or reads host data")
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self.violations.append(f"{func}: host tensor input {tuple(t.shape)}")
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self.violations.append(f"{func}: host tensor output {tuple(t.shape)}")
        return out


@pytest.fixture
def fake_cuda(monkeypatch):
    """A FakeTensorMode whose tensors claim to live on cuda:0; device-table caches reset.

    The Triton kernel cannot launch on fake tensors: its host side (grid from the shape, no
    data read) is audited separately, its combine pass in ``test_triton_combine_is_sync_free``.
    """
    monkeypatch.setattr(_triton, "available", lambda device: False)
    binning.device_tables.cache_clear()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode
    binning.device_tables.cache_clear()  # never leave fake tensors in the cache


def inputs() -> list[torch.Tensor]:
    return [
        torch.empty(1000, device="cuda"),
        torch.empty(64, 33, device="cuda", dtype=torch.float16),
        torch.empty(0, device="cuda"),
        torch.empty(17, device="cuda", dtype=torch.float64),
        torch.empty(8, 9, device="cuda", dtype=torch.bfloat16).t(),  # non-contiguous
    ]


def audited(fn) -> SyncAudit:
    with SyncAudit() as audit:
        fn()
    return audit


def test_spine_reduction_is_sync_free_on_a_fake_cuda_tensor(fake_cuda):
    xs = inputs()
    assert xs[0].device.type == "cuda"
    audit = audited(lambda: reduce_spines(xs))
    assert audit.ops, "the audit saw no op: it is not measuring anything"
    assert audit.violations == []


def test_histogram_reduction_is_sync_free_per_call(fake_cuda):
    xs, desc = inputs(), HistogramDescriptor(bins_per_octave=8)
    reduce_histograms(xs, desc)  # first call: the slot tables go to the device once, cached
    audit = audited(lambda: reduce_histograms(xs, desc))
    assert audit.ops and audit.violations == []


def test_collector_staging_path_is_sync_free():
    """What a hook runs: spine_into, the exact fold of a second call, histogram accumulation.

    On the meta device (data-free like FakeTensor; the same audit flags any host tensor and any
    sync): the Python bindings of ``copy_`` and of indexing ask for a real CUDA runtime even for
    fake CUDA tensors.
    """
    binning.device_tables.cache_clear()
    desc = HistogramDescriptor()
    st = Staging(3, torch.device("meta"), desc)
    x = torch.empty(1000, device="meta")
    y = torch.empty(64, 33, device="meta", dtype=torch.float16)
    st.write(0, x, histogram=True)  # warm the device tables
    st.reset()

    def hook_work() -> None:
        st.write(0, x, histogram=True)
        st.write(0, y, histogram=True)  # same row twice in a step: merged on the device
        st.write(1, y, histogram=False)
        merge_spine_rows(st.spines[0], st.spines[1])

    audit = audited(hook_work)
    binning.device_tables.cache_clear()
    assert audit.ops and audit.violations == []
    assert st.spines.shape == (3, SPINE_WIDTH)


def test_the_audit_catches_a_host_sync(fake_cuda):
    """The audit itself fails on what it must catch: ``.item()`` and host data sent to the device."""
    x = inputs()[0]
    item = SyncAudit()
    with pytest.raises(DataDependentOutputException), item:  # FakeTensor cannot answer .item()
        bool(x.sum() > 0)
    assert any("_local_scalar_dense" in v for v in item.violations)
    upload = audited(lambda: x + torch.ones(1).to(x.device))
    assert any("host tensor input" in v for v in upload.violations)


def test_triton_combine_is_sync_free(fake_cuda):
    """Pass 2 of the fused device kernel: block partials -> spine row, device ops only."""
    part = torch.empty(37, 12, dtype=torch.float64, device="cuda")
    audit = audited(lambda: _triton._combine(part, 37 * 1024 - 5))
    assert audit.ops and audit.violations == []
