"""``evals.log`` replaced by a directory or a link: training goes on, close() commits every step."""

import os
import warnings

import pytest
import torch

import stepscope as ss
from stepscope.history import HistoryWriter


@pytest.mark.parametrize("kind", ["directory", "link"])
def test_close_commits_every_pending_step_when_evals_log_is_not_a_file(tmp_path, kind):
    out = tmp_path / "run"
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    settings = ss.WatchSettings(output_dir=str(out), commit_steps=100, commit_seconds=None)
    c = ss.HistoryCollector(model, settings=settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(6):
            with c.step(opt):
                model(torch.randn(4, 3)).sum().backward()
                opt.step()
                opt.zero_grad()
            if step == 2:  # evals.log is replaced behind the writer's back
                if kind == "directory":
                    os.mkdir(out / "evals.log")
                else:
                    os.symlink(tmp_path / "elsewhere", out / "evals.log")
            if step >= 2:
                c.log_eval("validation", {"loss": float(step)})  # never raises into training
        c.close()
    assert any("history_disk_fault" in str(w.message) for w in caught)
    run = ss.open_run(out)
    assert run.steps.tolist() == list(range(6))  # every pending step committed
    w = HistoryWriter(out, resume=True)  # the lock was released
    w.close()
    assert not (tmp_path / "elsewhere").exists()  # the link was never followed
