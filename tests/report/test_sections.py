"""What each report plot was given equals what the runs really did (independent records kept
while training), and missing observations reach the plots as NaN gaps, never as zeros."""

from __future__ import annotations

import json

import numpy as np
import torch

from stepscope import open_run
from stepscope.report import Note, Table
from stepscope.report.model import run_label
from tests.report.report_testkit import (
    EVAL_ACC_STEPS,
    PROBE_STEPS,
    STEPS,
    as_array,
    plots_titled,
    with_recipe,
)

STEP_AXIS = np.arange(STEPS)


def trace(plot, label: str):
    """The arrays a line plot drew for the trace labelled ``label``."""
    for key, value in plot.data.items():
        if ":" in key and key.split(":", 1)[1] == label:
            return value
    raise KeyError(f"{label!r} not in {list(plot.data)}")


def heatmap(report, title: str, run: int):
    """The training-stream heatmap (not the dense probe's Plot 3) whose title names ``title``.

    The report draws one run per recipe (run 0 here); run 1's heatmaps are drawn with
    ``every_seed``, as ``stepscope report --every-seed`` does.
    """
    from stepscope.report.sections import layers_section

    label = run_label(report["views"][run])
    sec = report["sections"]["layers"]
    if run:
        sec = layers_section(report["views"], every_seed=True)
    found = [p for p in plots_titled(sec, "training-") if f" {title} (" in p.title]
    (plot,) = found[run : run + 1]
    assert plot.title.endswith(label)
    return plot


def matrix_of(plot, truth_table: dict[str, dict[int, float]]) -> np.ndarray:
    rows = plot.data["rows"]
    assert sorted(rows) == sorted(truth_table)
    return np.stack([as_array(truth_table[r], plot.data["steps"]) for r in rows])


def test_layer_heatmaps_match_norms_and_zero_fractions_computed_from_the_tensors(report, runs):
    for run in (0, 1):
        truth = runs[f"truth{run}"]
        cases = [
            ("gradient L2", truth.grad_l2, 1e-6),
            ("parameter L2", truth.param_l2, 1e-6),
            ("update / parameter ratio", truth.update_ratio, 1e-5),
            ("activation zero fraction", truth.act_zero, 0),
            ("backprop zero fraction", truth.grad_zero, 0),
        ]
        for title, table, rtol in cases:
            plot = heatmap(report, title, run)
            assert plot.xlabel == "optimizer step"
            np.testing.assert_array_equal(plot.data["steps"], STEP_AXIS)
            want = matrix_of(plot, table)
            got = plot.data["values"]
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            np.testing.assert_allclose(got, want, rtol=rtol, atol=0)


def test_parameters_not_observed_at_odd_steps_are_drawn_as_nan_gaps_not_zeros(report):
    for title in ("parameter L2", "update / parameter ratio"):
        plot = heatmap(report, title, 0)
        values = plot.data["values"]
        assert np.isnan(values[:, 1::2]).all() and np.isfinite(values[:, 0::2]).all()
        assert (values[:, 0::2] > 0).all()
        drawn, edges = plot.data["drawn"], plot.data["drawn_x_edges"]
        centres = (edges[:-1] + edges[1:]) / 2
        odd = np.isin(np.round(centres), [1, 3, 5])
        assert np.isnan(drawn[:, odd]).all() and not (drawn == 0).any()


def test_curves_show_seed_traces_and_their_mean_with_a_min_max_interval(report, runs):
    sec = report["sections"]["curves"]
    (ce,) = plots_titled(sec, "cross-entropy vs optimizer step")
    (acc,) = plots_titled(sec, "accuracy vs optimizer step")
    probe = np.array(PROBE_STEPS, float)
    per_run = []
    for run, view in enumerate(report["views"]):
        truth = runs[f"truth{run}"]
        want = np.array([truth.probe[s]["probe/model/loss"] for s in PROBE_STEPS])
        x, y = trace(ce, f"probe · {run_label(view)}")
        np.testing.assert_array_equal(x, probe)
        np.testing.assert_allclose(y, want, rtol=1e-12)
        per_run.append(want)
        x, y = trace(acc, f"eval/validation · {run_label(view)}")
        want_acc = as_array(truth.eval_acc, x)
        np.testing.assert_array_equal(x, [0.0, 2.0, 5.0])
        assert np.isnan(y[1]) and np.isnan(want_acc[1])  # accuracy not evaluated at step 2: a gap
        np.testing.assert_allclose(y[[0, 2]], want_acc[[0, 2]], rtol=1e-12)
    # the kit's two seeds probe different examples: their probe curves are never averaged
    assert not any("probe · mean" in k for k in ce.data)
    assert any("probed different examples" in n.text for n in sec.items if isinstance(n, Note))
    _, eval_mean = trace(acc, "eval/validation · mean of 2 runs")
    assert np.isnan(eval_mean[1]) and np.isfinite(eval_mean[[0, 2]]).all()
    assert set(EVAL_ACC_STEPS) == {0, 5}


