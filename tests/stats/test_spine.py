"""The spine against float64 numpy references, its merges, serialisation and purity."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope import Refusal
from stepscope.stats import SPINE_FIELDS, SPINE_WIDTH, RunningStats, reduce_spines


def reference(values: np.ndarray) -> dict:
    """Independent float64 numpy reference for every spine field."""
    v = np.asarray(values, dtype=np.float64).ravel()
    fin = v[np.isfinite(v)]
    out = {
        "total": v.size,
        "finite": fin.size,
        "zero": int((v == 0).sum()),
        "negative": int((fin < 0).sum()),
        "nan": int(np.isnan(v).sum()),
        "posinf": int((v == np.inf).sum()),
        "neginf": int((v == -np.inf).sum()),
        "sum": float(fin.sum()),
        "sum_squares": float((fin**2).sum()),
        "sum_abs": float(np.abs(fin).sum()),
    }
    if fin.size:
        out.update(
            min=float(fin.min()),
            max=float(fin.max()),
            absmax=float(np.abs(fin).max()),
            mean=float(fin.mean()),
            m2=float(((fin - fin.mean()) ** 2).sum()),
        )
    else:
        out.update(min=None, max=None, absmax=None, mean=None, m2=None)
    return out


def assert_matches(stats: RunningStats, ref: dict, rtol: float = 1e-12) -> None:
    for name in SPINE_FIELDS[:7]:
        assert getattr(stats, name) == ref[name], name
        assert type(getattr(stats, name)) is int
    for name in ("min", "max", "absmax"):
        assert getattr(stats, name) == ref[name], name  # exact
    scale = math.sqrt(ref["sum_squares"]) * math.sqrt(max(ref["total"], 1)) + 1e-300
    for name in ("sum", "sum_abs"):
        assert getattr(stats, name) == pytest.approx(ref[name], rel=rtol, abs=rtol * scale), name
    assert stats.sum_squares == pytest.approx(ref["sum_squares"], rel=rtol)
    if ref["mean"] is None:
        assert stats.mean is None and stats.m2 is None and stats.var is None
    else:
        assert stats.mean == pytest.approx(
            ref["mean"], rel=rtol, abs=rtol * scale / max(ref["finite"], 1)
        )
        assert stats.m2 == pytest.approx(ref["m2"], rel=1e-9, abs=1e-9 * ref["sum_squares"])


def sample(dtype: torch.dtype, n: int = 5000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g, dtype=torch.float64) * 7 + 2
    x[::50] = 0.0
    if dtype.is_floating_point:
        x[::97] = float("nan")
        x[::101] = float("inf")
        x[::103] = -float("inf")
        return x.to(dtype)
    if dtype == torch.bool:
        return x > 2
    return (x * 10).to(dtype)


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.bool,
    ],
)
def test_every_field_matches_numpy_float64(dtype, backend):
    x = sample(dtype)
    s = RunningStats.from_vector(reduce_spines([x], backend=backend)[0])
    assert_matches(s, reference(x.double().numpy()))
    assert s.reduction_dtype == "float64"


def test_large_offset_variance_stays_accurate(backend):
    # m2 from raw sums would cancel catastrophically; the shifted/two-pass kernels must not
    g = torch.Generator().manual_seed(1)
    x = (1e4 + torch.randn(200_000, generator=g)).to(torch.float32)
    s = RunningStats.from_vector(reduce_spines([x], backend=backend)[0])
    ref = reference(x.double().numpy())
    assert s.m2 == pytest.approx(ref["m2"], rel=1e-9)
    assert s.mean == pytest.approx(ref["mean"], rel=1e-12)


@pytest.mark.parametrize(
    "values",
    [
        [],
        [float("nan")] * 5,
        [float("inf"), -float("inf")],
        [0.0, -0.0],
        [3e38, 3e38, -3e38],
        [1e-45, -1e-45, 1e-38],
        [5.0],
    ],
)
def test_edge_cases(values, backend):
    x = torch.tensor(values, dtype=torch.float32)
    s = RunningStats.from_vector(reduce_spines([x], backend=backend)[0])
    assert_matches(s, reference(x.double().numpy()))
    if s.finite == 0:
        assert (s.min, s.max, s.mean, s.var) == (None, None, None, None)
        assert (s.sum, s.sum_squares, s.sum_abs) == (0.0, 0.0, 0.0)


def test_batched_rows_equal_single_updates_and_fill_a_staging_buffer(backend):
    tensors = [sample(torch.float32, n, seed=n) for n in (1, 10, 1000, 70_000)] + [
        torch.randn(30, 20).t()
    ]
    out = torch.full((len(tensors), SPINE_WIDTH), -1.0, dtype=torch.float64)
    got = reduce_spines(tensors, out=out, backend=backend)
    assert got is out
    for row, t in zip(out, tensors):
        assert_matches(RunningStats.from_vector(row), reference(t.double().numpy()))
    with pytest.raises(Refusal) as err:
        reduce_spines(tensors, out=torch.empty(2, SPINE_WIDTH, dtype=torch.float64))
    assert err.value.code == "stat_payload_invalid"


def test_c_kernel_and_torch_path_agree():
    from stepscope.stats import backend_info

    if backend_info()["cpu"] != "c":
        pytest.skip("C kernel unavailable")
    x = sample(torch.float32, 400_000, seed=5)
    a, b = reduce_spines([x], backend="c"), reduce_spines([x], backend="torch")
    counts = slice(0, 7)
    assert torch.equal(a[:, counts], b[:, counts])
    torch.testing.assert_close(a, b, rtol=1e-9, atol=0.0, equal_nan=True)


def test_complex_refuses_with_its_code():
    with pytest.raises(Refusal) as err:
        RunningStats().update(torch.randn(3, dtype=torch.complex64))
    assert err.value.code == "stat_dtype_unsupported"
    assert err.value.remedies


def test_update_consumes_no_rng_and_leaves_input_untouched():
    x = sample(torch.float32)
    copy = x.clone()
    state = torch.get_rng_state()
    RunningStats().update(x)
    assert torch.equal(state, torch.get_rng_state())
    assert torch.equal(x.view(torch.int32), copy.view(torch.int32))


float_lists = st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=60)


def stats_of(values) -> RunningStats:
    s = RunningStats()
    s.update(torch.tensor(values, dtype=torch.float32))
    return s


@settings(max_examples=80, deadline=None)
@given(float_lists, float_lists, float_lists)
def test_merge_counts_exact_and_moments_match_concatenation(a, b, c):
    sa, sb, sc = stats_of(a), stats_of(b), stats_of(c)
    left, right = sa.merge(sb).merge(sc), sa.merge(sb.merge(sc))
    swapped = sc.merge(sb).merge(sa)
    whole = stats_of(a + b + c)
    for name in (*SPINE_FIELDS[:7], "min", "max", "absmax"):
        assert (
            getattr(left, name)
            == getattr(right, name)
            == getattr(swapped, name)
            == getattr(whole, name)
        )
    ref = reference(np.array(a + b + c, dtype=np.float32))
    if ref["mean"] is not None and math.isfinite(ref["sum_squares"]):
        tol = 1e-9 * (ref["sum_squares"] + 1.0)
        assert left.mean == pytest.approx(
            ref["mean"], rel=1e-9, abs=1e-9 * math.sqrt(ref["sum_squares"] + 1)
        )
        assert left.m2 == pytest.approx(ref["m2"], rel=1e-7, abs=tol)


def test_merge_returns_new_object_inputs_unchanged():
    a, b = stats_of([1.0, 2.0]), stats_of([3.0])
    before = a.to_dict()
    merged = a.merge(b)
    assert merged is not a and a.to_dict() == before
    assert merged.total == 3 and merged.mean == 2.0 and merged.m2 == pytest.approx(2.0)
    with pytest.raises(Refusal) as err:
        a.merge("x")  # type: ignore[arg-type]
    assert err.value.code == "stat_kind_mismatch"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), max_size=30))
def test_dict_and_vector_round_trips_are_exact(values):
    s = RunningStats()
    s.update(torch.tensor(values, dtype=torch.float64))
    assert RunningStats.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert RunningStats.from_vector(s.to_vector()) == s


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("sum"),
        lambda d: d.update(zero=-1),
        lambda d: d.update(finite=d["finite"] + 1),
        lambda d: d.update(min=None),
        lambda d: d.update(kind="histogram"),
        lambda d: d.update(mean="many"),
    ],
)
def test_malformed_payloads_refuse(mutate):
    d = stats_of([1.0, 2.0]).to_dict()
    mutate(d)
    with pytest.raises(Refusal) as err:
        RunningStats.from_dict(d)
    assert err.value.code == "stat_payload_invalid"


def test_tensorboard_keys_and_values():
    s = stats_of([1.0, -2.0, float("nan")])
    tb = s.to_tensorboard()
    assert set(tb) == {"num", "min", "max", "sum", "sum_squares"}
    assert tb == {"num": 2, "min": -2.0, "max": 1.0, "sum": -1.0, "sum_squares": 5.0}


def test_spine_into_writes_the_same_row_as_reduce_spines(backend):
    from stepscope.stats import spine_into

    x = sample(torch.float32, 3000, seed=9)
    row = torch.full((SPINE_WIDTH,), -7.0, dtype=torch.float64)
    spine_into(x, row, backend)
    torch.testing.assert_close(row, reduce_spines([x], backend=backend)[0], rtol=0, atol=0, equal_nan=True)


def test_every_field_is_a_typed_read_only_property():
    """Each spine field is a property with a declared type (seen by IDEs and mypy), reading the
    value ``to_dict`` serialises; assigning one refuses like any read-only attribute."""
    import typing

    assert "__getattr__" not in vars(RunningStats)
    s = stats_of([3.0, -1.0, 0.0, float("inf")])
    d = s.to_dict()
    for name in SPINE_FIELDS:
        prop = vars(RunningStats)[name]
        assert isinstance(prop, property), name
        hint = typing.get_type_hints(prop.fget)["return"]
        assert hint is (int if name in SPINE_FIELDS[:7] else float) or float in typing.get_args(
            hint
        ), (name, hint)
        assert getattr(s, name) == d[name], name
        with pytest.raises(AttributeError):
            setattr(s, name, 1)
    got = (s.total, s.finite, s.zero, s.negative, s.posinf, s.min, s.absmax)
    assert got == (4, 3, 1, 1, 1, -1.0, 3.0)
    empty = RunningStats()
    assert empty.min is None and empty.mean is None and empty.sum == 0.0
