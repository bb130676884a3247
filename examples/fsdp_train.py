"""Watch an FSDP2 (``fully_shard``) or DDP run: sharded parameters merged exactly, live on rank 0.

``--world-size`` CPU processes on ``gloo`` train a tiny transformer encoder layer plus a head in
float64, each rank on its slice of one global batch. With ``--mode fsdp`` every layer is
``fully_shard``-ed, so parameters, gradients and optimizer updates are ``DTensor`` shards: each
rank reduces its local shard and ``stepscope merge`` of the rank segments gives the statistics
of the full logical parameters. With the live merge (default) rank 0 gathers every logged step in
one collective and publishes the merged rows on its event bus. ``--mode single`` trains the
same model unsharded in one process on the whole batch (the reference).

Run it::

    python examples/fsdp_train.py --mode fsdp --out runs/fsdp --world-size 2 --steps 5
    stepscope merge runs/fsdp/rank000 runs/fsdp/rank001 --out runs/fsdp/merged

Build the collector **after** ``fully_shard`` (it replaces the parameters with DTensors) and
watch the sharded model itself. ``--dump DIR`` writes JSON facts a test checks
(``tests/distributed/test_sharded.py``): rank 0's live merged rows, spines of the full logical
tensors (``DTensor.full_tensor()``), and the logical update indices each rank sampled.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import stepscope as ss
from stepscope.collect import Cadence
from stepscope.events import ScalarEvent, Subscriber

GLOBAL_BATCH, SEQ, D_MODEL, CLASSES = 8, 4, 16, 3
STREAMS = ("activation", "gradient", "parameter", "update")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for ``MASTER_PORT``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_model() -> torch.nn.Module:
    """A tiny transformer encoder layer and a linear head, float64, the same on every rank."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        D_MODEL, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True
    )
    return torch.nn.Sequential(layer, torch.nn.Flatten(), torch.nn.Linear(SEQ * D_MODEL, CLASSES))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch (every rank draws it and keeps its slice)."""
    gen = torch.Generator().manual_seed(100 + step)
    x = torch.randn(GLOBAL_BATCH, SEQ, D_MODEL, generator=gen, dtype=torch.float64)
    return x, torch.randint(0, CLASSES, (GLOBAL_BATCH,), generator=gen)


def all_modules(name: str, module: torch.nn.Module) -> bool:
    """Every module is a site (attention's ``in_proj_weight`` belongs to a non-leaf module)."""
    return True


class L2Events(Subscriber):
    """Keeps the published ``parameter.post_step/<site>/l2`` values, keyed ``"step:name"``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, float] = {}

    def on_events(self, events) -> None:
        for e in events:
            if not isinstance(e, ScalarEvent):  # an undefined l2 is an UnavailableEvent
                continue
            if e.name.startswith("parameter.post_step/") and e.name.endswith("/l2"):
                self.seen[f"{e.optimizer_step}:{e.name}"] = e.value


def _spine(t: torch.Tensor) -> list[float]:
    from stepscope.stats import reduce_spines

    return reduce_spines([t.detach()])[0].tolist()


def _owned_logical(row) -> list[int]:  # the logical update indices this rank sampled
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    from stepscope.collect.distributed import owned_flat_indices

    logical = row.update_index
    if logical is None:
        logical = torch.arange(row.param.numel())
    if not isinstance(row.param, DTensor):
        return logical.tolist()
    shape, offset = compute_local_shape_and_global_offset(
        row.param.shape, row.param.device_mesh, row.param.placements
    )
    pos = owned_flat_indices(logical, tuple(row.param.shape), offset, shape)[0]
    return logical[pos].tolist()


def train(
    rank: int, world: int, mode: str, out: str, run_id: str, steps: int, dump: str | None,
    live: bool = True, sample: int = 64, watch: bool = True,
) -> dict:
    """Train ``steps`` steps on this rank's slice; returns the timing facts."""
    model = make_model().double()
    net: torch.nn.Module = model
    if mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        fully_shard(model[0], mesh=mesh)
        fully_shard(model[2], mesh=mesh)
        fully_shard(model, mesh=mesh)
    elif mode == "ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    collector = None
    l2 = L2Events()  # what this rank publishes: rank 0 of a live merge publishes merged rows
    bus = ss.EventBus()
    bus.subscribe(l2)
    if watch:
        collector = ss.HistoryCollector(
            model,
            sites=all_modules,
            streams=STREAMS,
            cadence=Cadence(1, 1),
            settings=ss.WatchSettings(
                output_dir=out, run_id=run_id, update_sample_size=sample, live_merge=live,
                durable=False, event_bus=bus,
            ),
        )
    share = GLOBAL_BATCH // world
    facts: dict = {"live": {}, "full": {}, "owned": {}, "seconds": []}
    try:
        for step in range(steps):
            x, y = global_batch(step)
            x, y = x[rank * share : (rank + 1) * share], y[rank * share : (rank + 1) * share]
            t0 = time.perf_counter()
            if collector is not None:
                with collector.step(opt, examples=share):
                    loss = F.cross_entropy(net(x), y)
                    opt.zero_grad()
                    loss.backward()
                    grads = {n: p.grad for n, p in model.named_parameters()}
                    opt.step()
            else:
                loss = F.cross_entropy(net(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                grads = {}
            facts["seconds"].append(time.perf_counter() - t0)
            if dump and collector is not None:
                _record(facts, step, rank, model, grads, collector)
    finally:
        if collector is not None:
            collector.close()
    facts["l2_events"] = l2.seen
    live_merge = getattr(collector, "_live", None)
    if live_merge is not None:
        facts["collectives"], facts["bytes_sent"] = live_merge.collectives, live_merge.bytes_sent
        facts["bytes_per_step"] = live_merge.bytes_per_step(histogram_step=True)
        facts["plan"] = str(collector.plan())
        facts["live_seconds"] = live_merge.seconds
    if dump:
        Path(dump).mkdir(parents=True, exist_ok=True)
        Path(dump, f"rank{rank}.json").write_text(json.dumps(facts))
    return facts


def _record(facts, step, rank, model, grads, collector) -> None:
    """Dump the facts a test checks (full tensors need collectives: every rank calls this)."""
    full = {}
    for name, p in model.named_parameters():
        value = p.full_tensor() if hasattr(p, "full_tensor") else p
        full[f"parameter/{name}"] = _spine(value)
        g = grads[name]
        full[f"gradient/{name}"] = _spine(g.full_tensor() if hasattr(g, "full_tensor") else g)
    if rank == 0:
        facts["full"][step] = full
        if collector.last_merged is not None:
            _, batches = collector.last_merged
            names = {s.site_id: s.name for s in collector.sites}
            facts["live"][step] = {
                f"{b.stream.value}/{names[int(s)]}": [int(b.presence[j]), b.spines[j].tolist()]
                for b in batches
                for j, s in enumerate(b.site_ids)
            }
    if step == 0:
        facts["owned"] = {r.site: _owned_logical(r) for r in collector.rows if r.stream == "update"}


def worker(rank: int, world: int, port: int, mode: str, out: str, run_id: str, steps: int,
           dump: str | None, live: bool, watch: bool) -> None:
    """One rank: join the group, train, leave the group."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        train(rank, world, mode, out, run_id, steps, dump, live=live, watch=watch)
    finally:
        gc.collect()  # free the model's reference cycles first: gloo's threads end here, not at exit
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> Path:
    """Launch ``--world-size`` processes (or train in this one with ``--mode single``)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("fsdp", "ddp", "single"), default="fsdp")
    p.add_argument("--out", default="runs/fsdp")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--dump", default=None, help="write the facts a test checks here")
    p.add_argument("--no-live-merge", action="store_true")
    p.add_argument("--unwatched", action="store_true", help="no collector (benchmark control)")
    args = p.parse_args(argv)
    if args.dump:
        Path(args.dump).mkdir(parents=True, exist_ok=True)
    run_id = f"{args.mode}-{uuid.uuid4().hex[:8]}"
    if args.mode == "single":
        train(0, 1, "single", args.out, run_id, args.steps, args.dump)
        return Path(args.out)
    torch.multiprocessing.spawn(
        worker,
        args=(args.world_size, free_port(), args.mode, args.out, run_id, args.steps, args.dump,
              not args.no_live_merge, not args.unwatched),
        nprocs=args.world_size,
        join=True,
    )
    return Path(args.out)


if __name__ == "__main__":
    main()
