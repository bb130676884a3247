"""Sharded tensors: which logical indices a shard owns, DTensor placements, float64 updates."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import stepscope as ss
from stepscope.collect import Cadence
from stepscope.collect.distributed import local_part, local_sample_index, owned_flat_indices
from stepscope.stats import SPINE_FIELDS


@pytest.mark.parametrize(
    ("shape", "offset", "local"),
    [
        ((6, 5), (2, 0), (3, 5)),
        ((4, 3, 5), (1, 1, 0), (2, 2, 5)),
        ((7,), (5,), (2,)),
        ((4, 6), (0, 3), (4, 3)),
        ((3, 4), (3, 0), (0, 4)),
    ],
)
def test_owned_flat_indices_match_a_brute_force_box(shape, offset, local):
    """Against slicing a tensor that holds its own logical flat index at every position."""
    numel = torch.Size(shape).numel()
    ids = torch.arange(numel).reshape(shape)
    box = ids[tuple(slice(o, o + n) for o, n in zip(offset, local))].contiguous()
    logical = torch.randperm(numel, generator=torch.Generator().manual_seed(3))[: numel // 2]
    logical = logical.sort().values
    pos, flat = owned_flat_indices(logical, shape, offset, local)
    want = [
        (p, i)
        for p, v in enumerate(logical.tolist())
        for i, b in enumerate(box.reshape(-1).tolist())
        if b == v
    ]
    assert list(zip(pos.tolist(), flat.tolist())) == want
    assert box.reshape(-1)[flat].tolist() == logical[pos].tolist()


def test_plain_tensors_pass_through_and_keep_their_sample():
    t, idx = torch.randn(4, 3), torch.tensor([1, 5])
    assert local_part(t)[0] is t
    assert local_sample_index(t, idx) is idx


def test_float64_updates_are_not_rounded_through_float32():
    """An update of 1e-9 on weights near 1 vanishes in float32 (both samples round to 1.0)."""
    model = torch.nn.Linear(4, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-9)
    c = ss.HistoryCollector(model, streams=("update",), cadence=Cadence(1, 1))
    with c.step(opt):
        before = model.weight.detach().clone()
        model(torch.ones(2, 4, dtype=torch.float64)).sum().backward()
        opt.step()
    want = (model.weight.detach() - before).reshape(-1)
    row = dict(zip(SPINE_FIELDS, c.last_batches[0].spines[0]))
    c.close()
    assert want.abs().min() > 0
    assert row["zero"] == 0
    assert row["sum"] == pytest.approx(float(want.sum()), rel=1e-12)
    assert row["min"] == float(want.min())


ROOT = Path(__file__).resolve().parents[2]  # children import tests.distkit

SCRIPT = textwrap.dedent(
    """
    import json, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from stepscope.collect.staging import reducible
    dist.init_process_group("gloo", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (1,))
    t = torch.arange(6.0).reshape(2, 3)
    out = {}
    for name, placement in (("shard", Shard(0)), ("replicate", Replicate()),
                            ("partial", Partial())):
        x, reason = reducible(DTensor.from_local(t, mesh, [placement]))
        out[name] = [None if x is None else x.tolist(), reason]
    print(json.dumps(out))
    from tests.distkit import leave_and_exit
    leave_and_exit()
    """
)


def test_dtensor_placements_shard_replicate_and_partial():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    whole = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert got["shard"] == [whole, None]
    assert got["replicate"] == [whole, None]  # coordinate 0 of the replicated dim reduces it
    assert got["partial"] == [None, "dtensor_partial"]  # a summand, not a value
