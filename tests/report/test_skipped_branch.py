"""Stochastic depth: a skipped branch keeps stale zero gradients in persistent ``.grad`` storage
(``zero_grad(set_to_none=False)``); the report must draw those steps as gaps, never as zeros."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import stepscope as ss
from stepscope import open_run
from stepscope.collect import Cadence
from stepscope.report import Plot
from stepscope.report.sections import branch_section, layers_section

ACTIVE = [True, False, True, True, False]  # ends skipped: .grad then holds stale zeros


class Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(6, 6)
        self.branch = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, active: bool) -> torch.Tensor:
        h = torch.relu(self.stem(x))
        if active:  # stochastic depth: a dropped block does not run at all
            h = h + self.branch(h)
        return self.head(h)


def test_gradients_of_a_skipped_branch_are_gaps_and_its_activity_is_plotted(tmp_path):
    torch.manual_seed(0)
    model = Residual()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    settings = ss.WatchSettings(output_dir=str(tmp_path / "run"))
    every_step = {"gradient": Cadence(1, None)}
    with ss.HistoryCollector(
        model, streams=("gradient",), cadence=every_step, settings=settings
    ) as c:
        for active in ACTIVE:
            with c.step(opt, examples=16):
                opt.zero_grad(set_to_none=False)  # stale zeros stay in branch.weight.grad
                loss = F.cross_entropy(model(x, active), y)
                loss.backward()
                c.log_mask("branch", torch.tensor([active]), nominal_macs_per_unit=36.0)
                opt.step()
    assert not model.branch.weight.grad.any()  # the storage a naive reader would plot as 0
    view = open_run(tmp_path / "run")
    (grad,) = [i for i in layers_section([view]).all_items if isinstance(i, Plot)]
    rows = grad.data["rows"]
    values = grad.data["values"]
    skipped = ~np.array(ACTIVE)
    for name in ("branch.weight", "branch.bias"):
        row = values[rows.index(name)]
        assert np.isnan(row[skipped]).all() and (row[~skipped] > 0).all()
    assert np.isfinite(values[rows.index("stem.weight")]).all()
    sec = branch_section([view])
    plots = {i.title: i for i in sec.all_items if isinstance(i, Plot)}
    drawn = plots["branch active_fraction vs optimizer step"].data
    (frac,) = [v for k, v in drawn.items() if ":" in k]  # the one trace (not the legend)
    np.testing.assert_array_equal(frac[1], np.array(ACTIVE, float))  # an observed 0 stays 0
    drawn = plots["branch nominal_skipped_macs vs optimizer step"].data
    (macs,) = [v for k, v in drawn.items() if ":" in k]
    np.testing.assert_array_equal(macs[1], 36.0 * skipped)