def test_official_test_split_is_plotted_only_at_its_declared_endpoint(report):
    (ce,) = plots_titled(report["sections"]["curves"], "cross-entropy vs optimizer step")
    x, y = trace(ce, f"eval/test · {run_label(report['views'][0])}")
    np.testing.assert_array_equal(x, [5.0])  # the step-2 test evaluation was not an endpoint
    np.testing.assert_array_equal(y, [14.0])


def test_training_seconds_axis_uses_the_isolated_clock_and_throughput_is_examples_per_second(
    report, runs
):
    sec = report["sections"]["curves"]
    (ce_s,) = plots_titled(sec, "cross-entropy vs isolated training seconds")
    assert ce_s.xlabel == "isolated training seconds"
    clock = open_run(runs["seed0"]).scalars("clock/training_seconds")
    np.testing.assert_array_equal(clock.steps, STEP_AXIS)
    x, _ = trace(ce_s, f"probe · {run_label(report['views'][0])}")
    np.testing.assert_array_equal(x, clock.values[list(PROBE_STEPS)])
    (tp,) = plots_titled(report["sections"]["branch"], "measured training throughput")
    _, rate = trace(tp, f"throughput · {run_label(report['views'][0])}")
    want = np.concatenate([[np.nan], 48.0 / np.diff(clock.values)])
    np.testing.assert_allclose(rate, want, rtol=1e-12)
    assert "isolated training second" in tp.caption
    (elapsed,) = plots_titled(sec, "total elapsed time")
    _, total = trace(elapsed, f"total elapsed · {run_label(report['views'][0])}")
    assert (total >= clock.values).all()  # total elapsed is shown apart, never as training


def test_branch_activity_is_plotted_as_logged(report, runs):
    sec = report["sections"]["branch"]
    label = run_label(report["views"][1])
    (p,) = plots_titled(sec, "branch survival_probability")
    x, y = trace(p, f"block1 · {label}")
    np.testing.assert_array_equal(x, STEP_AXIS)
    np.testing.assert_allclose(y, 1.0 - 0.05 * STEP_AXIS)
    truth = runs["truth1"]
    for quantity, table in (
        ("active_fraction", truth.active_fraction),
        ("nominal_skipped_macs", truth.skipped_macs),
    ):
        (p,) = plots_titled(sec, f"branch {quantity}")
        x, y = trace(p, f"block1 · {label}")
        np.testing.assert_array_equal(y, as_array(table, x))


def test_endpoints_show_the_probe_confusion_class_counts_and_gap(report, runs):
    from stepscope.report.endpoints import endpoints_section

    sec = report["sections"]["endpoints"]
    assert not plots_titled(sec, f"probe confusion at step 0 · {run_label(report['views'][1])}")
    assert "first run of each recipe" in " ".join(
        n.text for n in sec.all_items if isinstance(n, Note)
    )
    (last,) = [i for i in sec.items if isinstance(i, Table)]  # open: the last endpoint only
    assert {r[1] for r in last.rows} == {"5"}
    sec = endpoints_section(report["views"], [0, 5], every_seed=True)
    for run, view in enumerate(report["views"]):
        truth = runs[f"truth{run}"]
        for step in (0, 5):
            (m,) = plots_titled(sec, f"probe confusion at step {step} · {run_label(view)}")
            np.testing.assert_array_equal(m.data["matrix"], truth.confusion[step])
        (bars,) = plots_titled(sec, f"probe predicted-class counts · {run_label(view)}")
        for step in (0, 5):
            np.testing.assert_array_equal(
                bars.data["groups"][f"step {step}"], truth.predicted[step]
            )
    (table,) = [i for i in sec.details if isinstance(i, Table)]
    rows = {(r[0], r[1], r[2]): r for r in table.rows}
    row = rows[(run_label(report["views"][0]), "5", "validation")]
    test0 = rows[(run_label(report["views"][0]), "0", "test")]
    assert test0[7] == "not recorded"  # no test evaluation at step 0
    assert rows[(run_label(report["views"][0]), "5", "test")][7] == "14"
    truth = runs["truth0"]
    probe_acc = truth.probe[5]["probe/model/accuracy_fraction"]
    assert float(row[3]) == np.float64(f"{probe_acc:.4g}")  # rounded to 4 significant digits
    assert float(row[5]) == np.float64(f"{probe_acc - truth.eval_acc[5]:.4g}")


def test_probe_moments_are_the_recorded_values_per_layer(report, runs):
    sec = report["sections"]["moments"]
    for key, prefix in (
        ("grad_norm_rms", "per-example gradient RMS"),
        ("covariance_trace", "gradient covariance trace"),
        ("gradient_diversity", "gradient diversity"),
    ):
        plot = plots_titled(sec, prefix)[0]
        for layer in ("0", "2"):
            x, y = trace(plot, f"layer {layer}")
            want = [runs["truth0"].probe[s].get(f"probe/{layer}/{key}", np.nan) for s in x]
            np.testing.assert_allclose(y, want, rtol=1e-12)
    (table,) = [i for i in sec.all_items if isinstance(i, Table)]
    assert {r[4] for r in table.rows} == {"16"}  # the probe's sample size is stated


