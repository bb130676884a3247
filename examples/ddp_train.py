"""Watch a DistributedDataParallel run: each rank writes its own segment, then merge them.

Two processes on CPU with the ``gloo`` backend train a small MLP with
``torch.nn.parallel.DistributedDataParallel``. A :class:`stepscope.HistoryCollector` in every
rank sees the process group and writes ``OUT/rank000``, ``OUT/rank001``, ... (rank and world
size in each run record). ``stepscope merge`` then combines them: integer counts (spine counts,
every histogram bin) add exactly, moments merge with Chan's formulas.

Run it::

    python examples/ddp_train.py --out runs/ddp --world-size 2 --steps 20
    stepscope merge runs/ddp/rank000 runs/ddp/rank001 --out runs/ddp/merged
    stepscope report runs/ddp/merged --out ddp.html

Every rank must share one ``run_id`` (``merge`` refuses mixed runs): the launcher draws it and
passes it to the workers. ``--dump DIR`` also saves, per rank and step, the first layer's output
and its weight gradient as ``.npy`` files, so a test can rebuild the merged statistics from the
tensors themselves (``tests/distributed/test_ddp_merge.py``).
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import uuid
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import stepscope as ss
from stepscope.collect import Cadence


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_model() -> torch.nn.Module:
    """The same initial weights on every rank (DDP would broadcast rank 0's anyway)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def worker(
    rank: int, world: int, port: int, out: str, run_id: str, steps: int, dump: str | None
) -> None:
    """One rank: join the group, train ``steps`` steps under a collector, leave the group."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train(rank, out, run_id, steps, dump)
    finally:
        # DDP sits in a reference cycle: collect it, so that leaving the group tears gloo's
        # threads down here and not during interpreter exit (where they can abort the process)
        gc.collect()
        dist.destroy_process_group()


def train(rank: int, out: str, run_id: str, steps: int, dump: str | None) -> None:
    """Train ``steps`` steps of DDP under a collector (the process group is up)."""
    model = make_model()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    collector = ss.HistoryCollector(
        model,
        streams=("activation", "gradient", "parameter"),
        cadence=Cadence(1, 1),  # spine and histogram every step
        settings=ss.WatchSettings(output_dir=out, run_id=run_id),
    )
    first: list[torch.Tensor] = []
    hook = model[0].register_forward_hook(lambda m, i, o: first.append(o.detach().clone()))
    try:
        for step in range(steps):
            x = torch.randn(32, 8, generator=gen)
            y = torch.randint(0, 3, (32,), generator=gen)
            with collector.step(opt, examples=32, epoch=0) as st:
                loss = F.cross_entropy(ddp(x), y)
                opt.zero_grad()
                loss.backward()  # DDP all-reduces (averages) gradients here
                grad = model[0].weight.grad.detach().clone()
                opt.step()
                st.log("loss", loss)
            if dump:
                d = Path(dump)
                np.save(d / f"act_r{rank}_s{step}.npy", first[-1].numpy())
                np.save(d / f"grad_r{rank}_s{step}.npy", grad.numpy())
            first.clear()
    finally:
        hook.remove()
        collector.close()


def main(argv: list[str] | None = None) -> Path:
    """Launch ``--world-size`` processes and return the output directory."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/ddp")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dump", default=None, help="save per-rank activations and gradients here")
    args = p.parse_args(argv)
    if args.dump:
        Path(args.dump).mkdir(parents=True, exist_ok=True)
    run_id = f"ddp-{uuid.uuid4().hex[:8]}"
    torch.multiprocessing.spawn(
        worker,
        args=(args.world_size, free_port(), args.out, run_id, args.steps, args.dump),
        nprocs=args.world_size,
        join=True,
    )
    ranks = sorted(str(r) for r in Path(args.out).glob("rank*"))
    print(f"run {run_id}: {len(ranks)} rank segments in {args.out}")
    print("merge them with: stepscope merge " + " ".join(ranks) + f" --out {args.out}/merged")
    return Path(args.out)


if __name__ == "__main__":
    main()
