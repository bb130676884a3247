"""Default-cadence overhead of the HistoryCollector on the real-model test matrix, in one process.

Run (from the repository root, which makes ``tests`` importable):
      .venv/bin/python -m benchmarks.real_models [--steps 60] [--repeat 8] [--threads 1]

Models: the cases of ``tests/collect/models.py`` (ResNet-style CNN, GPT-style decoder with
variable length, LSTM, dict / ModelOutput-like outputs, weight sharing, checkpointing, sparse
embedding, complex activations), each batch repeated ``--repeat`` times along its first
dimension. Two arms per model, each its own same-seed copy, taking turns step by step (machine
drift hits both alike): the unobserved control, and a collector at the default cadence with
default sites and streams writing a disk artifact. Printed per model: total seconds of the timed
steps of each arm and their ratio (collector / control); the models are small (a few ms a
step), so the fixed per-hook cost weighs more than on a production model.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from stepscope.collect import HistoryCollector, WatchSettings
from tests.collect.models import CASES, Case


def repeated(value, k: int):
    return value.repeat(k, *([1] * (value.dim() - 1))) if k > 1 else value


class Arm:
    def __init__(self, case: Case, repeat: int, out: str | None) -> None:
        torch.manual_seed(0)
        self.case, self.repeat = case, repeat
        self.model = case.build()
        self.opt = case.optimizer(self.model)
        self.g = torch.Generator().manual_seed(1)
        self.seconds = 0.0
        self.collector = (
            None
            if out is None
            else HistoryCollector(self.model, settings=WatchSettings(output_dir=out))
        )

    def step(self, i: int, timed: bool) -> None:
        t0 = time.perf_counter()
        c = self.collector
        with c.step(self.opt) if c is not None else _Null():
            self.opt.zero_grad()
            for _ in range(self.case.micro_batches):
                x, y = self.case.batch(self.g, i)
                out = self.model(repeated(x, self.repeat))
                loss = self.case.loss(out, repeated(y, self.repeat))
                loss.backward()
            self.opt.step()
        if timed:
            self.seconds += time.perf_counter() - t0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=8, help="batch repeated k times")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default=",".join(CASES), help="comma-separated case names")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"command: {' '.join(sys.argv)}")
    print(f"{'model':<14}{'control s':>11}{'collector s':>13}{'ratio':>8}")
    ratios = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            case = CASES[name]
            control = Arm(case, args.repeat, None)
            observed = Arm(case, args.repeat, str(Path(tmp) / name))
            for i in range(args.warmup + args.steps):
                timed = i >= args.warmup
                arms = (control, observed) if i % 2 == 0 else (observed, control)
                for arm in arms:
                    arm.step(i, timed)
            observed.collector.close()
            ratio = observed.seconds / control.seconds
            ratios.append(ratio)
            print(f"{name:<14}{control.seconds:>11.3f}{observed.seconds:>13.3f}{ratio:>8.3f}")
    ratios.sort()
    print(f"median ratio over {len(ratios)} models: {ratios[len(ratios) // 2]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
