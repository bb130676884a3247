"""Exact bin assignment, specials, merges, serialisation and views of the signed log2 histogram."""

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope import Refusal
from stepscope.stats import (
    SPECIAL_FIELDS,
    Histogram,
    HistogramDescriptor,
    RunningStats,
    reduce_histograms,
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def oracle_row(values, desc: HistogramDescriptor) -> np.ndarray:
    """Independent reference in exact integer arithmetic.

    ``|v| = num / 2**d`` exactly (``float.as_integer_ratio``), so ``floor(log2(|v|**bpo))`` is
    ``bit_length(num**bpo) - 1 - bpo*d`` with no rounding; bin ``k`` is that minus ``lo_exp*bpo``.
    """
    nb, bpo = desc.n_bins, desc.bins_per_octave
    row = np.zeros(desc.width, dtype=np.int64)
    special = {name: 2 * nb + i for i, name in enumerate(SPECIAL_FIELDS)}
    for v in values:
        v = float(v)
        if math.isnan(v):
            row[special["nan"]] += 1
        elif math.isinf(v):
            row[special["posinf" if v > 0 else "neginf"]] += 1
        elif v == 0:
            row[special["zero"]] += 1
        else:
            num, den = abs(v).as_integer_ratio()
            d = den.bit_length() - 1  # den is a power of two
            log2_floor = (num**bpo).bit_length() - 1 - bpo * d
            k = log2_floor - desc.lo_exp * bpo
            neg = v < 0
            if k < 0:
                row[special["underflow_neg" if neg else "underflow_pos"]] += 1
            elif k >= nb:
                row[special["overflow_neg" if neg else "overflow_pos"]] += 1
            else:
                row[k if neg else nb + k] += 1
    return row


def step_bits(t: torch.Tensor, delta: int) -> torch.Tensor:
    """The float ``delta`` ulps away (same sign), by integer arithmetic on the bit pattern."""
    int_dtype = {2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return (t.view(int_dtype) + delta).view(t.dtype)


def edge_neighbours(desc: HistogramDescriptor, dtype: torch.dtype) -> torch.Tensor:
    """For every edge: the nearest float in ``dtype`` and its two neighbours, both signs."""
    edges = torch.tensor(desc.edges(), dtype=torch.float64).to(dtype)
    edges = edges[torch.isfinite(edges) & (edges > 0)]
    around = torch.cat([step_bits(edges, -1), edges, step_bits(edges, 1)])
    around = around[torch.isfinite(around) & (around > 0)]
    return torch.cat([around, -around])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bpo", [1, 3, 4, 8])
def test_floats_adjacent_to_every_edge_land_in_the_exact_bin(dtype, bpo, backend):
    desc = HistogramDescriptor(bins_per_octave=bpo, lo_exp=-20 if dtype == torch.float16 else -48)
    x = edge_neighbours(desc, dtype)
    got = reduce_histograms([x], desc, backend=backend)[0].numpy()
    np.testing.assert_array_equal(got, oracle_row(x.double().tolist(), desc))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_windows_reaching_subnormals_and_wide_windows(dtype, backend):
    # lo_exp below float32's smallest normal exponent forces exact handling of subnormals
    desc = HistogramDescriptor(
        bins_per_octave=4, lo_exp=-149 if dtype == torch.float32 else -1022, hi_exp=130
    )
    tiny = torch.tensor(
        [1e-45, 3e-42, 1.1754942e-38, 1.1754944e-38, 2.0**-140], dtype=torch.float32
    ).to(dtype)
    x = torch.cat([tiny, -tiny, torch.tensor([3e38, -3e38], dtype=dtype)])
    got = reduce_histograms([x], desc, backend=backend)[0].numpy()
    np.testing.assert_array_equal(got, oracle_row(x.double().tolist(), desc))


def test_specials_are_separate_exact_counts(backend):
    x = torch.tensor(
        [
            0.0,
            -0.0,
            float("nan"),
            -float("nan"),
            float("inf"),
            -float("inf"),
            1e-20,
            -1e-20,
            1e10,
            -1e10,
            1.0,
        ],
        dtype=torch.float32,
    )
    h = Histogram.from_vector(reduce_histograms([x], backend=backend)[0])
    assert (h.zero, h.nan, h.posinf, h.neginf) == (2, 2, 1, 1)
    assert (h.underflow_pos, h.underflow_neg, h.overflow_pos, h.overflow_neg) == (1, 1, 1, 1)
    assert h.positive[(0 - (-48)) * 4] == 1  # 1.0 opens the octave [2**0, 2**0.25)
    assert h.total == x.numel()


@pytest.mark.parametrize("dtype", [*DTYPES, torch.int32, torch.int64, torch.bool, torch.uint8])
def test_random_data_matches_oracle_in_every_dtype(dtype, backend):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(3000, generator=g, dtype=torch.float64) * torch.exp2(
        torch.randint(-30, 20, (3000,), generator=g)
    )
    x = (base * 100).to(dtype) if not dtype.is_floating_point else base.to(dtype)
    got = reduce_histograms([x], backend=backend)[0].numpy()
    np.testing.assert_array_equal(got, oracle_row(x.double().tolist(), HistogramDescriptor()))


def test_empty_and_all_nan(backend):
    rows = reduce_histograms([torch.empty(0), torch.full((7,), float("nan"))], backend=backend)
    assert rows[0].sum() == 0
    h = Histogram.from_vector(rows[1])
    assert h.nan == 7 and h.total == 7


def test_update_consumes_no_rng_and_matches_batched_rows():
    x = torch.randn(1000)
    state = torch.get_rng_state()
    h = Histogram()
    h.update(x[:500])
    h.update(x[500:])
    assert torch.equal(state, torch.get_rng_state())
    assert np.array_equal(h.to_vector(), reduce_histograms([x])[0].numpy())


def test_c_and_torch_paths_agree_on_large_tensors():
    from stepscope.stats import backend_info

    if backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable")
    x = torch.randn(300_000) * 1e3
    x[::997] = 0.0
    x[::1009] = float("nan")
    assert torch.equal(reduce_histograms([x], backend="c"), reduce_histograms([x], backend="torch"))
    y = x.double().reshape(300, 1000).t()  # non-contiguous, float64
    assert torch.equal(reduce_histograms([y], backend="c"), reduce_histograms([y], backend="torch"))


histogram_vectors = st.lists(
    st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=40
).map(lambda v: Histogram.from_vector(reduce_histograms([torch.tensor(v, dtype=torch.float32)])[0]))


@settings(max_examples=60, deadline=None)
@given(histogram_vectors, histogram_vectors, histogram_vectors)
def test_merge_is_exact_associative_and_commutative(a, b, c):
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(b).total == a.total + b.total


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=50))
def test_merge_of_parts_equals_histogram_of_concatenation(values):
    x = torch.tensor(values, dtype=torch.float32)
    whole = Histogram()
    whole.update(x)
    half = len(values) // 2
    a, b = Histogram(), Histogram()
    a.update(x[:half])
    b.update(x[half:])
    assert a.merge(b) == whole


