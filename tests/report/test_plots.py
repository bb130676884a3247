"""Plot functions against artifacts written by hand: exact signed-log2 bins, honest special bands,
gaps where no histogram was taken, and means only where every run has a value."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope import open_run
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.report import histogram_plot
from stepscope.report.curves import seed_traces
from stepscope.report.data import histogram_grid

VALUES = [0.0, 0.0, math.nan, math.inf, -math.inf, -math.inf, 1e-20, -1e-20, 1e6, -3e5]
VALUES += [1.5, 1.5, 3.0, -0.75]
SPECIALS = {
    "zero": 2,
    "nan": 1,
    "posinf": 1,
    "neginf": 2,
    "underflow_pos": 1,
    "underflow_neg": 1,
    "overflow_pos": 1,
    "overflow_neg": 1,
}
HIST_STEPS = (0, 2, 6)  # no histogram at step 4: a gap, not an empty column


def hand_run_at(path):
    """A hand-written artifact: every special value at steps 0, 2 and 6, a dead ReLU site."""
    with HistoryWriter(path, durable=False) as w:
        site = w.register_site("fc", "torch.nn.Linear", "f32[*,14]")
        dead = w.register_site("relu", "torch.nn.ReLU", "f32[*,14]")
        for step in range(7):
            ts = [torch.tensor(VALUES), torch.zeros(len(VALUES))]  # a dead ReLU: only zeros
            spines = ss.stats.reduce_spines(ts).numpy()
            kw = {}
            if step in HIST_STEPS:
                kw = dict(hist_rows=[0, 1], histograms=ss.stats.reduce_histograms(ts).numpy())
            ids = [site, dead]
            batch = ObservationBatch.observed("activation", "forward", ids, spines, **kw)
            w.write_step(StepBlockRecord(step, examples_seen=1), [batch])
    return open_run(path)


@pytest.fixture(scope="module")
def hand_run(tmp_path_factory: pytest.TempPathFactory):
    return hand_run_at(tmp_path_factory.mktemp("hand") / "run")


def signed_bin(x: float, lo_exp: int = -48, bpo: int = 4) -> int:
    """Independent bin rule (values here are far from bin edges, so log2 is safe)."""
    k = math.floor((math.log2(abs(x)) - lo_exp) * bpo)
    return k if x > 0 else -k - 1


def test_histogram_plot_counts_every_bin_and_special_exactly(hand_run):
    plot = histogram_plot(histogram_grid(hand_run, "fc", "activation"))
    assert plot.xlabel == "optimizer step"
    np.testing.assert_array_equal(plot.data["steps"], HIST_STEPS)
    for name, count in SPECIALS.items():
        np.testing.assert_array_equal(plot.data["specials"][name], [count] * 3, err_msg=name)
    bins, counts = list(plot.data["bins"]), plot.data["counts"]
    expected = {signed_bin(1.5): 2, signed_bin(3.0): 1, signed_bin(-0.75): 1}
    for b, want in expected.items():
        np.testing.assert_array_equal(counts[bins.index(b)], [want] * 3)
    assert counts.sum() == 4 * 3  # nothing else on the finite grid
    assert bins == sorted(bins)  # most negative first
    # each sign keeps only its own non-empty range: one negative bin, 1.5 .. 3.0 positive
    assert bins[0] == signed_bin(-0.75) and bins[-1] == signed_bin(3.0)
    assert len(bins) == 1 + signed_bin(3.0) - signed_bin(1.5) + 1
    fraction = plot.data["fraction"]
    np.testing.assert_allclose(fraction[bins.index(signed_bin(1.5))], 2 / len(VALUES))


def test_a_step_without_histogram_is_a_gap_column_not_an_empty_one(hand_run):
    plot = histogram_plot(histogram_grid(hand_run, "fc", "activation"))
    edges, drawn = plot.data["drawn_x_edges"], plot.data["drawn_fraction"]
    centres = (edges[:-1] + edges[1:]) / 2
    np.testing.assert_array_equal(centres, [0, 2, 4, 6])  # width 2: step 4 is the filler
    assert np.isnan(drawn[:, 2]).all()
    assert np.isfinite(drawn[:, [0, 1, 3]]).all()


def test_seed_mean_and_interval_exist_only_where_every_run_has_a_value():
    x = np.arange(4.0)
    runs = [
        ("a", x, np.array([1.0, 2.0, np.nan, 4.0])),
        ("b", x, np.array([3.0, 4.0, 5.0, 6.0])),
        ("c", x[:3], np.array([2.0, 3.0, 4.0])),
    ]
    traces = seed_traces("probe", runs)
    assert [t.kind for t in traces] == ["seed", "seed", "seed", "mean"]
    mean = traces[-1]
    np.testing.assert_array_equal(mean.x, x)
    np.testing.assert_array_equal(mean.y, [2.0, 3.0, np.nan, np.nan])
    np.testing.assert_array_equal(mean.band[0], [1.0, 2.0, np.nan, np.nan])
    np.testing.assert_array_equal(mean.band[1], [3.0, 4.0, np.nan, np.nan])
    assert mean.band_label == "shaded: min–max over 3 runs"
    assert {t.group for t in traces} == {"probe"}


def test_a_site_with_only_zeros_draws_its_zero_band_and_no_bins(hand_run):
    from tests.report.report_testkit import decode_png

    plot = histogram_plot(histogram_grid(hand_run, "relu", "activation"))
    assert len(plot.data["bins"]) == 0 and plot.data["counts"].size == 0
    np.testing.assert_array_equal(plot.data["specials"]["zero"], [len(VALUES)] * 3)
    assert all(not v.any() for k, v in plot.data["specials"].items() if k != "zero")
    decode_png(plot.png)
