"""Kernel exactness at the edges: lazy negated/conjugated views, int64 beyond 2**53, and the
accuracy of the float64 sums against ``math.fsum`` on adversarial inputs."""

import math

import numpy as np
import pytest
import torch

from stepscope.stats import (
    SPINE_FIELDS,
    SPINE_WIDTH,
    Histogram,
    HistogramDescriptor,
    RunningStats,
    reduce_histograms,
    reduce_spines,
    spine_into,
)
from tests.stats.test_spine import reference

FIELD = {name: k for k, name in enumerate(SPINE_FIELDS)}


def lazy_views() -> dict[str, torch.Tensor]:
    """Tensors whose memory holds the opposite sign of their values (neg bit set)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4099, generator=g) * 5
    x[::7] = 0.0
    x[::11] = float("inf")
    z = torch.complex(torch.randn(3001, generator=g), torch.randn(3001, generator=g) + 1.0)
    views = {
        "neg_view_f32": torch._neg_view(x),
        "neg_view_f64": torch._neg_view(x.double()),
        "conj_imag": z.conj().imag,  # strided neg view of the imaginary parts
        "conj_imag_contiguous": torch._neg_view(z.imag.contiguous()),
    }
    for name, v in views.items():
        assert v.is_neg(), name  # the case under test really is a lazy view
    return views


def materialised(v: torch.Tensor) -> torch.Tensor:
    """The view's values in fresh memory, built from Python floats (independent of the view)."""
    return torch.tensor(v.tolist(), dtype=v.dtype)


@pytest.mark.parametrize("name", list(lazy_views()))
def test_spines_of_negated_views_equal_spines_of_their_values(name, backend):
    v = lazy_views()[name]
    want = reduce_spines([materialised(v)], backend=backend)
    got = reduce_spines([v], backend=backend)
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
    ref = materialised(v)
    assert got[0, FIELD["negative"]] == ((ref < 0) & torch.isfinite(ref)).sum()
    row = torch.empty(SPINE_WIDTH, dtype=torch.float64)
    spine_into(v, row, backend)  # the collector's hot path
    torch.testing.assert_close(row, want[0], rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("name", list(lazy_views()))
def test_histograms_of_negated_views_count_the_right_sign(name, backend):
    v = lazy_views()[name]
    desc = HistogramDescriptor(bins_per_octave=8)
    want = reduce_histograms([materialised(v)], desc, backend=backend)
    assert torch.equal(reduce_histograms([v], desc, backend=backend), want)


def test_running_stats_and_histogram_objects_see_the_negated_values():
    v = lazy_views()["neg_view_f32"]
    s, h = RunningStats(), Histogram()
    s.update(v)
    h.update(v)
    ref = materialised(v)
    fin = ref[torch.isfinite(ref)]
    assert (s.min, s.max) == (fin.min().item(), fin.max().item())
    assert int(h.negative.sum()) == int(((ref < 0) & torch.isfinite(ref)).sum())
    assert h.neginf == int((ref == -math.inf).sum()) and h.posinf == 0


def test_collector_activation_of_a_negating_module_has_the_right_sign(tmp_path):
    from stepscope.collect import Cadence, HistoryCollector, WatchSettings

    class NegView(torch.nn.Module):
        def forward(self, x):
            return torch._neg_view(torch.relu(x))  # every value <= 0

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), NegView(), torch.nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    col = HistoryCollector(
        model, streams=("activation",), cadence=Cadence(1, None), settings=WatchSettings()
    )
    try:
        with col.step(opt):
            loss = model(torch.randn(4, 8)).square().mean()
            loss.backward()
            opt.step()
        (batch,) = col.last_batches
        sites = {s.site_id: s.name for s in col.sites}
        k = [sites[i] for i in batch.site_ids].index("1")
        row = dict(zip(SPINE_FIELDS, batch.spines[k].tolist()))
        assert row["max"] <= 0.0 and row["min"] < 0.0
    finally:
        col.close()


# ------------------------------------------------------------------ int64 beyond 2**53

BIG = [2**53 + 1, 2**62 + 1, -(2**63) + 1, -(2**60) - 3, 7]


def test_running_stats_int64_extremes_are_exact():
    s = RunningStats()
    s.update(torch.tensor(BIG, dtype=torch.int64))
    assert (s.min, s.max, s.absmax) == (min(BIG), max(BIG), max(abs(v) for v in BIG))
    assert s.total == len(BIG) and s.negative == 2


def test_int64_extremes_survive_merge_and_json_round_trip():
    a, b = RunningStats(), RunningStats()
    a.update(torch.tensor(BIG[:2], dtype=torch.int64))
    b.update(torch.tensor([0.5, -1.5]))
    m = a.merge(b)
    assert (m.min, m.max) == (-1.5, 2**62 + 1)
    back = RunningStats.from_dict(m.to_dict())
    assert back == m and back.max == 2**62 + 1


def test_int64_extremes_that_float64_holds_stay_floats():
    s = RunningStats()
    s.update(torch.tensor([3, -5], dtype=torch.int64))
    assert (s.min, s.max, s.absmax) == (-5.0, 3.0, 5.0)
    assert all(type(v) is float for v in (s.min, s.max, s.absmax))


# ------------------------------------------------------------------ accuracy vs math.fsum


def adversarial(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    n = 200_003
    wide = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-40, 40, (n,), generator=g).double()
    )
    shifted = 1e6 + torch.randn(n, generator=g, dtype=torch.float64)  # large mean, small spread
    alternating = torch.where(torch.arange(n) % 2 == 0, 1.0, -1.0).double() * (
        1.0 + torch.rand(n, generator=g, dtype=torch.float64) * 2**-20
    )
    return {k: v.to(dtype) for k, v in dict(wide=wide, shifted=shifted, alt=alternating).items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["wide", "shifted", "alt"])