def test_merge_inputs_unchanged_and_mismatch_refused():
    a, b = Histogram(), Histogram()
    a.update(torch.tensor([1.0]))
    before = a.to_vector().copy()
    a.merge(b)
    assert np.array_equal(a.to_vector(), before)
    with pytest.raises(Refusal) as err:
        a.merge(Histogram(HistogramDescriptor(bins_per_octave=8)))
    assert err.value.code == "sketch_descriptor_mismatch"
    with pytest.raises(Refusal) as err:
        a.merge(RunningStats())  # type: ignore[arg-type]
    assert err.value.code == "stat_kind_mismatch"


def test_dict_round_trip_and_malformed_payloads():
    h = Histogram(HistogramDescriptor(bins_per_octave=2))
    h.update(torch.tensor([1.0, -3.0, 0.0, float("nan"), 1e-30]))
    assert Histogram.from_dict(h.to_dict()) == h
    for bad in [
        {"kind": "spine"},
        {**h.to_dict(), "positive": [[10**6, 1]]},
        {**h.to_dict(), "positive": [[0, -1]]},
        {**h.to_dict(), "zero": -1},
        {**h.to_dict(), "descriptor": {"base": 3}},
    ]:
        with pytest.raises(Refusal):
            Histogram.from_dict(bad)
    with pytest.raises(Refusal) as err:
        Histogram.from_vector(np.zeros(3, dtype=np.int64))
    assert err.value.code == "stat_payload_invalid"


