"""Multi-tensor reductions: one native call per parameter-sized stream and step, rows identical
to reducing each tensor on its own."""

import pytest
import torch
import torch.nn.functional as F

from stepscope import Refusal
from stepscope.collect import Cadence, HistoryCollector, WatchSettings
from stepscope.collect import staging as staging_mod
from stepscope.stats import (
    SPINE_WIDTH,
    HistogramDescriptor,
    _native,
    reduce_histograms,
    reduce_spines,
    spine_and_histogram_into,
    spines_into,
)


def mixed_tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    x = torch.randn(300, 7, generator=g)
    x[0, 0], x[1, 1], x[2, 2] = float("nan"), float("inf"), 0.0
    return [
        x,
        x.t(),  # non-contiguous
        torch._neg_view(x),  # lazy negation
        x.double(),
        x.half(),
        torch.empty(0),
        torch.randint(-5, 5, (33,), generator=g),
        x[:, 3],
    ]


def test_spines_into_rows_equal_one_reduction_per_tensor(backend):
    ts = mixed_tensors()
    rows = [7, 0, 3, 1, 6, 2, 4, 5]
    out = torch.full((8, SPINE_WIDTH), -1.0, dtype=torch.float64)
    spines_into(ts, out, rows, backend)
    for t, r in zip(ts, rows):
        want = reduce_spines([t], backend=backend)[0]
        torch.testing.assert_close(out[r], want, rtol=0, atol=0, equal_nan=True)


def test_one_native_call_per_parameter_stream_and_step(monkeypatch):
    if _native.backend_info()["cpu"] != "c":
        import pytest

        pytest.skip("C kernel unavailable")
    calls: list[int] = []
    real = staging_mod.spines_into

    def counting(tensors, out, rows, backend="auto"):
        calls.append(len(tensors))
        return real(tensors, out, rows, backend)

    real_kernels = staging_mod.native_spine_kernels

    def counting_kernels(device, backend="auto"):  # the collector's own one-call path
        kernels = dict(real_kernels(device, backend))
        many = kernels["many"]
        kernels["many"] = lambda count, *rest: calls.append(count) or many(count, *rest)
        return kernels

    per_tensor: list[int] = []
    real_one = staging_mod.spine_into
    monkeypatch.setattr(staging_mod, "spines_into", counting)
    monkeypatch.setattr(staging_mod, "native_spine_kernels", counting_kernels)
    monkeypatch.setattr(
        staging_mod, "spine_into", lambda *a, **k: per_tensor.append(1) or real_one(*a, **k)
    )
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 36, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    col = HistoryCollector(
        model,
        streams=("gradient", "parameter", "update"),
        cadence=Cadence(1, None),
        settings=WatchSettings(),
    )
    try:
        for _ in range(3):
            with col.step(opt):
                loss = F.cross_entropy(model(torch.randn(8, 1, 8, 8)), torch.randint(0, 10, (8,)))
                opt.zero_grad()
                loss.backward()
                opt.step()
        n_params = len(list(model.parameters()))
        assert calls == [n_params] * 9  # 3 streams x 3 steps, each with every parameter at once
        assert per_tensor == []
        # and the recorded rows are the per-tensor spines (independent reduction, after the step)
        batches = {b.stream: b for b in col.last_batches}
        params = dict(model.named_parameters())
        names = {s.site_id: s.name for s in col.sites}
        for k, sid in enumerate(batches["parameter"].site_ids):
            want = reduce_spines([params[names[sid]]])[0].numpy()
            assert (batches["parameter"].spines[k] == want).all()
    finally:
        col.close()


def _fold_cases() -> list[torch.Tensor]:
    """Tensors whose spines exercise every branch of the fold: no finite value, signed zeros,
    NaN/inf extremes, empty, a huge mean next to a tiny one."""
    g = torch.Generator().manual_seed(11)
    return [
        torch.randn(257, generator=g),
        torch.randn(31, generator=g) * 1e6 + 3e8,
        torch.tensor([float("nan"), float("inf")]),
        torch.tensor([-float("inf")]),
        torch.tensor([0.0, -0.0]),
        torch.tensor([-0.0]),
        torch.tensor([0.0]),
        torch.empty(0),
        torch.randn(5, generator=g).double() * 1e-300,
        torch.tensor([float("nan")] * 3),
    ]


def test_native_fold_is_bit_for_bit_the_merge_of_two_rows(backend):
    """merge_spine_into (one native call on the CPU) against merge_spine_rows with numpy and with
    torch ops, every ordered pair of edge-case rows, compared by their bits (signed zeros too)."""
    import numpy as np

    from stepscope.stats import merge_spine_rows
    from stepscope.stats.reduce import merge_spine_into

    rows = [reduce_spines([t], backend=backend)[0] for t in _fold_cases()]
    for a in rows:
        for b in rows:
            want_np = merge_spine_rows(a.numpy(), b.numpy())
            want_torch = merge_spine_rows(a.clone(), b.clone())
            got = a.clone()
            merge_spine_into(got, b.clone(), backend)
            bits = got.numpy().view(np.int64)
            assert (bits == want_np.view(np.int64)).all(), (a, b, got, want_np)
            assert (bits == want_torch.numpy().view(np.int64)).all()


