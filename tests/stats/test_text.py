"""The plain-text renderings (``render_histogram``, ``render_spine``) against brute-force counts.

Each histogram row is read back as the interval its label states (brackets included) and must hold
exactly the data values a direct count finds in that interval; the rows together must hold every
non-NaN value once. The data sit at bin midpoints (about 9% from any edge, far beyond the labels'
three significant digits) and on exact octave edges that print exactly (0.125 ... 8), so a label
whose bracket is on the wrong side of an edge value is caught.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from stepscope.stats import Histogram, RunningStats, render_histogram, render_spine

INTERVAL = re.compile(r"^([\[(])(\S+), (\S+)([\])])( \*)?$")


def parse_rows(text: str) -> tuple[list[tuple[str, int, str]], list[str]]:
    """``(label, count, bar)`` per row, and the remaining (footnote) lines."""
    rows, notes = [], []
    for line in text.splitlines():
        label, rest = line[:26].strip(), line[26:].split()
        if rest and rest[0].isdigit():
            rows.append((label, int(rest[0]), rest[1] if len(rest) > 1 else ""))
        else:
            notes.append(line)
    return rows, notes


def members(label: str, values: np.ndarray) -> np.ndarray:
    """Which ``values`` lie in the interval ``label`` states (the oracle)."""
    if label == "0 (exact)":
        return values == 0
    if label in ("inf", "-inf"):
        return values == float(label)
    m = INTERVAL.match(label)
    assert m, f"unreadable row label {label!r}"
    left, lo, hi, right = m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)
    above = values >= lo if left == "[" else values > lo
    below = values <= hi if right == "]" else values < hi
    return above & below


def data(rng: np.random.Generator) -> np.ndarray:
    """Signed bin midpoints over 10 octaves, exact octave edges, zeros, under/overflow, specials."""
    k = rng.integers(-20, 20, size=300)  # quarter-octave bins of the default descriptor
    mids = np.exp2(k / 4 + 1 / 8) * rng.choice([-1.0, 1.0], size=k.size)
    edges = np.array([s * 2.0**j for j in range(-3, 4) for s in (-1.0, 1.0)] * 3)
    specials = [0.0] * 7 + [1e-20, -1e-20, -3e-22, 1e6, -2e7, math.inf, -math.inf, -math.inf]
    return np.concatenate([mids, edges, specials, [math.nan] * 4]).astype(np.float32)


def histogram_of(x: np.ndarray) -> Histogram:
    h = Histogram()
    h.update(torch.from_numpy(x))
    return h


@pytest.mark.parametrize("max_rows", [1000, 12, 5])
def test_each_row_holds_exactly_the_values_its_label_states(max_rows):
    x = data(np.random.default_rng(max_rows)).astype(np.float64)
    text = render_histogram(histogram_of(x.astype(np.float32)), width=20, max_rows=max_rows)
    rows, notes = parse_rows(text)
    assert rows[-1][0] == "NaN" and rows[-1][1] == np.isnan(x).sum()  # NaN is listed last
    finite_or_inf = x[~np.isnan(x)]
    seen = np.zeros(finite_or_inf.size, dtype=int)
    for label, count, _ in rows[:-1]:
        inside = members(label, finite_or_inf)
        assert count == inside.sum(), (label, count, finite_or_inf[inside])
        seen += inside
    assert (seen == 1).all(), finite_or_inf[seen != 1]  # the rows partition the values
    # specials (exact zero, under/overflow, infinities) are rows of their own, never merged
    assert sum(1 for label, *_ in rows if label.endswith(" *")) == 4
    assert [label for label, *_ in rows if label in ("0 (exact)", "inf", "-inf")] == [
        "-inf",
        "0 (exact)",
        "inf",
    ]
    assert notes == ["  * underflow/overflow beyond the grid window"]
    regular = [r for r in rows[:-1] if r[0].startswith(("[", "(")) and not r[0].endswith("*")]
    if max_rows < 1000:  # bins are summed so the picture keeps about max_rows rows
        assert len(regular) <= max_rows + 1  # at most one partial group per sign


def test_bars_are_proportional_to_counts():
    rows, _ = parse_rows(render_histogram(histogram_of(data(np.random.default_rng(3))), width=30))
    rows = rows[:-1]  # the NaN row has no bar
    top = max(c for _, c, _ in rows)
    for _, count, bar in rows:
        assert set(bar) == {"#"} and len(bar) == max(1, round(30 * count / top))


def test_a_histogram_without_special_buckets_has_no_footnote_and_an_empty_one_says_so():
    text = render_histogram(histogram_of(np.array([0.3, -0.7, 5.0], dtype=np.float32)))
    rows, notes = parse_rows(text)
    assert [c for _, c, _ in rows] == [1, 1, 1] and notes == []
    assert render_histogram(Histogram()) == "(empty)"
    rows, _ = parse_rows(render_histogram(histogram_of(np.array([math.nan], dtype=np.float32))))
    assert rows == [("NaN", 1, "")]


def test_render_spine_matches_numpy():
    x = np.concatenate(
        [np.random.default_rng(0).normal(size=1000) * 3, [0.0, 0.0, math.nan, math.inf, -math.inf]]
    ).astype(np.float32)
    s = RunningStats()
    s.update(torch.from_numpy(x))
    fields = dict(kv.split("=") for kv in render_spine(s).split())
    f = x[np.isfinite(x)].astype(np.float64)
    assert fields["n"] == str(x.size) and fields["finite"] == str(f.size)
    assert fields["zero"] == "2" and fields["neg"] == str((f < 0).sum())
    assert fields["nan"] == "1" and fields["inf"] == "2"
    for key, want in {"min": f.min(), "mean": f.mean(), "max": f.max(), "std": f.std()}.items():
        assert float(fields[key]) == pytest.approx(want, rel=1e-3), key  # printed with 4 digits


def test_render_spine_of_no_finite_value_prints_dashes():
    s = RunningStats()
    s.update(torch.tensor([math.nan, math.inf]))
    assert render_spine(s).endswith("min=- mean=- max=- std=-")