@pytest.mark.parametrize("q", [0.0, 0.01, 0.25, 0.5, 0.9, 0.999, 1.0])
def test_quantile_bounds_contain_the_exact_quantile(q):
    g = torch.Generator().manual_seed(11)
    x = torch.cat(
        [
            torch.randn(5000, generator=g) * 3,
            torch.zeros(100),
            torch.tensor([float("inf"), float("nan")]),
        ]
    )
    h = Histogram()
    h.update(x)
    est = h.quantile(q)
    finite_or_inf = x[~torch.isnan(x)].double().numpy()
    exact = np.quantile(finite_or_inf, q, method="inverted_cdf")
    assert est.estimated is True
    assert est.lower <= exact <= est.upper
    assert est.lower <= est.value <= est.upper


def test_quantile_refusals():
    with pytest.raises(Refusal):
        Histogram().quantile(0.5)
    h = Histogram()
    h.update(torch.ones(3))
    with pytest.raises(Refusal):
        h.quantile(1.5)


def test_tensorboard_buckets_follow_its_convention():
    x = torch.tensor([-5.0, -1e-30, 0.0, 0.0, 0.3, 2.0, 1e9, float("nan")])
    h, s = Histogram(), RunningStats()
    h.update(x)
    s.update(x)
    tb = h.to_tensorboard(s)
    assert tb["num"] == 7 == sum(tb["bucket_counts"])  # finite values only
    limits = tb["bucket_limits"]
    assert all(a < b for a, b in itertools.pairwise(limits)), "right edges strictly increase"
    assert tb["min"] == -5.0 and tb["max"] == 1e9
    assert tb["sum"] == s.sum and tb["sum_squares"] == s.sum_squares
    zero_idx = limits.index(0.0)
    assert tb["bucket_counts"][zero_idx] == 2 and limits[zero_idx - 1] < 0 < limits[zero_idx + 1]
    assert tb["bucket_counts"][0] > 0 and tb["bucket_counts"][-1] > 0  # trimmed ends
    assert all(abs(v) <= float(np.finfo(np.float32).max) for v in limits)


