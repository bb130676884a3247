"""A full or read-only disk when a run is created or resumed refuses with a code (never a raw
OSError), with a real tmpfs filled or remounted read-only (root only; skipped otherwise)."""

import os
import subprocess

import pytest
import torch

import stepscope as ss
from stepscope import open_run
from stepscope.errors import Refusal
from stepscope.history import HistoryWriter, StepBlockRecord


@pytest.fixture
def tmpfs(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode()[:200]}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _remount(mnt, mode):
    subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True)


def _fill(mnt):
    fd = os.open(mnt / "ballast", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


def _collector(out):
    model = torch.nn.Linear(2, 2)
    return ss.HistoryCollector(model, settings=ss.WatchSettings(output_dir=str(out)))


@pytest.mark.parametrize("fault", ["read_only", "full"])
def test_creating_or_resuming_on_a_broken_disk_refuses_with_a_code(tmpfs, fault):
    with HistoryWriter(tmpfs / "old") as w:
        w.write_step(StepBlockRecord(0), [])
    if fault == "read_only":
        _remount(tmpfs, "ro")
    else:
        _fill(tmpfs)
    try:
        for make in (
            lambda: HistoryWriter(tmpfs / "new"),
            lambda: HistoryWriter(tmpfs / "old", resume=True),
            lambda: _collector(tmpfs / "new2"),
        ):
            with pytest.raises(Refusal) as err:
                make()
            assert err.value.code in {"history_output_unwritable", "history_disk_fault"}, err.value
            assert isinstance(err.value, OSError)  # a storage refusal, as before
    finally:
        if fault == "read_only":
            _remount(tmpfs, "rw")
        else:
            os.unlink(tmpfs / "ballast")
    assert open_run(tmpfs / "old").steps.tolist() == [0]  # the old run is intact
    w = HistoryWriter(tmpfs / "old", resume=True)  # and resumes once the disk heals
    w.write_step(StepBlockRecord(1), [])
    w.close()
    assert open_run(tmpfs / "old").steps.tolist() == [0, 1]
