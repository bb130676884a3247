"""What a quiet step costs the training thread: the per-step micro-benchmark.

Run:  .venv/bin/python -m benchmarks.quiet_step [--models mlp gpt] [--steps 3000] [--rounds 3]
                                                [--writers thread sync] [--same-cpu] [--profile]

A quiet step is one where nothing is due (nine in ten at the default cadence, every 10 steps).
Two arms on same-seed copies of one model, taking turns in blocks of 100 steps (drift hits
both alike): the unobserved control, and a collector at the default cadence writing to disk.
Each step's training-thread CPU time (``time.thread_time_ns``, blind to other processes) is
read around the whole step (forward, backward, ``optimizer.step()``, and for the collector the
``with collector.step(opt):`` transaction around them). The figure is the **median quiet step
of the collector minus the median step of the control**, in microseconds: what the
collector's Python costs on a step where it records nothing but the step block. Beside it, the
**due-step cost**: the median step where every default stream's spine is due (one in ten)
minus the same control median (its reductions, hooks and batch assembly).

``--writers thread sync`` runs one collector arm per artifact writer: ``thread`` is the default
(encoding and commits on the ``stepscope-writer`` thread), ``sync`` writes and commits on the
training thread (``WatchSettings(background_writer=False)``; its commits land on some steps,
which the median skips). The difference is what the writer thread's activity costs the
training thread. ``--same-cpu`` pins the process, both threads, to one CPU (benchmark only:
the library never sets an affinity): run with and without it to see how much of that is the
two threads running on different CPUs.

``--profile`` adds a cProfile table (the collector's own functions, by total time, over
quiet steps only) for ``docs/benchmarks.md``. Models: ``mlp`` (8 Linear+ReLU pairs of width
16, batch 4: a ~0.3 ms step where the fixed cost shows) and ``gpt`` (the GPT-like decoder of
:mod:`benchmarks.overhead`, 4 layers, 32 module sites).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.overhead import MODELS, loss_fn
from stepscope.collect import HistoryCollector, WatchSettings


def tiny_mlp() -> nn.Module:
    """8 pairs of Linear(16, 16) + ReLU: 16 module sites, 16 parameters, a ~0.3 ms step."""
    return nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(16, 16), nn.ReLU())])


def _mlp_data(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 16, generator=g), torch.randint(0, 16, (4,), generator=g)


def _models() -> dict[str, tuple[Callable[[], nn.Module], Callable[[torch.Generator], tuple]]]:
    return {"mlp": (tiny_mlp, _mlp_data), "gpt": MODELS["gpt"]}


class Loop:
    """One arm: a same-seed model copy, its optimizer and (optionally) a collector."""

    def __init__(
        self, make: Callable[[], nn.Module], tmp: str | None, background: bool = True
    ) -> None:
        torch.manual_seed(0)
        self.model = make()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.c = None
        if tmp is not None:
            settings = WatchSettings(
                output_dir=tempfile.mkdtemp(dir=tmp), background_writer=background
            )
            self.c = HistoryCollector(self.model, settings=settings)
        self.times: list[int] = []  # thread-time ns of each quiet step (collector) / step
        self.due_times: list[int] = []  # thread-time ns of each due step (collector)
        self.step = 0

    def body(self, x: torch.Tensor, y: torch.Tensor) -> None:
        loss = loss_fn(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()

    def run(self, n: int, batches: list[tuple], keep: bool = True) -> None:
        for _ in range(n):
            x, y = batches[self.step % len(batches)]
            quiet = self.step % 10 != 0  # the default cadence: every stream every 10 steps
            t0 = time.thread_time_ns()
            if self.c is None:
                self.body(x, y)
            else:
                with self.c.step(self.opt, examples=len(x)):
                    self.body(x, y)
            dt = time.thread_time_ns() - t0
            if keep and (quiet or self.c is None):
                self.times.append(dt)
            elif keep:
                self.due_times.append(dt)
            self.step += 1


def profile_quiet(arm: Loop, batches: list[tuple], steps: int) -> str:
    """cProfile of the collector's functions over ``steps`` quiet steps (by total time)."""
    assert arm.c is not None
    prof = cProfile.Profile()
    done = 0
    while done < steps:
        x, y = batches[arm.step % len(batches)]
        if arm.step % 10 == 0:  # a due step: run it unprofiled
            arm.run(1, batches, keep=False)
            continue
        prof.enable()
        with arm.c.step(arm.opt, examples=len(x)):
            arm.body(x, y)
        prof.disable()
        arm.step += 1
        done += 1
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(r"stepscope", 25)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "gpt"], choices=["mlp", "gpt"])
    ap.add_argument("--steps", type=int, default=3000, help="steps per arm per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--writers", nargs="+", default=["thread"], choices=["thread", "sync"])
    ap.add_argument("--same-cpu", action="store_true", help="pin the process to one CPU")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.same_cpu:  # every thread started from now on inherits it (the writer's too)
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    for key in args.models:
        make, data_fn = _models()[key]
        g = torch.Generator().manual_seed(0)
        batches = [data_fn(g) for _ in range(4)]
        with tempfile.TemporaryDirectory() as tmp:
            control = Loop(make, None)
            arms = {w: Loop(make, tmp, background=w == "thread") for w in args.writers}
            for arm in (control, *arms.values()):
                arm.run(30, batches, keep=False)  # warm-up
            figures: dict[str, list[float]] = {w: [] for w in arms}
            due_figures: dict[str, list[float]] = {w: [] for w in arms}
            for _ in range(args.rounds):
                for arm in (control, *arms.values()):
                    arm.times.clear()
                    arm.due_times.clear()
                for _block in range(max(1, args.steps // 100)):
                    control.run(100, batches)
                    for arm in arms.values():
                        arm.run(100, batches)
                base = statistics.median(control.times) / 1e3
                for w, arm in arms.items():
                    quiet = statistics.median(arm.times) / 1e3
                    due = statistics.median(arm.due_times) / 1e3
                    figures[w].append(quiet - base)
                    due_figures[w].append(due - base)
                    print(
                        f"{key} [{w} writer]: control step {base:8.1f} us, collector quiet step "
                        f"{quiet:8.1f} us, quiet-step cost {quiet - base:6.1f} us, due-step "
                        f"cost {due - base:7.1f} us",
                        flush=True,
                    )
            for w in arms:
                print(
                    f"{key} [{w} writer]: quiet-step cost, median of {args.rounds} rounds: "
                    f"{statistics.median(figures[w]):.1f} us (goal <= 20 us); due-step cost "
                    f"(every stream's spine due) {statistics.median(due_figures[w]):.1f} us"
                )
            if args.profile:
                print(profile_quiet(next(iter(arms.values())), batches, min(args.steps, 2000)))
            for arm in arms.values():
                assert arm.c is not None
                arm.c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
