"""What quiet steps cost: the default collector beside one that keeps its quiet-step work on.

Run:  .venv/bin/python -m benchmarks.overhead_quiet [--models gpt resnet] [--steps 100]
                                                     [--warmup 22] [--threads 1]

Three arms on the same batches, their order rotating step by step: the unobserved control;
stepscope at its default cadence with the activation hooks left on between due steps and the
model-surgery check run on every step (what the collector did before quiet steps shed them,
set on the instance); stepscope at its default cadence as it ships. The figure is each
collector's summed extra CPU time of the training thread (``time.thread_time``) over the
control's, over the timed steps (a multiple of 10: whole cadence periods).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable

import torch

from benchmarks.overhead import MODELS, Arm
from stepscope.collect import HistoryCollector, WatchSettings


def keep_quiet_work(c: HistoryCollector) -> None:
    """Hooks on at every step and the surgery check at every step (the earlier behaviour)."""
    c._sites.rest(False)
    c._sites.rest = lambda quiet: None  # type: ignore[method-assign]
    begin = c._begin_step

    def begin_checked():  # type: ignore[no-untyped-def]
        state = begin()
        state.structure_checked = False
        return state

    c._begin_step = begin_checked  # type: ignore[method-assign]
    if c._open.state is not None:
        c._open.state.structure_checked = False


def measure(key: str, steps: int, warmup: int, tmp: str) -> str:
    make, data_fn = MODELS[key]
    g = torch.Generator().manual_seed(0)
    data = [data_fn(g) for _ in range(4)]
    control = Arm("control", make)
    fns: dict[str, Callable[[torch.Tensor, torch.Tensor, int], None]] = {"control": control.plain}
    collectors = []
    for name in ("quiet work kept", "default"):
        arm = Arm(name, make)
        c = HistoryCollector(
            arm.model, settings=WatchSettings(output_dir=tempfile.mkdtemp(dir=tmp))
        )
        if name != "default":
            keep_quiet_work(c)
        collectors.append(c)

        def step(x: torch.Tensor, y: torch.Tensor, i: int, c=c, arm=arm) -> None:
            with c.step(arm.opt, examples=len(y)):
                arm.plain(x, y, i)

        fns[name] = step
    cpu = dict.fromkeys(fns, 0.0)
    names = list(fns)
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        for name in names[i % 3 :] + names[: i % 3]:
            t0 = time.thread_time()
            fns[name](x, y, i)
            if i >= warmup:
                cpu[name] += time.thread_time() - t0
    for c in collectors:
        c.close()
    extra = [f"{cpu[n] / cpu['control'] - 1:.1%}" for n in names[1:]]
    return f"| {key} | {' | '.join(extra)} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt", "resnet"], choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=100, help="timed steps (a multiple of 10)")
    ap.add_argument("--warmup", type=int, default=22)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"command: python {' '.join(sys.argv)}")
    print("| model | extra CPU: quiet-step work kept | extra CPU: default (as shipped) |")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            print(measure(key, args.steps, args.warmup, tmp), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
