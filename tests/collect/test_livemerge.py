"""The live merge's packing (what crosses the wire) and its failure rule, without a process group.

Multi-process behaviour (one gather per step, rank 0 equal to ``stepscope merge``):
``tests/distributed/test_sharded.py``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import stepscope as ss
from stepscope.collect import Cadence
from stepscope.collect.distributed import LiveMerge, packed_width, safe_merge
from stepscope.history import StepBlockRecord
from stepscope.stats import SPINE_WIDTH


def _unconnected(rows, width: int) -> LiveMerge:
    """A LiveMerge without a process group (pack/unpack only)."""
    live = LiveMerge.__new__(LiveMerge)
    live.rows, live.width = list(rows), width
    return live


@pytest.fixture(scope="module")
def recorded():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True),
        torch.nn.Flatten(),
        torch.nn.Linear(24, 2),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = ss.HistoryCollector(
        model,
        sites=lambda n, m: True,
        cadence=Cadence(1, 1),
        settings=ss.WatchSettings(update_sample_size=16),
    )
    with c.step(opt, examples=4):
        model(torch.randn(4, 3, 8)).pow(2).mean().backward()
        opt.step()
    c.close()
    return c


@pytest.mark.parametrize("histogram_step", [False, True])
def test_pack_then_unpack_gives_back_every_row(recorded, histogram_step):
    c = recorded
    live = _unconnected(c.rows, c.descriptor.width)
    batches = c.last_batches
    if not histogram_step:  # a spine-only step carries no histogram rows
        batches = [replace(b, hist_rows=None, histograms=None) for b in batches]
    packed = live.pack(c.last_block, batches, histogram_step)
    width = c.descriptor.width if histogram_step else 0
    assert packed.shape == (packed_width(len(c.rows), width),)
    assert packed.shape[0] == 2 + len(c.rows) * (1 + SPINE_WIDTH) + (
        len(c.rows) * (1 + width) if histogram_step else 0
    )
    back = live.unpack(packed, batches)
    assert len(back) == len(batches) >= 4
    for got, want in zip(back, batches):
        np.testing.assert_array_equal(got.presence, want.presence)
        np.testing.assert_array_equal(got.spines, want.spines)  # NaNs in the same places
        if want.hist_rows is None:
            assert got.hist_rows is None
        else:
            np.testing.assert_array_equal(got.hist_rows, want.hist_rows)
            np.testing.assert_array_equal(got.histograms, want.histograms)
        assert got.row_disclosures == want.row_disclosures


def test_a_failing_live_merge_warns_turns_off_and_never_raises():
    class Broken:
        def merge(self, *args):
            raise RuntimeError("connection reset")

    with pytest.warns(RuntimeWarning, match="live rank merge failed"):
        live, merged = safe_merge(Broken(), StepBlockRecord(0), [], False)  # type: ignore[arg-type]
    assert (live, merged) == (None, None)
    assert safe_merge(None, StepBlockRecord(0), [], False) == (None, None)


def test_no_live_merge_without_a_process_group(recorded):
    assert not torch.distributed.is_initialized()
    assert LiveMerge.create(recorded.rows, 520, enabled=True) is None
    assert recorded.plan().live_merge is None
    assert "live merge" not in str(recorded.plan())


ROOT = Path(__file__).resolve().parents[2]  # children import tests.distkit

ONLY_RANK0 = textwrap.dedent(
    """
    import os, warnings, torch, torch.distributed as dist
    import stepscope as ss
    from stepscope.collect import distributed
    distributed.HANDSHAKE_SECONDS = 1.0
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    c = ss.HistoryCollector(model, cadence=1) if rank == 0 else None  # rank 1 does not watch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            if c is not None:
                with c.step(opt):
                    ddp(torch.randn(3, 4)).sum().backward(); opt.step()
            else:
                ddp(torch.randn(3, 4)).sum().backward(); opt.step()
    if c is not None:
        c.close()
        assert c.last_merged is None and c.last_block.optimizer_step == 2
        assert any("live rank merge failed" in str(w.message) for w in caught), caught
    print("done", rank)
    from tests.distkit import leave_and_exit
    leave_and_exit()
    """
)


def test_a_rank_without_a_collector_turns_the_live_merge_off_instead_of_hanging(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ONLY_RANK0],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for r in range(2)
    ]
    try:  # a hang (the old behaviour) fails the test and leaves no process behind
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err[-2000:]
        assert f"done {r}" in out
