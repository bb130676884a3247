"""Shared helpers: an independent float64 numpy spine, a small deterministic run writer, and real
tmpfs disks for the disk-fault tests."""

import contextlib
import errno
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
from stepscope.history.batch import code_of
from stepscope.history.vocab import Presence
from stepscope.stats import SPINE_FIELDS


def np_spine(x: np.ndarray) -> np.ndarray:
    """The spine of ``x`` computed directly in float64 numpy (the test oracle)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    f = x[np.isfinite(x)]
    v = dict.fromkeys(SPINE_FIELDS, np.nan)
    v.update(
        total=x.size,
        finite=f.size,
        zero=(x == 0).sum(),
        negative=(f < 0).sum(),  # finite negatives (the kernel convention)
        nan=np.isnan(x).sum(),
        posinf=(x == np.inf).sum(),
        neginf=(x == -np.inf).sum(),
        sum=f.sum(),
        sum_squares=(f * f).sum(),
        sum_abs=np.abs(f).sum(),
    )
    if f.size:
        v.update(
            min=f.min(),
            max=f.max(),
            absmax=np.abs(f).max(),
            mean=f.mean(),
            m2=((f - f.mean()) ** 2).sum(),
        )
    return np.array([v[k] for k in SPINE_FIELDS], dtype=np.float64)


OBSERVED = code_of(Presence.OBSERVED)
NOT_SCHEDULED = code_of(Presence.NOT_SCHEDULED)


def step_spines(step: int, n_sites: int) -> np.ndarray:
    """Deterministic per-step spines (a function of the step only)."""
    rng = np.random.default_rng(step)
    return np.stack([np_spine(rng.normal(size=7)) for _ in range(n_sites)])


def write_simple_run(
    path, n_steps=10, n_sites=3, commit_steps=3, start=0, writer=None, run=None, **kw
):
    """Activation spines for ``n_sites`` sites at each step; returns the writer (closed)."""
    w = writer or HistoryWriter(path, run, commit_steps=commit_steps, **kw)
    ids = [w.register_site(f"s{i}", "torch.nn.Linear", "f32[7]") for i in range(n_sites)]
    for step in range(start, start + n_steps):
        b = ObservationBatch.observed("activation", "forward", ids, step_spines(step, n_sites))
        w.write_step(StepBlockRecord(step), [b])
    w.close()
    return w


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "run"


@pytest.fixture(scope="session")
def hx():
    """The helpers above as one fixture (tests use it rather than importing conftest)."""
    return SimpleNamespace(
        np_spine=np_spine,
        step_spines=step_spines,
        write_simple_run=write_simple_run,
        OBSERVED=OBSERVED,
        NOT_SCHEDULED=NOT_SCHEDULED,
    )


class Tmpfs:
    """Real tmpfs disks under ``root`` (root only: :meth:`mount` skips the test otherwise)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounted: list[Path] = []

    def mount(self, size: str) -> Path:
        """A fresh tmpfs of ``size`` (``"64k"``, ``"3m"``), unmounted when the test ends."""
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (the injected faults cover the rest)")
        mnt = self.root / f"mnt{len(self.mounted) or ''}"
        mnt.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode()[:200]}")
        self.mounted.append(mnt)
        return mnt

    @staticmethod
    def remount(mnt: Path, mode: str) -> None:
        """Remount ``mnt`` ``"ro"`` or ``"rw"``."""
        subprocess.run(["mount", "-o", f"remount,{mode}", str(mnt)], check=True)

    @staticmethod
    def fill(mnt: Path) -> Path:
        """Fill ``mnt`` to ENOSPC with ``mnt/ballast`` (its last partial blocks too); returns it."""
        ballast = mnt / "ballast"
        with open(ballast, "wb") as fh:
            block = b"\0" * 65536
            try:
                while True:
                    fh.write(block)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        with contextlib.suppress(OSError), open(ballast, "ab") as fh:
            while True:
                fh.write(b"\0" * 512)
                fh.flush()
        return ballast

    def unmount_all(self) -> None:
        for mnt in reversed(self.mounted):
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        self.mounted.clear()


@pytest.fixture
def tmpfs(tmp_path):
    """:class:`Tmpfs` disks for one test: ``tmpfs.mount("64k")``, ``.fill(mnt)``, ``.remount``."""
    disks = Tmpfs(tmp_path)
    try:
        yield disks
    finally:
        disks.unmount_all()
