"""Training-step overhead of the HistoryCollector, side by side with its peers, in one process.

Run:  .venv/bin/python benchmarks/overhead.py [--steps 40] [--width-scale 1.0] [--threads 0]

Model: the Ciresan-size MLP (784-2500-2000-1500-1000-500-10), batch 64, SGD momentum 0.9, CPU.
Arms (each its own same-seed model copy; the arms take turns step by step, so machine drift hits
all of them alike): the unobserved control; stepscope at its default cadence; stepscope with all
five streams, spine every step and histograms every 10 steps, artifact on disk; torchlens's own
HistoryCollector (PyPI ``torchlens``) and ``wandb.watch(log="all", log_freq=10)`` offline, where
they install. Printed: the median step time of each arm relative to the control, and (b) the cost
of one logged step relative to the floor: one ``torch.sum`` pass over exactly the tensors that
step observed, timed in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from stepscope.collect import ALL_STREAMS, Cadence, HistoryCollector, WatchSettings
from stepscope.demo import ciresan_mlp
from stepscope.stats import backend_info


class Arm:
    """One contender: a model copy, its optimizer, and how to run one step with it."""

    def __init__(self, name: str, width_scale: float, max_steps: int) -> None:
        torch.manual_seed(0)
        self.name, self.max_steps = name, max_steps
        self.model = ciresan_mlp(width_scale=width_scale)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        self.times: list[float] = []
        self.telemetry: list[float] = []
        self.step_fn: Callable[[torch.Tensor, torch.Tensor, int], None] = self._plain
        self.close: Callable[[], None] = lambda: None

    def _plain(self, x: torch.Tensor, y: torch.Tensor, step: int) -> None:
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def run(self, x: torch.Tensor, y: torch.Tensor, step: int) -> None:
        if len(self.times) >= self.max_steps:
            return
        t0 = time.perf_counter()
        self.step_fn(x, y, step)
        self.times.append(time.perf_counter() - t0)


def stepscope_arm(name: str, args, tmp: str, streams, cadence) -> Arm:
    arm = Arm(name, args.width_scale, args.steps)
    settings = WatchSettings(output_dir=os.path.join(tmp, name), durable=True)
    c = HistoryCollector(arm.model, sites="*", streams=streams, cadence=cadence, settings=settings)

    def step(x, y, i):
        before = c.telemetry_seconds
        with c.step(arm.opt, examples=len(y)):
            arm._plain(x, y, i)
        arm.telemetry.append(c.telemetry_seconds - before)

    arm.step_fn, arm.close, arm.collector = step, c.close, c
    return arm


def torchlens_arm(args, tmp: str, x: torch.Tensor) -> Arm | str:
    try:
        from torchlens.observability import HistoryCollector as TLCollector
        from torchlens.observability import WatchSettings as TLSettings
    except Exception as exc:
        return f"torchlens unavailable ({type(exc).__name__}: {exc})"
    arm = Arm("torchlens 2.36 HistoryCollector", args.width_scale, args.slow_steps)
    c = TLCollector(
        arm.model,
        streams=("activation", "param", "param_grad", "param_delta"),
        cadence=1,
        settings=TLSettings(output_dir=os.path.join(tmp, "torchlens"), sketch_cadence=10),
    )
    with torch.no_grad():
        c.discover(x)
    c.attach(arm.opt)

    def step(x, y, i):
        with c.step(i):
            arm._plain(x, y, i)

    arm.step_fn, arm.close = step, c.detach
    return arm


def wandb_arm(args, tmp: str) -> Arm | str:
    os.environ.setdefault("WANDB_MODE", "offline")
    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        import wandb
    except Exception as exc:
        return f"wandb unavailable ({type(exc).__name__})"
    arm = Arm('wandb.watch(log="all", log_freq=10)', args.width_scale, args.slow_steps)
    run = wandb.init(project="stepscope-bench", dir=tmp, mode="offline")
    wandb.watch(arm.model, log="all", log_freq=10)

    def step(x, y, i):
        arm._plain(x, y, i)
        wandb.log({"step": i})

    def close():
        wandb.unwatch(arm.model)
        run.finish()

    arm.step_fn, arm.close = step, close
    return arm


def floor_seconds(arm: Arm, x: torch.Tensor, y: torch.Tensor, sample: int) -> tuple[float, int]:
    """One torch.sum pass over exactly the tensors a logged step observes (all five streams)."""
    model = arm.model
    captured: list[torch.Tensor] = []
    handles = [
        m.register_forward_hook(lambda m, i, o: captured.append(o.detach()))
        for n, m in model.named_modules()
        if n and next(m.children(), None) is None
    ]
    out_grads: list[torch.Tensor] = []
    try:
        h = x
        for m in model:
            h = m(h)
            if h.requires_grad:
                h.register_hook(lambda g: out_grads.append(g))
        F.cross_entropy(h, y).backward()
    finally:
        for handle in handles:
            handle.remove()
    params = [p.detach() for p in model.parameters()]
    grads = [p.grad.detach() for p in model.parameters()]
    updates = [p.detach().reshape(-1)[: min(p.numel(), sample)].clone() for p in model.parameters()]
    tensors = captured + out_grads + params + grads + updates
    times = []
    for _ in range(15):
        t0 = time.perf_counter()
        for t in tensors:
            torch.sum(t)
        times.append(time.perf_counter() - t0)
    model.zero_grad(set_to_none=True)
    return statistics.median(times), sum(t.numel() for t in tensors)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="timed steps per stepscope/control arm")
    ap.add_argument(
        "--slow-steps", type=int, default=8, help="timed steps for torchlens / wandb arms"
    )
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--width-scale", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-peers", action="store_true", help="skip torchlens and wandb")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"command: python {' '.join(sys.argv)}")
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, kernel {backend_info()['cpu']}"
    )
    g = torch.Generator().manual_seed(0)
    data = [
        (torch.rand(64, 784, generator=g), torch.randint(0, 10, (64,), generator=g))
        for _ in range(8)
    ]
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        arms: list[Arm] = [Arm("control (unobserved)", args.width_scale, args.steps)]
        arms.append(
            stepscope_arm(
                "stepscope default cadence",
                args,
                tmp,
                ("activation", "gradient", "parameter", "update"),
                None,
            )
        )
        arms.append(
            stepscope_arm(
                "stepscope cadence=auto (5% target)",
                args,
                tmp,
                ("activation", "gradient", "parameter", "update"),
                "auto",
            )
        )
        full = stepscope_arm(
            "stepscope all 5 streams, spine 1, hist 10", args, tmp, ALL_STREAMS, Cadence(1, 10)
        )
        arms.append(full)
        if not args.no_peers:
            for made in (torchlens_arm(args, tmp, data[0][0]), wandb_arm(args, tmp)):
                (arms.append if isinstance(made, Arm) else notes.append)(made)
        total = args.warmup + max(args.steps, args.slow_steps)
        for i in range(total):
            x, y = data[i % len(data)]
            order = arms if i % 2 == 0 else arms[::-1]
            for arm in order:
                if i < args.warmup:
                    arm.step_fn(x, y, i)
                else:
                    arm.run(x, y, i)
        for arm in arms:
            arm.close()
        floor, n_el = floor_seconds(arms[0], *data[0], 4096)
    control = statistics.median(arms[0].times)
    print(f"\ncontrol step: {control * 1e3:.1f} ms (median of {len(arms[0].times)})")
    print("| arm | median step ms | ratio to control |")
    print("|---|---:|---:|")
    for arm in arms:
        med = statistics.median(arm.times)
        print(f"| {arm.name} | {med * 1e3:.1f} | {med / control:.3f} |")
    for note in notes:
        print(f"| {note} | - | - |")
    tel = full.telemetry[args.warmup :] if len(full.telemetry) > args.warmup else full.telemetry
    hist_steps = [t for i, t in enumerate(full.telemetry) if (i % 10) == 0]
    spine_steps = [t for i, t in enumerate(full.telemetry) if (i % 10) != 0]
    print(
        f"\n(b) floor: one torch.sum pass over the {n_el:,} elements a fully logged step observes: {floor * 1e3:.2f} ms"
    )
    if spine_steps:
        print(
            f"    spine-only logged step, stepscope telemetry: {statistics.median(spine_steps) * 1e3:.2f} ms "
            f"= {statistics.median(spine_steps) / floor:.2f}x the floor (goal <= 2x)"
        )
    if hist_steps:
        print(
            f"    logged step with histograms: {statistics.median(hist_steps) * 1e3:.2f} ms "
            f"= {statistics.median(hist_steps) / floor:.2f}x the floor (goal <= 4x)"
        )
    print(
        f"    telemetry share of the all-streams arm: {sum(tel) / max(sum(full.times), 1e-9):.3f}"
    )
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
