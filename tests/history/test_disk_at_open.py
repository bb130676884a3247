"""A full or read-only disk when a run is created or resumed refuses with a code (never a raw
OSError), with a real tmpfs filled or remounted read-only (root only; skipped otherwise)."""

import os

import pytest
import torch

import stepscope as ss
from stepscope import open_run
from stepscope.errors import Refusal
from stepscope.history import HistoryWriter, StepBlockRecord


def _collector(out):
    model = torch.nn.Linear(2, 2)
    return ss.HistoryCollector(model, settings=ss.WatchSettings(output_dir=str(out)))


@pytest.mark.parametrize("fault", ["read_only", "full"])
def test_creating_or_resuming_on_a_broken_disk_refuses_with_a_code(tmpfs, fault):
    mnt = tmpfs.mount("256k")
    with HistoryWriter(mnt / "old") as w:
        w.write_step(StepBlockRecord(0), [])
    if fault == "read_only":
        tmpfs.remount(mnt, "ro")
    else:
        tmpfs.fill(mnt)
    try:
        for make in (
            lambda: HistoryWriter(mnt / "new"),
            lambda: HistoryWriter(mnt / "old", resume=True),
            lambda: _collector(mnt / "new2"),
        ):
            with pytest.raises(Refusal) as err:
                make()
            assert err.value.code in {"history_output_unwritable", "history_disk_fault"}, err.value
            assert isinstance(err.value, OSError)  # a storage refusal, as before
    finally:
        if fault == "read_only":
            tmpfs.remount(mnt, "rw")
        else:
            os.unlink(mnt / "ballast")
    assert open_run(mnt / "old").steps.tolist() == [0]  # the old run is intact
    w = HistoryWriter(mnt / "old", resume=True)  # and resumes once the disk heals
    w.write_step(StepBlockRecord(1), [])
    w.close()
    assert open_run(mnt / "old").steps.tolist() == [0, 1]
