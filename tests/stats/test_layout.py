"""The torch-free spine layout: its fields against the kernels, its merge against float64 oracles
and against the torch merge (bit for bit), and the lazy re-exports of ``stepscope.stats``."""

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import stepscope.stats
from stepscope.stats import layout, reduce_spines
from stepscope.stats.reduce import merge_spine_rows as merge_any_rows
from tests.stats.test_spine import reference


def test_the_count_fields_name_the_kernel_columns_they_count():
    """Each count column of a kernel row is the count its name says (brute force over a tensor
    that makes every count different)."""
    x = torch.tensor(
        [0.0, -0.0, -1.0, -2.0, -3.0, 5.0] + [math.nan] * 4 + [math.inf] * 5 + [-math.inf] * 8
    )
    ref = reference(x.numpy())  # brute-force numpy counts
    brute = {name: ref[name] for name in layout.COUNT_FIELDS}
    assert len(set(brute.values())) == layout.N_COUNTS  # every column distinguishable
    for backend in ("c", "torch"):
        row = reduce_spines([x], backend=backend)[0].numpy()
        assert row.shape == (layout.SPINE_WIDTH,)
        got = {name: int(row[layout.FIELD_INDEX[name]]) for name in layout.COUNT_FIELDS}
        assert got == brute, backend
    assert layout.SPINE_FIELDS[: layout.N_COUNTS] == layout.COUNT_FIELDS
    assert set(layout.SUM_FIELDS) <= set(layout.FLOAT_FIELDS)


def _np_spine(values: list[float]) -> np.ndarray:
    """A spine row from float64 numpy with math.fsum sums (independent of every kernel)."""
    v = np.asarray(values, dtype=np.float64)
    f = v[np.isfinite(v)]
    row = dict.fromkeys(layout.SPINE_FIELDS, math.nan)
    row.update(
        total=v.size,
        finite=f.size,
        zero=(v == 0).sum(),
        negative=(f < 0).sum(),
        nan=np.isnan(v).sum(),
        posinf=(v == np.inf).sum(),
        neginf=(v == -np.inf).sum(),
        sum=math.fsum(f),
        sum_squares=math.fsum(f * f),
        sum_abs=math.fsum(np.abs(f)),
    )
    if f.size:
        mean = math.fsum(f) / f.size
        row.update(
            min=f.min(),
            max=f.max(),
            absmax=np.abs(f).max(),
            mean=mean,
            m2=math.fsum((f - mean) ** 2),
        )
    return np.array([row[k] for k in layout.SPINE_FIELDS], dtype=np.float64)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ([1.0, 3.0], [5.0]),
        ([], [2.0, -4.0, 0.0]),
        ([math.nan, math.inf], [7.5, -1.25]),
        ([1e8 + 1, 1e8 + 2, 1e8 + 3], [1e8 - 1]),
        ([math.nan], [-math.inf]),
    ],
)
def test_the_numpy_merge_is_the_spine_of_the_union(left, right):
    got = layout.merge_spine_rows(_np_spine(left), _np_spine(right))
    want = _np_spine(left + right)
    k = layout.N_COUNTS
    assert (got[:k] == want[:k]).all()  # counts: exact
    extremes = [layout.FIELD_INDEX[n] for n in ("min", "max", "absmax")]
    np.testing.assert_array_equal(got[extremes], want[extremes])  # exact (NaN when none)
    np.testing.assert_allclose(got[k:], want[k:], rtol=1e-12, atol=1e-9)


def _edge_rows() -> np.ndarray:
    """Spine rows of awkward inputs plus random ones: empty, all-NaN, infinities, signed zeros,
    huge and tiny magnitudes, an overflowed m2."""
    g = torch.Generator().manual_seed(11)
    cases = [
        torch.empty(0),
        torch.tensor([math.nan, math.nan]),
        torch.tensor([math.inf, -math.inf, 1.0]),
        torch.tensor([-0.0, 0.0]),
        torch.tensor([1e300, -1e300, 3.0], dtype=torch.float64),
        torch.randn(9, generator=g).double() * 1e-300,
        torch.tensor([2.0**60, 2.0**60 + 2**8]),
    ]
    cases += [torch.randn(int(n), generator=g) * 10.0 ** float(e) for n, e in [(5, 0), (33, 3)]]
    return np.stack([reduce_spines([t], backend="torch")[0].numpy() for t in cases])


def test_the_torch_merge_is_the_numpy_merge_bit_for_bit():
    """Every ordered pair of edge-case rows, merged as one [k, W] batch, compared by their bits
    (signed zeros and NaN payloads included)."""
    rows = _edge_rows()
    a = np.repeat(rows, len(rows), axis=0)
    b = np.tile(rows, (len(rows), 1))
    want = layout.merge_spine_rows(a, b)
    got = merge_any_rows(torch.from_numpy(a.copy()), torch.from_numpy(b.copy())).numpy()
    assert got.shape == want.shape == (len(rows) ** 2, layout.SPINE_WIDTH)
    assert (got.view(np.int64) == want.view(np.int64)).all()
    # and the public stepscope.stats.merge_spine_rows on numpy rows is the layout's
    assert (merge_any_rows(a, b).view(np.int64) == want.view(np.int64)).all()


def test_the_numpy_merge_does_not_touch_its_inputs():
    rows = _edge_rows()
    a, b = rows[:4].copy(), rows[4:8].copy()
    layout.merge_spine_rows(a, b)
    assert (a.view(np.int64) == rows[:4].view(np.int64)).all()
    assert (b.view(np.int64) == rows[4:8].view(np.int64)).all()


def test_the_lazy_reductions_match_their_type_checking_imports():
    """``stepscope.stats`` re-exports the torch reductions lazily; type checkers see them through
    the ``TYPE_CHECKING`` block. The two lists are equal and every name resolves."""
    init = Path(stepscope.stats.__file__)
    tree = ast.parse(init.read_text())
    guarded = next(
        n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"
    )
    typed = {a.asname or a.name for imp in guarded.body for a in imp.names}  # type: ignore[attr-defined]
    assert typed == set(stepscope.stats._LAZY)
    for name in stepscope.stats.__all__:
        assert getattr(stepscope.stats, name) is not None
    with pytest.raises(AttributeError):
        stepscope.stats.NoSuchThing  # noqa: B018