def test_tensorboard_export_reads_back(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    x = torch.randn(1000) * 10
    h, s = Histogram(), RunningStats()
    h.update(x)
    s.update(x)
    with SummaryWriter(str(tmp_path)) as w:
        w.add_histogram_raw("act", global_step=3, **h.to_tensorboard(s))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    (ev,) = acc.Histograms("act")
    assert ev.step == 3
    assert ev.histogram_value.num == s.finite
    assert ev.histogram_value.sum == pytest.approx(s.sum)
    assert ev.histogram_value.sum_squares == pytest.approx(s.sum_squares)
    assert sum(ev.histogram_value.bucket) == 1000


def test_every_special_count_is_a_typed_read_only_property():
    """Each special count is an ``int`` property reading the stored count; assigning refuses."""
    import typing

    assert "__getattr__" not in vars(Histogram)
    h = Histogram()
    inf = float("inf")
    h.update(torch.tensor([0.0, -0.0, 1e-30, -1e30, float("nan"), inf, -inf, 1.0]))
    for name in SPECIAL_FIELDS:
        prop = vars(Histogram)[name]
        assert isinstance(prop, property), name
        assert typing.get_type_hints(prop.fget)["return"] is int, name
        assert getattr(h, name) == h.specials[name] == h.to_dict()[name], name
        with pytest.raises(AttributeError):
            setattr(h, name, 1)
    got = (h.zero, h.underflow_pos, h.overflow_neg, h.nan, h.posinf, h.neginf)
    assert got == (2, 1, 1, 1, 1, 1)


# ------------------------------------------- the C kernel's two float32 paths, bit for bit

# The C kernel bins float32 tensors of at least 16384 elements (with <= 4 bins per octave) by
# counting (sign, exponent, mantissa class) keys and folding them into slots once per call, and
# smaller ones (or finer grids) through the per-element slot table. Both must give the same
# counts as the exact oracle and the torch path, on every kind of value and on constant runs.
KEY_PATH_MIN = 16384


def mixed_float32(desc: HistogramDescriptor, n_min: int, seed: int) -> torch.Tensor:
    """Edge neighbours, every special (NaN payloads of both signs, +-0, +-inf, subnormals),
    wide random magnitudes and constant runs (a whole block of one value, a block of zeros,
    a run broken by one value), shuffled blockwise so constant runs survive."""
    g = torch.Generator().manual_seed(seed)
    edges = edge_neighbours(desc, torch.float32)
    nan_bits = torch.tensor([0x7FC00000, 0x7F800001, 0x7FFFFFFF, -1, -0x400000], dtype=torch.int32)
    specials = torch.cat(
        [
            nan_bits.view(torch.float32),
            torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-45, -1e-45, 1e-40, -3e-39]),
            torch.tensor([2.0**-126, -(2.0**-126), 3.4e38, -3.4e38]),
        ]
    )
    wide = torch.randn(20_000, generator=g) * torch.exp2(
        torch.randint(-60, 30, (20_000,), generator=g).float()
    )
    runs = [
        torch.full((1024,), 1.0),
        torch.full((512,), -(2.0**-3)),
        torch.zeros(1536),
        torch.cat([torch.full((700,), 3.0), torch.tensor([5.0]), torch.full((300,), 3.0)]),
        torch.relu(torch.randn(4096, generator=g)),  # half exact zeros
    ]
    parts = [edges, specials, wide, *runs]
    x = torch.cat(parts)
    while x.numel() < n_min:
        x = torch.cat([x, x[torch.randperm(x.numel(), generator=g)][: n_min - x.numel()]])
    return x


@pytest.mark.parametrize("bpo", [1, 2, 3, 4, 8])
def test_c_key_path_equals_table_path_torch_path_and_oracle(bpo):
    from stepscope.stats import backend_info

    if backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable")
    desc = HistogramDescriptor(bins_per_octave=bpo, lo_exp=-40, hi_exp=20)
    x = mixed_float32(desc, 3 * KEY_PATH_MIN, seed=bpo)
    assert x.dtype == torch.float32 and x.numel() >= 3 * KEY_PATH_MIN
    whole = reduce_histograms([x], desc, backend="c")[0]  # key path (bpo <= 4)
    chunks = torch.split(x, KEY_PATH_MIN // 2 - 1)  # every chunk takes the table path
    by_chunks = reduce_histograms(list(chunks), desc, backend="c").sum(0)
    assert torch.equal(whole, by_chunks)
    assert torch.equal(whole, reduce_histograms([x], desc, backend="torch")[0])
    np.testing.assert_array_equal(whole.numpy(), oracle_row(x.double().tolist(), desc))


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, -3.5, 1e-45, float("nan"), float("inf")])
def test_c_kernel_counts_constant_tensors_exactly(value):
    from stepscope.stats import backend_info

    if backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable")
    # a constant block is counted with one add: its count must still be exact, and a tensor
    # that is constant except for one element must not be taken for constant
    n = 5 * 512 + 77
    x = torch.full((n,), value, dtype=torch.float32)
    want = reduce_histograms([x], backend="torch")[0]
    got = reduce_histograms([torch.cat([x, x, x, x, x, x, x])], backend="c")[0]
    assert torch.equal(got, 7 * want)
    y = torch.cat([x, x, x, x, x, x, x])
    y[3 * 512 + 100] = 2.0**-20
    assert torch.equal(reduce_histograms([y], backend="c"), reduce_histograms([y], backend="torch"))