def test_a_module_called_twice_folds_its_row_exactly():
    """Staging's fold of a repeated call equals the merge of the two calls' own rows."""
    import numpy as np

    from stepscope.collect.staging import Staging
    from stepscope.stats import HistogramDescriptor, merge_spine_rows

    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, 9, generator=g), torch.randn(17, generator=g).half()
    st = Staging(2, torch.device("cpu"), HistogramDescriptor())
    st.write(1, x, histogram=False)
    st.write(1, y, histogram=False)
    want = merge_spine_rows(reduce_spines([x])[0].numpy(), reduce_spines([y])[0].numpy())
    assert (st.spines[1].numpy().view(np.int64) == want.view(np.int64)).all()
    assert st.fired[1] == 2


# ------------------------------------------- spines and histograms in one read (histogram steps)


def histogram_tensors() -> list[torch.Tensor]:
    """mixed_tensors plus ones that take each C histogram path: a large float32 tensor (keys),
    one with a constant block and ReLU zeros, and a large float64 one."""
    g = torch.Generator().manual_seed(6)
    big = torch.randn(70_001, generator=g) * torch.exp2(
        torch.randint(-50, 20, (70_001,), generator=g)
    )
    big[::113] = float("nan")
    big[5::229] = -float("inf")
    big[10_000:12_048] = 0.75
    relu = torch.relu(torch.randn(40_000, generator=g))
    return [*mixed_tensors(), big, relu, big.double(), big[::3]]


DESCRIPTORS = {
    "default": HistogramDescriptor(),
    "bpo8": HistogramDescriptor(bins_per_octave=8),  # the slot-table path
    "subnormal_window": HistogramDescriptor(lo_exp=-140, hi_exp=10),  # float32 binned as float64
}


@pytest.mark.parametrize("dname", list(DESCRIPTORS))
def test_spines_into_with_histograms_equals_separate_reductions_bit_for_bit(dname, backend):
    desc = DESCRIPTORS[dname]
    ts = histogram_tensors()
    rows = list(range(len(ts)))[::-1]
    out = torch.full((len(ts), SPINE_WIDTH), -1.0, dtype=torch.float64)
    hist = torch.full((len(ts), desc.width), 7, dtype=torch.int64)  # overwritten, not added to
    spines_into(ts, out, rows, backend, hist=hist, descriptor=desc)
    for t, r in zip(ts, rows):
        want = reduce_spines([t], backend=backend)[0]
        torch.testing.assert_close(out[r], want, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(hist[r], reduce_histograms([t], desc, backend=backend)[0])
    if backend == "c":  # and the fused kernel counts what the pure-torch path counts
        for t, r in zip(ts, rows):
            assert torch.equal(hist[r], reduce_histograms([t], desc, backend="torch")[0])


@pytest.mark.parametrize("dname", list(DESCRIPTORS))
def test_spine_and_histogram_into_reads_once_and_equals_the_two_kernels(dname, backend):
    desc = DESCRIPTORS[dname]
    for t in histogram_tensors():
        spine = torch.empty(SPINE_WIDTH, dtype=torch.float64)
        hist = torch.full((desc.width,), 3, dtype=torch.int64)
        spine_and_histogram_into(t, spine, hist, desc, backend)
        want = reduce_spines([t], backend=backend)[0]
        torch.testing.assert_close(spine, want, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(hist, reduce_histograms([t], desc, backend=backend)[0])


def test_histogram_buffer_of_the_wrong_width_refuses():
    d = HistogramDescriptor()
    with pytest.raises(Refusal) as err:
        spines_into(
            [torch.ones(3)],
            torch.zeros(1, SPINE_WIDTH, dtype=torch.float64),
            [0],
            hist=torch.zeros(1, d.width + 1, dtype=torch.int64),
            descriptor=d,
        )
    assert err.value.code == "stat_payload_invalid"


def test_threaded_kernels_count_like_one_thread():
    """Tensors above the kernels' threading threshold (262144 elements) split into contiguous
    ranges, one per thread, each with its own fast blocks and histogram keys: the same counts,
    extremes and histograms as one thread, and the same sums to round-off."""
    if _native.backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable")
    from stepscope.stats._backend import F32 as _F32
    from stepscope.stats.binning import slot_tables as _tables

    lib = _native.load()
    big = histogram_tensors()[-4]  # 70k elements with NaN, -inf and a constant block
    x = torch.cat([big] * 6)  # 420k elements
    desc = HistogramDescriptor()
    table, thr = _tables(desc, _F32)
    rows = []
    for threads in (1, 3):
        spine = torch.empty(SPINE_WIDTH, dtype=torch.float64)
        hist = torch.zeros(desc.width, dtype=torch.int64)
        fused = torch.zeros(desc.width, dtype=torch.int64)
        fspine = torch.empty(SPINE_WIDTH, dtype=torch.float64)
        args = (table.ctypes.data, thr.ctypes.data, len(thr), 2 * desc.n_bins, desc.width, threads)
        lib.stepscope_spine_f32(x.data_ptr(), x.numel(), threads, spine.data_ptr())
        lib.stepscope_hist_f32(x.data_ptr(), x.numel(), *args, hist.data_ptr())
        lib.stepscope_spine_hist_f32(
            x.data_ptr(), x.numel(), *args, fspine.data_ptr(), fused.data_ptr()
        )
        assert torch.equal(hist, fused) and torch.equal(spine[:10], fspine[:10])
        rows.append((spine, hist))
    (s1, h1), (s3, h3) = rows
    assert torch.equal(h1, h3) and torch.equal(h1, reduce_histograms([x], desc, backend="torch")[0])
    assert torch.equal(s1[:10], s3[:10])
    torch.testing.assert_close(s1, s3, rtol=1e-12, atol=0.0)
