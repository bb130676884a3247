"""Disk faults never stop training: a full or read-only disk under a live training loop.

The faults are real: a small tmpfs is mounted (root only), filled to ENOSPC with a ballast file or
remounted read-only in the middle of training, then freed. Without root the same contract is
checked through a fault-injecting layer (``os.pwrite``/``os.replace`` raising ``ENOSPC``).
The oracle is an unobserved twin of the model trained on the same data: the recorded parameter
sums must be the twin's at every committed step. Every test runs with the background writer (the
collector's default: the faults meet the writer thread) and with the synchronous writer.
"""

import errno
import os
import warnings

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope.cli import main
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence
from stepscope.run import open_run  # the reader with the run log's evals.log

STEPS, FAULT_AT, HEAL_AT = 24, 6, 15


@pytest.fixture(params=[True, False], ids=["background", "synchronous"])
def background(request):
    """``WatchSettings.background_writer`` of the run under test."""
    return request.param


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
    )


def _batch(step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(4, 5, 16, generator=g)


def _train(path, fault, heal, **settings):
    """Train STEPS steps with telemetry, calling ``fault()``/``heal()`` at FAULT_AT/HEAL_AT."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    c = ss.HistoryCollector(
        model,
        sites=lambda n, m: isinstance(m, torch.nn.Linear),
        streams=("parameter", "gradient"),
        cadence=1,
        settings=ss.WatchSettings(
            output_dir=str(path), commit_steps=2, commit_seconds=None, **settings
        ),
    )
    sums = []
    committed_before_fault = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            if step == FAULT_AT:
                c.writer.commit()  # what the writer thread may still be committing: done first
                committed_before_fault = c.writer.committed_step
                fault()
            if step == HEAL_AT:
                # the writer thread meets the fault with every step written so far (one more
                # commit attempt, in both modes) before the disk heals: its scheduling does not
                # decide how many steps wait in RAM
                c.writer.commit()
                heal()
            with c.step(opt, examples=4):
                loss = model(_batch(step)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            c.log("loss", loss.detach())
            if step == FAULT_AT + 2:
                c.log_eval("validation", {"ce": float(step)})
            sums.append(float(model.linear1.weight.detach().double().sum()))
        c.close()
    faults = [w for w in caught if "history_disk_fault" in str(w.message)]
    return c, sums, committed_before_fault, faults


def _twin_sums():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for step in range(STEPS):
        model(_batch(step)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        out.append(float(model.linear1.weight.detach().double().sum()))
    return out


def _check_complete(path, c, sums, committed_before_fault, faults, capsys):
    assert c.close_report.faults and len(faults) == 1  # warned once, with the code
    assert c.close_report.uncommitted_steps == 0
    h = open_run(path)
    assert h.steps.tolist() == list(range(STEPS))  # every step committed after the fault
    assert committed_before_fault is not None and committed_before_fault >= FAULT_AT - 2
    s = h.series("linear1.weight", "parameter", "sum")
    np.testing.assert_allclose(s.values, _twin_sums(), rtol=1e-6)
    np.testing.assert_allclose(s.values, sums, rtol=1e-6)
    assert [r.optimizer_step for r in h.evals("validation")] == [FAULT_AT + 3]
    assert h.verify().ok
    assert main(["verify", str(path)]) == 0
    assert capsys.readouterr().out.startswith("ok:")


def test_a_full_disk_mid_training_loses_nothing_and_recovers(tmpfs, capsys, background):
    mnt = tmpfs.mount("3m")
    run = mnt / "run"
    c, sums, before, faults = _train(
        run,
        lambda: tmpfs.fill(mnt),
        lambda: (mnt / "ballast").unlink(),
        background_writer=background,
    )
    _check_complete(run, c, sums, before, faults, capsys)


def test_a_read_only_remount_mid_training_loses_nothing_and_recovers(tmpfs, capsys, background):
    mnt = tmpfs.mount("3m")
    run = mnt / "run"
    c, sums, before, faults = _train(
        run,
        lambda: tmpfs.remount(mnt, "ro"),
        lambda: tmpfs.remount(mnt, "rw"),
        background_writer=background,
    )
    _check_complete(run, c, sums, before, faults, capsys)


class _InjectedFaults:
    """``os.pwrite`` writes half then raises ENOSPC; ``os.replace`` raises ENOSPC (while on)."""

    def __init__(self, monkeypatch):
        self.on = False
        real_pwrite, real_replace = os.pwrite, os.replace

        def pwrite(fd, data, pos):
            if self.on:
                real_pwrite(fd, bytes(data[: max(1, len(data) // 2)]), pos)  # a torn append
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            return real_pwrite(fd, data, pos)

        def replace(a, b):
            if self.on:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            return real_replace(a, b)

        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "replace", replace)


def test_injected_faults_leave_torn_appends_that_never_poison_later_rows(
    tmp_path, monkeypatch, capsys, background
):
    inj = _InjectedFaults(monkeypatch)
    run = tmp_path / "run"

    def fault():
        inj.on = True

    def heal():
        inj.on = False

    c, sums, before, faults = _train(run, fault, heal, background_writer=background)
    _check_complete(run, c, sums, before, faults, capsys)


def test_past_the_pending_bound_steps_are_disclosed_dropped_never_silently_lost(
    tmp_path, monkeypatch, capsys, background
):
    inj = _InjectedFaults(monkeypatch)
    run = tmp_path / "run"
    c, _sums, _before, _faults = _train(
        run,
        lambda: setattr(inj, "on", True),
        lambda: setattr(inj, "on", False),
        ram_capacity=4,
        background_writer=background,
    )
    report = c.close_report
    assert report.dropped_steps > 0 and report.uncommitted_steps == 0 and not report.ok
    h = open_run(run)
    assert h.steps.tolist() == list(range(STEPS))  # every step block is kept
    s = h.series("linear1.weight", "parameter", "sum")
    names = s.presence_names()
    dropped = np.flatnonzero(names == Presence.BUDGET_DROPPED.value)
    assert len(dropped) == report.dropped_steps
    assert dropped.min() >= FAULT_AT - 2 and dropped.max() < HEAL_AT
    assert np.isnan(s.values[dropped]).all() and s.valid[names == "observed"].all()
    rows = h.table("observations")
    sel = rows["presence"] == code_of(Presence.BUDGET_DROPPED)
    assert {h.disclosures[d] for d in rows["disclosure"][sel]} == {("disk_fault",)}
    np.testing.assert_allclose(s.values[s.valid], np.array(_twin_sums())[s.valid], rtol=1e-6)
    assert h.verify().ok


def test_close_on_a_disk_that_never_heals_reports_instead_of_raising(
    tmp_path, monkeypatch, background
):
    inj = _InjectedFaults(monkeypatch)
    run = tmp_path / "run"
    c, _s, before, faults = _train(
        run, lambda: setattr(inj, "on", True), lambda: None, background_writer=background
    )
    report = c.close_report
    assert report.uncommitted_steps > 0 and report.faults and len(faults) == 1
    inj.on = False
    h = open_run(run)  # what was committed before the fault is intact
    assert h.steps.tolist() == list(range(before + 1))
    assert h.verify().ok
