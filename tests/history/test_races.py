"""Two writers on one directory, and a half-created run: nothing committed is ever re-created."""

import numpy as np
import pytest

import stepscope.history.artifact as artifact_mod
from stepscope import open_run
from stepscope.errors import Refusal
from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.segment import lock_writer


def _write(w, steps):
    ids = [w.register_site("fc", "t", "x")]
    for step in steps:
        spine = np.zeros((1, 15))
        spine[0, :2] = 1
        w.write_step(
            StepBlockRecord(step), [ObservationBatch.observed("activation", "forward", ids, spine)]
        )
    return w.close()


def test_a_second_writer_that_saw_an_empty_directory_does_not_recreate_a_closed_run(
    tmp_path, monkeypatch
):
    """Writer B checks the directory, then writer A creates, commits 5 steps and closes before B
    takes the lock. B must see A's run once it holds the lock (refuse), not re-create it."""
    path = tmp_path / "run"
    inside = []

    def lock_after_a_finished(p):
        if not inside:  # B's lock: A runs to completion first (the race, made deterministic)
            inside.append(True)
            _write(HistoryWriter(path, commit_steps=2), range(5))
        return lock_writer(p)

    monkeypatch.setattr(artifact_mod, "lock_writer", lock_after_a_finished)
    with pytest.raises(Refusal) as err:
        HistoryWriter(path)
    assert err.value.code == "history_run_exists"
    monkeypatch.undo()
    h = open_run(path)
    assert h.steps.tolist() == [0, 1, 2, 3, 4]
    report = h.verify()
    assert report.ok and not report.orphans


def test_a_creation_killed_before_index_json_is_started_afresh(tmp_path):
    """manifest.json written, no index.json (nothing can have been committed): the same command
    starts the run, and so does a resume (there is nothing to resume)."""
    for resume in (False, True):
        path = tmp_path / f"run{resume}"
        _write(HistoryWriter(path), [0])
        (path / "index.json").unlink()  # the state of a kill between manifest and index
        for p in (path / "chunks").iterdir():
            p.unlink()
        for p in (path / "index").iterdir():
            p.write_bytes(b"")
        report = _write(HistoryWriter(path, resume=resume), [0, 1])
        assert report.uncommitted_steps == 0
        assert open_run(path).steps.tolist() == [0, 1]


def test_a_lost_index_json_beside_committed_chunks_is_never_overwritten(tmp_path):
    path = tmp_path / "run"
    _write(HistoryWriter(path), [0, 1])
    (path / "index.json").unlink()
    with pytest.raises(Refusal) as err:
        HistoryWriter(path)
    assert err.value.code == "history_run_exists"
    assert len(list((path / "chunks").iterdir())) >= 2  # the committed chunks are still there


def test_a_resume_killed_between_manifest_and_index_opens_verifies_and_resumes(tmp_path):
    from stepscope.history.segment import write_manifest

    path = tmp_path / "run"
    _write(HistoryWriter(path), [0, 1, 2])
    h = open_run(path)
    new = h.segments[-1].resumed(3)  # what a resume writes first: the manifest with its segment
    write_manifest(path, h.descriptor.to_dict(), [*h.segments, new], durable=False)
    h = open_run(path)
    assert h.steps.tolist() == [0, 1, 2] and len(h.segments) == 1
    assert h.verify().ok
    w = HistoryWriter(path, resume=True)
    _write(w, [3])
    h = open_run(path)
    assert h.steps.tolist() == [0, 1, 2, 3] and len(h.segments) == 2 and h.verify().ok


def test_a_manifest_edited_otherwise_still_refuses(tmp_path):
    path = tmp_path / "run"
    _write(HistoryWriter(path), [0])
    raw = (path / "manifest.json").read_text()
    (path / "manifest.json").write_text(raw.replace('"segments"', '"segments" ', 1))
    with pytest.raises(Refusal) as err:
        open_run(path)
    assert err.value.code == "history_artifact_corrupt"


def test_resume_on_an_empty_directory_starts_a_fresh_run_in_the_collector_too(tmp_path):
    import torch

    import stepscope as ss

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = tmp_path / "run"
    c = ss.HistoryCollector(model, settings=ss.WatchSettings(output_dir=str(out), resume=True))
    with c.step(opt):
        model(torch.ones(3, 2)).sum().backward()
        opt.step()
    c.close()
    assert open_run(out).steps.tolist() == [0]
    assert HistoryWriter(tmp_path / "w", resume=True).resumed_after is None
