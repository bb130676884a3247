"""The seed's plot plan, to the letter: Plot 3 from dense-probe quantities (training streams apart),
every run drawn, historical overlays in their own style, recorder FP32 beside offline FP64,
evaluation-split confusion matrices."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope import Refusal, open_run
from stepscope.cli import main
from stepscope.probe import read_probe_identity
from stepscope.report import Note, Table, build_sections
from stepscope.report.curves import curves_section
from stepscope.report.data import PROBE_LAYER_QUANTITIES
from stepscope.report.endpoints import endpoints_section
from stepscope.report.model import run_label
from stepscope.report.overlay import load_overlay
from stepscope.report.sections import histograms_section, layers_section, moments_section
from tests.report.report_testkit import PROBE_STEPS, plots_titled, train_run

PLOT3 = {
    "grad_fro_legacy_scale": "dense-probe gradient L2",
    "param_l2": "dense-probe parameter L2",
    "delta_since_snapshot": "dense-probe delta_since_snapshot",
    "update_ratio": "dense-probe update ratio",
    "activation_zero_fraction": "dense-probe activation zero fraction",
    "backprop_zero_fraction": "dense-probe backprop zero fraction",
}


def test_plot3_heatmaps_are_the_dense_probe_quantities(report, runs):
    # every_seed: run 1's panels too (the report itself draws the first run of each recipe)
    sec = layers_section(report["views"], every_seed=True)
    assert set(PLOT3) == set(PROBE_LAYER_QUANTITIES)
    for run in (0, 1):
        label = run_label(report["views"][run])
        truth = runs[f"truth{run}"].probe
        for key, prefix in PLOT3.items():
            found = [p for p in plots_titled(sec, prefix) if p.title.endswith(label)]
            if key == "update_ratio":  # the kit never wraps a step in around_step: no rows
                assert not found
                continue
            (plot,) = found
            assert plot.data["rows"] == ["0", "2"]
            np.testing.assert_array_equal(plot.data["steps"], PROBE_STEPS)
            want = np.array(
                [[truth[s].get(f"probe/{lay}/{key}", np.nan) for s in PROBE_STEPS] for lay in "02"]
            )
            np.testing.assert_array_equal(np.isnan(plot.data["values"]), np.isnan(want))
            np.testing.assert_allclose(plot.data["values"], want, rtol=1e-12)
    # the sampled training-minibatch streams are drawn too, under their own titles
    training = plots_titled(sec, "training-")
    assert len(training) == 2 * 5
    assert not any("dense-probe" in p.title for p in training)


@pytest.fixture(scope="module")
def six_runs(runs, tmp_path_factory):
    """Five runs (the session's two seeds and three more) to check that none is cut."""
    root = tmp_path_factory.mktemp("five")
    paths = [runs["seed0"], runs["seed1"]]
    for seed in (2, 3, 4):
        train_run(root / f"seed{seed}", seed, curvature=False)
        paths.append(root / f"seed{seed}")
    views = [open_run(p) for p in paths]
    sections = [  # every_seed: per-run panels for each seed (the report's --every-seed)
        layers_section(views, every_seed=True),
        moments_section(views, every_seed=True),
        endpoints_section(views, [0, 5], every_seed=True),
        histograms_section(views, limit=5, every_seed=True),
    ]
    return views, {s.key: s for s in sections}


def test_every_run_is_drawn_in_layers_moments_and_endpoints(six_runs):
    views, sections = six_runs
    labels = [run_label(v) for v in views]
    assert len(set(labels)) == 5
    for key, prefix in (
        ("layers", "dense-probe gradient L2"),
        ("layers", "training-minibatch gradient L2"),
        ("moments", "per-example gradient RMS"),
        ("endpoints", "probe confusion at step 0"),
        ("endpoints", "probe predicted-class counts"),
    ):
        titles = [p.title for p in plots_titled(sections[key], prefix)]
        assert [t.rsplit(" · ", 1)[1] for t in titles] == labels, (key, prefix)


def test_histogram_selection_is_stated_not_silent(six_runs):
    _, sections = six_runs
    sec = sections["histograms"]
    assert len(plots_titled(sec, "")) == 5
    (note,) = [i for i in sec.all_items if isinstance(i, Note)]
    assert "5 histogram panels drawn" in note.text and "more not drawn" in note.text


OVERLAY = {
    "label": "legacy 425pu650",
    "regime": "historical: different source, recipe and hardware",
    "source": "selected-histories.json (first, best, last)",
    "points": [
        {"name": "val_acc", "optimizer_step": 0, "value": 9.8, "unit": "pct", "note": "first"},
        {"name": "val_acc", "optimizer_step": 4, "value": 97.5, "unit": "pct", "note": "last"},
        {"name": "val_loss", "optimizer_step": 4, "value": 0.09},
    ],
}


def test_overlay_is_drawn_in_its_own_style_with_its_regime(runs, tmp_path):
    path = tmp_path / "overlay.json"
    path.write_text(json.dumps(OVERLAY))
    views = [open_run(runs["seed0"])]
    sections = {"curves": curves_section(views, [0, 5], [load_overlay(path)])}
    (acc,) = plots_titled(sections["curves"], "accuracy vs optimizer step")
    label = (
        f"historical · {OVERLAY['label']} · {OVERLAY['regime']} · official test (historical val_*)"
    )
    (key,) = [k for k in acc.data if ":" in k and k.split(":", 1)[1] == label]
    x, y = acc.data[key]
    np.testing.assert_array_equal(x, [0, 4])
    np.testing.assert_allclose(y, [0.098, 0.975])  # percent read as a fraction
    assert acc.data[f"{key}:kind"] == "overlay"  # drawn as isolated markers, not a curve
    # the regime is explained once per section (a note), not as a second caption variant
    notes = [i.text for i in sections["curves"].all_items if isinstance(i, Note)]
    assert any("different source/recipe/hardware regime" in t for t in notes)
    no_overlay = curves_section(views, [0, 5])
    assert not any("Hollow diamonds" in i.text for i in no_overlay.all_items if isinstance(i, Note))
    (ce,) = plots_titled(sections["curves"], "cross-entropy vs optimizer step")
    assert any("official test (historical val_*)" in k for k in ce.data)
    # never on the isolated-training-seconds axis: the old run has no such clock
    for p in plots_titled(sections["curves"], "accuracy vs isolated training seconds"):
        assert not any("historical" in k for k in p.data)
    out = tmp_path / "r.html"
    assert main(["report", str(runs["bare"]), "--out", str(out), "--overlay", str(path)]) == 0
    assert "historical val_* is its official test" in out.read_text()


def test_malformed_overlay_is_refused(tmp_path):
    bad = dict(OVERLAY, regime="")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(Refusal) as err:
        load_overlay(path)
    assert err.value.code == "overlay_invalid"


def test_recorder_fp32_and_offline_fp64_probe_numbers_side_by_side(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs["seed0"], run)
    shutil.rmtree(run / "curvature")
    (run / "curvature").mkdir()
    identity = read_probe_identity(run)
    doc = {
        "epoch": 1,
        "optimizer_step": 5,
        "analysis": {
            "metadata": {
                "probe_cross_entropy_mean": 0.75,
                "probe_accuracy_fraction": 0.5,
                "probe_sha256": identity["sha256"],
            },
            "layers": {},
        },
    }
    (run / "curvature" / "curvature-001.json").write_text(json.dumps(doc))
    sections = {s.key: s for s in build_sections([open_run(run)])}
    (table,) = [
        i
        for i in sections["curvature"].all_items
        if isinstance(i, Table) and i.title.startswith("recorder FP32 vs offline FP64")
    ]
    (row,) = table.rows
    truth = runs["truth0"].probe[5]
    assert row[1] == "5"
    assert float(row[2]) == pytest.approx(truth["probe/model/loss"], rel=1e-3)
    assert row[3] == "0.75" and float(row[4]) == pytest.approx(
        truth["probe/model/loss"] - 0.75, rel=1e-3, abs=1e-4
    )
    assert float(row[5]) == pytest.approx(truth["probe/model/accuracy_fraction"], rel=1e-3)
    assert row[7] == "yes" and "float32" in table.header[2]


def test_evaluation_split_confusion_is_drawn_at_the_endpoints(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3))
    x, y = torch.randn(30, 4), torch.randint(0, 3, (30,))
    settings = ss.WatchSettings(output_dir=str(tmp_path / "run"))
    with ss.HistoryCollector(model, streams=("activation",), settings=settings) as c:
        with torch.no_grad():
            pred = model(x).argmax(1)
        conf = torch.zeros(3, 3, dtype=torch.int64)
        for t, p in zip(y.tolist(), pred.tolist()):  # by hand
            conf[t, p] += 1
        c.log_eval("validation", {"accuracy": 0.3, "confusion": conf})
    sec = endpoints_section([open_run(tmp_path / "run")], [0])
    (plot,) = plots_titled(sec, "validation confusion at step 0")
    assert [v for v in plot.data.values() if isinstance(v, np.ndarray) and v.shape == (3, 3)]
    matrix = next(v for v in plot.data.values() if isinstance(v, np.ndarray) and v.shape == (3, 3))
    np.testing.assert_array_equal(matrix, conf.numpy())


