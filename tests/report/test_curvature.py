"""The curvature panel reads what ``analyze_curvature`` really writes, and refuses a bad file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope import open_run
from stepscope.report import Plot, Table
from stepscope.report.curvature import curvature_section, find_curvature_files
from stepscope.report.model import run_label
from tests.report.report_testkit import bare_copy


def test_panel_draws_real_analyze_curvature_output(runs, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    x, y = torch.randn(12, 5), torch.randint(0, 3, (12,))
    analysis = ss.analyze_curvature(model, x, y)
    doc = {"epoch": 3, "snapshot_duration_s": 0.5, "analysis": analysis}
    run_dir = bare_copy(runs, tmp_path)
    (run_dir / "curvature-003.json").write_text(json.dumps(doc))
    assert find_curvature_files(run_dir) == [run_dir / "curvature-003.json"]
    run = open_run(run_dir)
    sec = curvature_section([run])
    real = run_label(run)
    plots = {i.title: i for i in sec.all_items if isinstance(i, Plot)}
    spectra = plots[f"factor spectra at epoch 3 · {real}"]
    for layer in ("0", "2"):
        (key,) = [k for k in spectra.data if k.endswith(f":{layer} A (activation)")]
        want = np.array(analysis["layers"][layer]["activation_factor"]["eigenvalues"])
        np.testing.assert_array_equal(spectra.data[key][1], np.where(want > 0, want, np.nan))
    quotient = plots[f"mean-gradient KFAC Rayleigh quotient · {real}"]
    (key,) = [k for k in quotient.data if k.endswith(":0 ce_ggn")]
    want = analysis["directional"]["0"]["ce_ggn"]["mean_gradient_rayleigh_quotient"]
    np.testing.assert_array_equal(quotient.data[key][1], [want])
    tables = {t.title: t for t in sec.all_items if isinstance(t, Table)}
    (row,) = tables[f"output-space Lyapunov mismatch · {real}"].rows
    assert row[1] == str(analysis["output_space"]["support"]["rank"])
    assert len(tables[f"KFAC ranks · {real}"].rows) == 2 * 3  # two layers x three families


def test_a_curvature_file_that_is_not_a_panel_refuses(runs, tmp_path):
    run_dir = bare_copy(runs, tmp_path)
    (run_dir / "curvature").mkdir()
    (run_dir / "curvature" / "curvature-000.json").write_text('{"epoch": 0}')
    with pytest.raises(ss.Refusal) as err:
        curvature_section([open_run(run_dir)])
    assert err.value.code == "report_input_invalid"
