"""Hostile report inputs: loosely typed curvature JSON refuses with a code; ``$`` in names draws."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import stepscope as ss
from stepscope import open_run
from stepscope.report import render_report
from stepscope.report.curvature import curvature_section
from tests.report.report_testkit import bare_copy, curvature_doc


def _set(doc, path, value):
    obj = doc
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


MUTANTS = {
    "epoch_string": (("epoch",), "3"),
    "epoch_list": (("epoch",), [1]),
    "duration_string": (("snapshot_duration_s",), "fast"),
    "metadata_list": (("analysis", "metadata"), []),
    "estimators_string": (("analysis", "metadata", "estimators"), "x"),
    "layers_list": (("analysis", "layers"), [1, 2]),
    "layer_string": (("analysis", "layers", "0"), "x"),
    "eigenvalues_string": (("analysis", "layers", "0", "activation_factor", "eigenvalues"), "abc"),
    "eigenvalues_nested": (("analysis", "layers", "0", "activation_factor", "eigenvalues"), [[1]]),
    "eigenvalue_none": (("analysis", "layers", "0", "ce_ggn", "backprop_factor", "eigenvalues"), [None]),
    "family_missing": (("analysis", "layers", "0", "jacobian_gram"), None),
    "kfac_list": (("analysis", "layers", "0", "ce_ggn", "kfac"), []),
    "kfac_string_value": (("analysis", "layers", "0", "ce_ggn", "kfac", "top_eigenvalue"), "big"),
    "directional_list": (("analysis", "directional"), [1]),
    "quotient_string": (("analysis", "directional", "0", "ce_ggn"), "x"),
    "quotient_value": (("analysis", "directional", "0", "ce_ggn", "mean_gradient_rayleigh_quotient"), "q"),
    "output_space_list": (("analysis", "output_space"), []),
    "support_string": (("analysis", "output_space", "support"), "x"),
    "lyapunov_list": (("analysis", "output_space", "lyapunov"), [3]),
    "rho_string": (("analysis", "output_space", "lyapunov", "rho_ambient"), "3"),
    "residual_dict": (("analysis", "output_space", "solution_residual"), {"a": 1}),
}  # fmt: skip


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_loosely_typed_curvature_json_refuses_with_a_code(runs, tmp_path, mutant):
    doc = copy.deepcopy(curvature_doc(0, 1.0))
    _set(doc, *MUTANTS[mutant])
    run_dir = bare_copy(runs, tmp_path)
    (run_dir / "curvature").mkdir()
    (run_dir / "curvature" / "curvature-000.json").write_text(json.dumps(doc))
    with pytest.raises(ss.Refusal) as err:
        curvature_section([open_run(run_dir)])
    assert err.value.code == "report_input_invalid"


def test_the_unmutated_document_still_draws(runs, tmp_path):
    run_dir = bare_copy(runs, tmp_path)
    (run_dir / "curvature").mkdir()
    doc = curvature_doc(0, 1.0)
    (run_dir / "curvature" / "curvature-000.json").write_text(json.dumps(doc))
    assert curvature_section([open_run(run_dir)]).items


class _Dollar(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module("cost$\\frac{$x", torch.nn.Linear(4, 4))
        self.add_module("a$b", torch.nn.Linear(4, 2))

    def forward(self, x):
        return getattr(self, "a$b")(getattr(self, "cost$\\frac{$x")(x).relu())


def test_site_names_with_dollar_signs_render_as_text(tmp_path):
    torch.manual_seed(0)
    model = _Dollar()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    with ss.HistoryCollector(
        model, streams=("activation",), settings=ss.WatchSettings(output_dir=str(run))
    ) as c:
        for _ in range(3):
            with c.step(opt, examples=8):
                model(torch.randn(8, 4)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
    out = render_report([run], tmp_path / "report.html")
    assert "cost$\\frac{$x" in out.read_text()
