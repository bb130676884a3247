"""Plots a person can read: log ticks are numbers (not ``$\\mathdefault{...}$``), legends
summarise seeds and recipes, exact zeros are not painted like NaN, log axes stop where the
data stops meaning anything.

Each test catches the figure matplotlib actually saved (``Figure.savefig`` is wrapped) and reads
it back through matplotlib's own artists after the draw, or through the SVG it writes.
"""

from __future__ import annotations

import io
import math
import re

import numpy as np
import pytest

from stepscope.report import Trace, heatmap_plot, line_plot
from stepscope.report.model import run_label
from tests.report.report_testkit import with_recipe

SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")


@pytest.fixture
def saved(monkeypatch):
    """Every figure the report saves during the test, after its draw."""
    from matplotlib.figure import Figure

    figures = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        figures.append(self)
        return out

    monkeypatch.setattr(Figure, "savefig", savefig)
    return figures


def label_value(text: str) -> float:
    """``10⁻³`` -> 1e-3, ``2×10¹`` -> 20, ``−10²`` -> -100: what a reader takes the label to say."""
    t = text.replace("−", "-").strip()
    m = re.fullmatch(r"(-?)(?:([0-9.]+)×)?10([⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+)", t)
    assert m, f"tick label {text!r} is not a plain number"
    sign, mant, exp = m.groups()
    return (-1 if sign else 1) * float(mant or 1) * 10.0 ** int(exp.translate(SUPERSCRIPTS))


def visible_log_ticks(axis) -> list[tuple[float, str]]:
    lo, hi = sorted(axis.get_view_interval())
    ticks = list(zip(axis.get_majorticklocs(), axis.get_majorticklabels()))
    ticks += list(zip(axis.get_minorticklocs(), axis.get_minorticklabels()))
    return [(float(v), t.get_text()) for v, t in ticks if lo <= v <= hi and t.get_text()]


def test_log_axis_tick_labels_are_plain_numbers_equal_to_their_ticks(saved):
    x = np.arange(5.0)
    line_plot("decay", "step", "value", [Trace("a", x, 10.0**-x)], logy=True)
    steps = np.arange(4)
    values = np.array([[1e-3, 1e-2, 1e-1, 1.0], [2e-3, 3e-2, 0.5, 2.0]])
    heatmap_plot("grid", ["a", "b"], steps, values, "l2", log=True)
    (line_fig, heat_fig) = saved
    ticks = visible_log_ticks(line_fig.axes[0].yaxis)
    colorbar = [ax for ax in heat_fig.axes if ax.get_yscale() == "log"]
    assert colorbar, "the log heatmap has a log colourbar"
    ticks += visible_log_ticks(colorbar[0].yaxis)
    assert len(ticks) >= 6
    for value, text in ticks:
        assert "$" not in text and "mathdefault" not in text, text
        assert math.isclose(label_value(text), value, rel_tol=1e-9), (text, value)
    # and what is written into the picture is the same text (SVG keeps text as text)
    import matplotlib

    with matplotlib.rc_context({"svg.fonttype": "none"}):
        buf = io.StringIO()
        line_fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    assert "mathdefault" not in svg and "10⁻³" in svg and "10⁰" in svg


def test_exact_zero_and_nan_special_counts_have_different_colours_named_in_the_legend(
    saved, tmp_path
):
    import matplotlib.colors as mcolors

    from stepscope.report import histogram_plot
    from stepscope.report.data import histogram_grid
    from tests.report.test_plots import hand_run_at

    h = hand_run_at(tmp_path / "run")
    histogram_plot(histogram_grid(h, "fc", "activation"))
    (fig,) = saved
    top = fig.axes[0]
    (mesh,) = top.collections
    n_cols = mesh.get_coordinates().shape[1] - 1
    colours = mesh.get_facecolor().reshape(-1, n_cols, 4)
    names = [t.get_text().split(" (")[0] for t in top.get_yticklabels()]
    zero, nan = colours[names.index("zero"), 0], colours[names.index("nan"), 0]
    assert not np.allclose(zero[:3], nan[:3]), "exact zeros painted like NaN"
    legend = next(ax.get_legend() for ax in fig.axes if ax.get_legend() is not None)
    by_label = {
        t.get_text(): mcolors.to_rgb(p.get_facecolor())
        for t, p in zip(legend.get_texts(), legend.get_patches())
    }
    assert np.allclose(by_label["NaN"], nan[:3], atol=0.01)
    assert np.allclose(by_label["exact zero"], zero[:3], atol=0.01)


def test_seeds_of_two_recipes_make_a_short_legend(saved, report):
    from stepscope.report.curves import curves_section

    a, b = report["views"]
    views = [with_recipe(a, "plain"), with_recipe(b, "plain")]
    views += [with_recipe(a, "residual"), with_recipe(b, "residual")]
    curves_section(views, [0, 5])
    fig = next(f for f in saved if "cross-entropy vs optimizer step" in f.axes[0].get_title())
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert len(labels) <= 8, labels  # not one entry per seed, recipe and source
    assert not any(run_label(a) in lab or run_label(b) in lab for lab in labels), labels
    flat = " ".join(labels)
    for want in ("plain", "residual", "eval/validation", "min–max"):
        assert want in flat, (want, labels)


def test_log_axis_is_clipped_to_the_datas_meaningful_range(saved):
    index = np.arange(1, 9.0)
    spectrum = np.array([3.0, 1.0, 0.2, 1e-3, 1e-6, 1e-40, 1e-90, 1e-118])
    plot = line_plot("spectrum", "index", "eigenvalue", [Trace("A", index, spectrum)], logy=True)
    (fig,) = saved
    low, high = fig.axes[0].get_ylim()
    assert low >= 3.0 * 1e-11 and high <= 3.0 * 10  # ~10 decades below the largest, not 118
    assert "3 values more than 10 decades below the largest" in plot.caption
    np.testing.assert_array_equal(plot.data["0:A"][1], spectrum)  # the data itself is not cut
