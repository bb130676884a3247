"""FSDP2 on the CPU (gloo, one process): parameters and gradients are ``DTensor``s, which used to
crash the native kernel (SIGSEGV), then were recorded unsupported. Now each rank reduces its local
shard: with one rank that is the whole tensor, so every row is observed and equals the spine of
``full_tensor()``. Run in a child process so a crash is a failed test, not a dead test session.
(Several ranks: ``tests/distributed/test_sharded.py``.)"""

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from stepscope.history import Presence
from stepscope.history.batch import code_of

pytestmark = pytest.mark.skipif(
    not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)

ROOT = Path(__file__).resolve().parents[2]  # children import tests.distkit

SCRIPT = textwrap.dedent(
    """
    import json, torch, torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from stepscope.collect import ALL_STREAMS, HistoryCollector
    dist.init_process_group("gloo", rank=0, world_size=1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    c = HistoryCollector(model, streams=ALL_STREAMS, cadence=1)
    for _ in range(2):
        with c.step(opt):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
    c.close()
    from stepscope.stats import reduce_spines
    out = {b.stream.value: [b.presence.tolist(), b.row_disclosures] for b in c.last_batches}
    params = [b for b in c.last_batches if b.stream.value == "parameter"][0].spines.tolist()
    full = [reduce_spines([p.full_tensor()])[0].tolist() for p in model.parameters()]
    print(json.dumps({"param_type": type(model[0].weight).__name__, "rows": out,
                      "params": params, "full": full}))
    from tests.distkit import leave_and_exit
    leave_and_exit()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_fsdp2_dtensor_rows_reduce_the_local_shard_and_training_survives():
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240, env=env
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["param_type"] == "DTensor"
    observed = code_of(Presence.OBSERVED)
    for stream in ("gradient", "parameter", "update"):
        presence, notes = got["rows"][stream]
        assert presence == [observed] * 4
        assert notes is None
    assert got["rows"]["activation"][0] == [observed] * 3
    assert got["params"] == got["full"]  # the one shard is the whole parameter, bit for bit
