"""Withholding gradient cells of branches that did not run, and resumed evaluation logs."""

import numpy as np
import torch

import stepscope as ss
from stepscope.history import ObservationBatch, Presence, SiteRecord
from stepscope.history.batch import code_of
from stepscope.runlog import withhold_inactive
from stepscope.stats import SPINE_WIDTH

NAMES = ["blocks.1.fc.weight", "blocks.10.fc.weight", "blocks.1", "head.weight"]
SITES = [SiteRecord(i, n, "Linear", "f32[2,2]") for i, n in enumerate(NAMES)]


def _grad_batch(stream="gradient", phase="pre_step"):
    spines = np.arange(4 * SPINE_WIDTH, dtype=float).reshape(4, SPINE_WIDTH)
    hist = np.arange(4 * 3, dtype=np.int64).reshape(4, 3)
    return ObservationBatch.observed(
        stream,
        phase,
        [0, 1, 2, 3],
        spines,
        hist_rows=np.array([0, 1, 2, 3]),
        histograms=hist,
        scale_grad="unscaled",
    )


def test_only_sites_inside_the_branch_are_withheld_with_their_histograms():
    b = _grad_batch()
    (out,) = withhold_inactive([b], SITES, {"blocks.1"})
    nsched, obs = code_of(Presence.NOT_SCHEDULED), code_of(Presence.OBSERVED)
    # blocks.10 is a different branch than blocks.1 (prefix match is on whole name parts)
    assert out.presence.tolist() == [nsched, obs, nsched, obs]
    assert np.isnan(out.spines[[0, 2]]).all()
    assert (out.spines[[1, 3]] == b.spines[[1, 3]]).all()
    assert out.hist_rows.tolist() == [1, 3]
    assert (out.histograms == b.histograms[[1, 3]]).all()
    assert out.row_disclosure(0) == ("branch_not_run:blocks.1",) and out.row_disclosure(1) == ()


def test_parameter_and_update_streams_are_kept_and_nothing_inactive_is_a_no_op():
    spines = np.ones((4, SPINE_WIDTH))
    p = ObservationBatch.observed("parameter", "post_step", [0, 1, 2, 3], spines)
    assert withhold_inactive([p], SITES, {"blocks.1"})[0] is p
    g = _grad_batch()
    assert withhold_inactive([g], SITES, set())[0] is g


def test_activation_grad_cells_are_withheld_too():
    (out,) = withhold_inactive([_grad_batch("activation_grad", "backward")], SITES, {"head"})
    assert out.presence.tolist()[3] == code_of(Presence.NOT_SCHEDULED)


def _one_run(path, steps, evals, resume=False, value=1.0):
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = ss.WatchSettings(output_dir=str(path), resume=resume, durable=False)
    with ss.HistoryCollector(model, settings=settings) as c:
        for _ in range(steps):
            if c._next_step in evals:
                c.log_eval("validation", {"ce": value + c._next_step}, sample_count=4)
            with c.step(opt, examples=4):
                model(torch.ones(4, 2)).sum().backward()
                opt.step()
        if c._next_step in evals:
            c.log_eval("validation", {"ce": value + c._next_step}, sample_count=4)


def test_a_resume_supersedes_the_ancestors_evaluations_from_its_step_on(tmp_path):
    _one_run(tmp_path / "r", 4, {2, 4})  # evaluations at steps 2 and 4 (after the last step)
    _one_run(tmp_path / "r", 2, {4, 6}, resume=True, value=10.0)  # resumes at step 4
    v = ss.open_run(tmp_path / "r").view()
    got = [(r.optimizer_step, r.metrics["ce"]) for r in v.evals("validation")]
    assert got == [(2, 3.0), (4, 14.0), (6, 16.0)]
    s = v.scalar("eval/validation/ce")  # the scalar rows agree (same supersede rule)
    assert list(zip(s.steps.tolist(), s.values.tolist())) == got