def test_sums_are_within_the_documented_float64_bound_of_fsum(dtype, case, backend):
    """Documented bound: |err| <= n * 2**-52 * fsum(|x|) (float64 accumulation) for each sum."""
    x = adversarial(dtype)[case]
    vals = x.double().tolist()
    n = len(vals)
    row = dict(zip(SPINE_FIELDS, reduce_spines([x], backend=backend)[0].tolist()))
    abs_sum = math.fsum(abs(v) for v in vals)
    bound = n * 2**-52
    assert abs(row["sum"] - math.fsum(vals)) <= bound * abs_sum
    assert abs(row["sum_abs"] - abs_sum) <= bound * abs_sum
    sq = math.fsum(v * v for v in vals)
    assert abs(row["sum_squares"] - sq) <= bound * sq
    mean = math.fsum(vals) / n
    m2 = math.fsum((v - mean) ** 2 for v in vals)
    # m2 around the shift K: error bounded by the spread, never by the mean
    assert abs(row["m2"] - m2) <= 4 * bound * (m2 + n * (mean - row["mean"]) ** 2) + 1e-300
    if case == "shifted":  # a naive sum(x^2) - sum(x)^2/n would lose every digit here
        assert row["m2"] == pytest.approx(m2, rel=1e-6)
    assert np.isfinite(row["m2"])


# ------------------------------------------ the C spine's fast blocks and their exact redo

# The C spine reads blocks of 2048 elements with unmasked float64 accumulators and redoes a
# block with the masked loop when a sum comes out non-finite (a NaN or an infinity in the block,
# or an overflowing float64 sum). Blocks with and without specials, the tail after the last
# whole group of 16, and overflow must all give the numpy reference's counts and extremes
# exactly and its sums within the documented bound.
BLOCK = 2048


def blocky(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(23)
    n = 7 * BLOCK + 13  # seven whole blocks and a tail that is not a multiple of 16
    x = torch.randn(n, generator=g, dtype=torch.float64) * 3 - 1
    x[:: 5] = 0.0
    x[1::37] = -0.0
    x[BLOCK + 17] = float("nan")  # block 1: one NaN
    x[3 * BLOCK + 2000] = float("inf")  # block 3: +inf near its end
    x[3 * BLOCK + 5] = -float("inf")
    x[5 * BLOCK : 6 * BLOCK] = 2.5  # block 5: constant
    x[-3] = -float("inf")  # the tail
    x[-1] = float("nan")
    x[4 * BLOCK + 9] = -7.0e3  # block 4: the minimum, in a block without specials
    x[6 * BLOCK + 100] = 9.0e3  # block 6: the maximum
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_blocks_and_redone_blocks_give_exact_counts_and_extremes(dtype):
    from stepscope.stats import backend_info

    if backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable")
    x = blocky(dtype)
    v = x.double().numpy()
    fin = v[np.isfinite(v)]
    row = dict(zip(SPINE_FIELDS, reduce_spines([x], backend="c")[0].tolist()))
    ref = reference(v)
    exact = (*SPINE_FIELDS[:7], "min", "max", "absmax")  # counts and extremes: no rounding
    assert {k: row[k] for k in exact} == {k: ref[k] for k in exact}
    vals = fin.tolist()
    bound = len(vals) * 2**-52 * math.fsum(abs(t) for t in vals)
    assert abs(row["sum"] - math.fsum(vals)) <= bound
    assert abs(row["sum_abs"] - math.fsum(abs(t) for t in vals)) <= bound
    sq = math.fsum(t * t for t in vals)
    assert abs(row["sum_squares"] - sq) <= len(vals) * 2**-52 * sq
    # the same tensor with every special removed runs the fast path only: the same finite stats
    clean = torch.from_numpy(fin).to(dtype)
    row2 = dict(zip(SPINE_FIELDS, reduce_spines([clean], backend="c")[0].tolist()))
    for k in ("finite", "zero", "negative", "min", "max", "absmax"):
        assert row2[k] == row[k], k
    assert row2["m2"] == pytest.approx(row["m2"], rel=1e-12)


def test_float64_sums_that_overflow_are_redone_and_stay_infinite_like_numpy():
    from stepscope.stats import backend_info

    if backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable")
    x = torch.ones(3 * BLOCK, dtype=torch.float64)
    x[BLOCK + 3] = 1e200  # its square overflows float64: the block is redone, the result stays
    x[BLOCK + 4] = -1e200
    row = dict(zip(SPINE_FIELDS, reduce_spines([x], backend="c")[0].tolist()))
    assert (row["finite"], row["nan"], row["posinf"], row["neginf"]) == (x.numel(), 0, 0, 0)
    assert (row["min"], row["max"], row["absmax"]) == (-1e200, 1e200, 1e200)
    assert row["sum_squares"] == math.inf and row["sum_abs"] == 2e200 + (x.numel() - 2)
    # 1e200 - 1 rounds to 1e200: the exact sum 6142 is within the bound n * 2**-52 * sum(|x|)
    assert abs(row["sum"] - (x.numel() - 2)) <= x.numel() * 2**-52 * row["sum_abs"]
    exact = slice(0, 10)  # counts and extremes: the torch path's, bit for bit
    assert torch.equal(
        reduce_spines([x], backend="c")[:, exact], reduce_spines([x], backend="torch")[:, exact]
    )
