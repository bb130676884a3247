"""Two arms only — the unobserved control and one collector — for a steadier overhead figure.

Run:  .venv/bin/python -m benchmarks.overhead_paired [--models resnet gpt] [--cadence default auto]
                                                       [--steps 60] [--warmup 22] [--threads 1]
      (``--cadence 20``: every stream's spine every 20 steps, histograms every 200)

``benchmarks/overhead.py`` interleaves up to seven model copies, whose caches evict each other;
its noise floor (a second unobserved copy) moves 1-11 points on a shared machine. Here each
collector runs beside one control on the same batches, arms alternating step by step, and the
figure is the summed extra time of the timed steps over the control's: CPU time of the
training thread (``time.thread_time``, immune to other processes) and total wall time. For
``cadence="auto"`` its own prediction is printed beside it, and the telemetry the collector's
clocks charged shows how much of the overhead they see.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from benchmarks.overhead import MODELS, Arm
from stepscope.collect import Cadence, HistoryCollector, WatchSettings


def measure(key: str, cadence: str, steps: int, warmup: int, tmp: str) -> str:
    make, data_fn = MODELS[key]
    g = torch.Generator().manual_seed(0)
    data = [data_fn(g) for _ in range(4)]
    control, arm = Arm("control", make), Arm(cadence, make)
    settings = WatchSettings(output_dir=tempfile.mkdtemp(dir=tmp))
    chosen: str | Cadence | None = cadence
    if cadence == "default":
        chosen = None
    elif cadence.isdigit():  # every stream's spine every K steps, histograms every 10 K
        chosen = Cadence(int(cadence), 10 * int(cadence))
    c = HistoryCollector(arm.model, cadence=chosen, settings=settings)

    def observed(x: torch.Tensor, y: torch.Tensor, i: int) -> None:
        with c.step(arm.opt, examples=len(y)):
            arm.plain(x, y, i)

    cpu = {"control": 0.0, "arm": 0.0}
    wall = dict(cpu)
    charged = 0.0
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        pair = [("control", control.plain), ("arm", observed)]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            before = c.telemetry_seconds
            c0, w0 = time.thread_time(), time.perf_counter()
            fn(x, y, i)
            if i >= warmup:
                cpu[name] += time.thread_time() - c0
                wall[name] += time.perf_counter() - w0
                if name == "arm":
                    charged += c.telemetry_seconds - before
    c.close()
    d = c.cadence_decision
    pred = "" if d is None else f" | predicted {d['expected_overhead']:.1%}"
    return (
        f"| {key} | {cadence} | {cpu['arm'] / cpu['control'] - 1:.1%} "
        f"| {wall['arm'] / wall['control'] - 1:.1%} | {charged / cpu['control']:.1%}{pred} |"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["resnet", "gpt"], choices=list(MODELS))
    ap.add_argument(
        "--cadence", nargs="+", default=["default", "auto"], help="default, auto, or K (every K)"
    )
    ap.add_argument("--steps", type=int, default=60, help="timed steps (a multiple of 10)")
    ap.add_argument("--warmup", type=int, default=22, help="untimed steps (> auto's 20)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"command: python {' '.join(sys.argv)}")
    print(
        "| model | cadence | extra CPU time | extra wall time | charged as telemetry (of control CPU) |"
    )
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            for cadence in args.cadence:
                print(measure(key, cadence, args.steps, args.warmup, tmp), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
