"""What reading gradients inside ``optimizer.step(closure)`` costs, side by side with ``step()``.

Run (from the repository root, which makes ``tests`` importable):
      .venv/bin/python -m benchmarks.closures [--steps 40] [--threads 1]

Model: the GPT-style decoder of ``tests/collect/models.py`` (tied head, variable length) with
SGD momentum, every stream due every step (``cadence=1``), a disk artifact. Four arms, each its
own same-seed copy, taking turns step by step (machine drift hits all alike): ``step()`` and
``step(closure)``, each unobserved and observed. Printed: seconds of the timed steps per arm and
the ratio observed / unobserved per spelling. With a closure the collector arms one
post-accumulate-grad hook per parameter at the pre-step hook and removes them at the post-step
hook; the reduction itself is the same as in the pre-step hook.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from stepscope.collect import HistoryCollector, WatchSettings
from tests.collect.models import TinyGPT


class Arm:
    def __init__(self, closure: bool, out: str | None) -> None:
        torch.manual_seed(0)
        self.model = TinyGPT(vocab=64, d=64, ctx=64)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.closure = closure
        self.seconds = 0.0
        self.collector = None
        if out is not None:
            settings = WatchSettings(output_dir=out, durable=False)
            self.collector = HistoryCollector(self.model, cadence=1, settings=settings)

    def step(self, x: torch.Tensor, y: torch.Tensor, timed: bool) -> None:
        t0 = time.perf_counter()
        ctx = self.collector.step(self.opt, examples=len(x)) if self.collector else None
        if ctx is not None:
            ctx.__enter__()

        def closure() -> torch.Tensor:
            self.opt.zero_grad()
            out = self.model(x)
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, 64), y.reshape(-1))
            loss.backward()
            return loss

        if self.closure:
            self.opt.step(closure)
        else:
            closure()
            self.opt.step()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        if timed:
            self.seconds += time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as tmp:
        arms = {
            ("step()", "control"): Arm(False, None),
            ("step()", "observed"): Arm(False, f"{tmp}/plain"),
            ("step(closure)", "control"): Arm(True, None),
            ("step(closure)", "observed"): Arm(True, f"{tmp}/closure"),
        }
        g = torch.Generator().manual_seed(1)
        for i in range(a.warmup + a.steps):
            t = 8 + (i * 7) % 40
            x = torch.randint(0, 64, (8, t), generator=g)
            y = torch.randint(0, 64, (8, t), generator=g)
            for arm in arms.values():
                arm.step(x, y, timed=i >= a.warmup)
        for arm in arms.values():
            if arm.collector is not None:
                arm.collector.close()
    print(f"{'spelling':<15}{'control s':>11}{'observed s':>12}{'ratio':>8}")
    for spelling in ("step()", "step(closure)"):
        c, o = arms[(spelling, "control")].seconds, arms[(spelling, "observed")].seconds
        print(f"{spelling:<15}{c:>11.3f}{o:>12.3f}{o / c:>8.3f}")
    print(f"command: {' '.join(sys.argv)} (steps={a.steps}, threads={a.threads})")


if __name__ == "__main__":
    main()
