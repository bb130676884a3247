"""The flight recorder under a real 2-process ``gloo`` group.

Rank 1 alone takes a one-step learning-rate x100 on ``h.0.mlp.0`` at step 24 (its replica's
parameters diverge from rank 0's, which DDP does not undo: it averages gradients). Each rank
keeps its own window in its own segment; the ranks agree with one ``all_reduce`` per step, so
both go dense for the same steps (the live rank merge, on by default, keeps working: a
disagreement would hang it). Rank 1's spike names what crossed and the injected layer first;
rank 0's is recorded as agreed (another rank fired), with its rank.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import stepscope as ss

ROOT = Path(__file__).resolve().parents[2]
SRC = Path(ss.__file__).resolve().parents[1]
K, M = 24, 4

CHILD = textwrap.dedent(
    f"""
    import sys, torch, torch.distributed as dist
    import stepscope as ss
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    from tests.collect.models import TinyGPT
    model = TinyGPT()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    layer = model.h[0].mlp[0]
    own = {{id(p) for p in layer.parameters()}}
    rest = [p for p in model.parameters() if id(p) not in own]
    opt = torch.optim.AdamW([{{"params": rest}}, {{"params": list(layer.parameters())}}], lr=1e-3)
    rec = ss.FlightRecorder(window=24, dense_steps={M})
    settings = ss.WatchSettings(output_dir=sys.argv[1], flight_recorder=rec, durable=False)
    data = torch.Generator().manual_seed(rank)
    with ss.HistoryCollector(model, settings=settings) as c:
        for step in range(30):
            x = torch.randint(0, 40, (4, 16), generator=data)
            with c.step(opt, examples=4):
                loss = torch.nn.functional.cross_entropy(
                    ddp(x).reshape(-1, 40), x.roll(-1, 1).reshape(-1))
                opt.zero_grad(); loss.backward()
                opt.param_groups[1]["lr"] = 0.1 if (step == {K} and rank == 1) else 1e-3
                opt.step()
                c.log("loss", loss.detach())
    print("done", rank, flush=True)
    from tests.distkit import leave_and_exit
    leave_and_exit()
    """
)


@pytest.mark.slow  # two processes train TinyGPT (about 15 s on an idle 2-core machine)
def test_ranks_agree_on_a_trigger_and_each_records_its_own_window(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": f"{SRC}{os.pathsep}{ROOT}",
    }
    out = tmp_path / "run"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(out)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
        for r in range(2)
    ]
    try:  # a hang (ranks disagreeing on the dense steps) fails here
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for r, (p, (o, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err[-3000:]
        assert f"done {r}" in o
    s0 = ss.open_run(out / "rank000").spikes()
    s1 = ss.open_run(out / "rank001").spikes()
    assert [s.step for s in s1] == [K] and [s.step for s in s0] == [K]
    assert s1[0].rank == 1 and not s1[0].agreed and "update_ratio_spike" in s1[0].triggers
    assert s1[0].first[0].site.startswith("h.0.mlp.0.")
    assert s0[0].rank == 0 and s0[0].agreed and s0[0].crossings == ()
    assert "another rank" in s0[0].reason
    for rank in ("rank000", "rank001"):
        steps = ss.open_run(out / rank).series("h.0.mlp.0.weight", "gradient", "sum_squares").steps
        assert steps.tolist() == [0, 10, 20, 25, 26, 27, 28]  # 24 itself: not due