def test_histograms_over_time_count_every_element_and_show_relu_zeros(report, runs):
    sec = report["sections"]["histograms"]
    plot = plots_titled(sec, "1 · activation")[0]
    np.testing.assert_array_equal(plot.data["steps"], [0, 2, 4])
    zeros = [round(runs["truth0"].act_zero["1"][s] * 48 * 12) for s in (0, 2, 4)]
    np.testing.assert_array_equal(plot.data["specials"]["zero"], zeros)
    total = plot.data["counts"].sum(axis=0) + sum(plot.data["specials"].values())
    np.testing.assert_array_equal(total, [48 * 12] * 3)
    assert (plot.data["bins"] >= 0).all()  # a ReLU output has no negative values


def test_curvature_panel_draws_each_checkpoint_json(report, runs):
    sec = report["sections"]["curvature"]
    label = run_label(report["views"][0])
    docs = runs["truth0"].curvature
    for doc in docs:
        (spectra,) = plots_titled(sec, f"factor spectra at epoch {doc['epoch']} · {label}")
        _, y = trace(spectra, "0 A (activation)")
        want = np.array(doc["analysis"]["layers"]["0"]["activation_factor"]["eigenvalues"])
        np.testing.assert_array_equal(y, np.where(want > 0, want, np.nan))  # 0 not on a log axis
        _, b = trace(spectra, "0 B ce_ggn")
        np.testing.assert_array_equal(
            b, doc["analysis"]["layers"]["0"]["ce_ggn"]["backprop_factor"]["eigenvalues"]
        )
        assert spectra.xlabel == "eigenvalue index (descending)"
        assert "snapshot took 1.25 s" in spectra.caption
    (q,) = plots_titled(sec, f"mean-gradient KFAC Rayleigh quotient · {label}")
    x, y = trace(q, "0 jacobian_gram")
    np.testing.assert_array_equal(x, [0.0, 5.0])
    assert y[0] == 0.7 and np.isnan(y[1])  # null in the JSON: a gap
    _, y = trace(q, "0 ce_ggn")
    np.testing.assert_array_equal(y, [0.5, 1.0])
    tables = {t.title: t for t in sec.all_items if isinstance(t, Table)}
    lyap = tables[f"output-space Lyapunov mismatch · {label}"]
    assert [r[2] for r in lyap.rows] == ["3", "6"]
    ranks = tables[f"KFAC ranks · {label}"]
    assert ["5", "0", "jacobian_gram", "6", "2.5", "1.5", "0.1"] in ranks.rows


def test_run_record_lists_versions_hashes_and_cadences(report):
    (table, *_rest) = report["sections"]["record"].all_items
    fields = dict(table.rows)
    run = report["views"][0].run
    assert fields["packages.torch"] == torch.__version__
    assert fields["model_fingerprint"] == run.model_fingerprint
    assert fields["extra.cadences.parameter.spine"] == "2"
    assert fields["extra.seed"] == "0"


def test_measured_overhead_comes_from_the_runlog_summary(report, runs):
    summary = json.loads((runs["seed0"] / "runlog.json").read_text())
    tables = [t for t in report["sections"]["record"].all_items if isinstance(t, Table)]
    (overhead,) = [t for t in tables if t.title.startswith("measured overhead")][:1]
    fields = dict(overhead.rows)
    for key in ("overhead_fraction", "training_seconds"):  # shown to 4 significant digits
        assert float(fields[key]) == float(f"{summary[key]:.4g}")


def test_runs_of_different_recipes_are_never_averaged_together(report):

    from stepscope.report.curves import curves_section

    a, b = report["views"]
    sec = curves_section([with_recipe(a, "plain"), with_recipe(b, "residual")], [0, 5])
    (ce,) = plots_titled(sec, "cross-entropy vs optimizer step")
    labels = [k.split(":", 1)[1] for k in ce.data if ":" in k]
    assert not any("mean of" in lab for lab in labels)
    assert (
        f"probe · plain · {run_label(a)}" in labels
        and f"probe · residual · {run_label(b)}" in labels
    )
    same = curves_section([with_recipe(a, "plain"), with_recipe(b, "plain")], [0, 5])
    (ce,) = plots_titled(same, "cross-entropy vs optimizer step")
    labels = [k.split(":", 1)[1] for k in ce.data if ":" in k]
    assert "eval/validation · mean of 2 runs" in labels  # one recipe: averaged
    # (the kit's two seeds probe different examples, so their probe curves are not averaged)
    assert "probe · mean of 2 runs" not in labels


def test_default_endpoints_are_where_probe_and_evaluation_were_both_taken(report):
    from stepscope.report.endpoints import default_endpoints

    assert default_endpoints(report["views"]) == [0, 5]