def test_the_run_records_telemetry_accounting_is_shown(runs, tmp_path):
    from stepscope.report.record import record_section

    run = tmp_path / "run"
    shutil.copytree(runs["seed0"], run)
    accounting = {"probe_seconds": 0.25, "probe_serialization_seconds": 0.125}
    (run / "telemetry.json").write_text(
        json.dumps(accounting | {"overall_telemetry_fraction": 0.5})
    )
    sec = record_section([open_run(run)])
    (table,) = [i for i in sec.all_items if isinstance(i, Table) and "telemetry.json" in i.title]
    assert dict(map(tuple, table.rows)) == {
        "probe_seconds": "0.25",
        "probe_serialization_seconds": "0.125",
        "overall_telemetry_fraction": "0.5",
    }


def test_probe_mean_is_drawn_only_over_runs_of_the_same_probe(tmp_path):
    """Two seeds of one recipe probing the *same* examples get a mean; the per-run values are
    the recorded ones and the mean is their plain average."""
    torch.manual_seed(0)
    x, y = torch.randn(40, 5), torch.randint(0, 3, (40,))
    paths, losses = [], []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3))
        probe = ss.DenseProbe(x, y, size=16, seed=7)  # one probe for both seeds
        path = tmp_path / f"seed{seed}"
        settings = ss.WatchSettings(output_dir=str(path), extra={"seed": seed})
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with ss.HistoryCollector(model, streams=("activation",), settings=settings) as c:
            per_step = []
            for step in range(3):
                with c.step(opt, examples=40):
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                rec = probe.measure(model, step=step + 1, examples_seen=40, epoch=0)
                ss.probe.write_probe_record(c, rec)
                per_step.append(rec.model.loss)
        paths.append(path)
        losses.append(per_step)
    views = [open_run(p) for p in paths]
    sec = curves_section(views, [1, 3])
    (ce,) = plots_titled(sec, "cross-entropy vs optimizer step")
    (key,) = [k for k in ce.data if k.endswith(":probe · mean of 2 runs")]
    np.testing.assert_allclose(ce.data[key][1], np.mean(losses, axis=0), rtol=1e-12)
    assert not any(isinstance(n, Note) and "different examples" in n.text for n in sec.all_items)
