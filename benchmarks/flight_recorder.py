"""The flight recorder's cost beside the default cadence alone (spike forensics).

Run:  .venv/bin/python -m benchmarks.flight_recorder [--models gpt resnet] [--steps 40]
                                                     [--warmup 12] [--threads 1]

Arms, each on its own same-seed model copy, on the same batches, taking turns step by step
(the order rotates every step, so machine drift hits all alike): the unobserved control; a
collector at the default cadence; the same with ``WatchSettings(flight_recorder=FlightRecorder())``
(default streams: gradient and update, read every step); the same on the weights only
(``sites="*.weight"``: the CPU remedy, fewer sites); and with the activation stream added
(``streams=("gradient", "update", "activation")``: a forward hook per module). Models from
``benchmarks/overhead.py`` (GPT-like decoder and ResNet-like CNN, SGD momentum, CPU).

Printed: extra CPU time of the training thread (``time.thread_time``, immune to other processes)
and extra wall time over the control, for each arm, and the recorder's own share: the arm's
extra minus the default cadence's. No trigger fires in these runs (no spike is injected); a
trigger adds one window write (a few hundred KiB) and ``dense_steps`` steps at cadence 1.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from benchmarks.overhead import MODELS, Arm
from stepscope.collect import HistoryCollector, WatchSettings
from stepscope.forensics import FlightRecorder

ARMS: dict[str, FlightRecorder | None] = {
    "default cadence": None,
    "+ flight recorder (default)": FlightRecorder(),
    "+ recorder, weights only": FlightRecorder(sites="*.weight"),
    "+ recorder with activations": FlightRecorder(streams=("gradient", "update", "activation")),
}


def measure(key: str, steps: int, warmup: int, tmp: str) -> list[str]:
    make, data_fn = MODELS[key]
    g = torch.Generator().manual_seed(0)
    data = [data_fn(g) for _ in range(4)]
    control = Arm("control", make)
    arms, collectors = {"control": control.plain}, []
    for name, rec in ARMS.items():
        arm = Arm(name, make)
        settings = WatchSettings(output_dir=tempfile.mkdtemp(dir=tmp), flight_recorder=rec)
        c = HistoryCollector(arm.model, settings=settings)
        collectors.append(c)

        def observed(x, y, i, arm=arm, c=c):
            with c.step(arm.opt, examples=len(y)):
                arm.plain(x, y, i)

        arms[name] = observed
    cpu = dict.fromkeys(arms, 0.0)
    wall = dict.fromkeys(arms, 0.0)
    names = list(arms)
    for i in range(warmup + steps):
        x, y = data[i % len(data)]
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            c0, w0 = time.thread_time(), time.perf_counter()
            arms[name](x, y, i)
            if i >= warmup:
                cpu[name] += time.thread_time() - c0
                wall[name] += time.perf_counter() - w0
    for c in collectors:
        c.close()
        fired = c.forensics.rows if c.forensics is not None else []
        assert not fired, f"a trigger fired in the benchmark: {fired}"
    base_cpu = cpu["default cadence"] / cpu["control"] - 1
    base_wall = wall["default cadence"] / wall["control"] - 1
    ms = 1000 * cpu["control"] / steps
    out = []
    for name in ARMS:
        x_cpu, x_wall = cpu[name] / cpu["control"] - 1, wall[name] / wall["control"] - 1
        own = (
            ""
            if name == "default cadence"
            else f"{x_cpu - base_cpu:+.1%} / {x_wall - base_wall:+.1%}"
        )
        out.append(f"| {key} ({ms:.1f} ms/step) | {name} | {x_cpu:.1%} | {x_wall:.1%} | {own} |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt", "resnet"], choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=40, help="timed steps (a multiple of 10)")
    ap.add_argument("--warmup", type=int, default=12, help="untimed steps")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"command: python {' '.join(sys.argv)}")
    print("| model (control CPU) | arm | extra CPU | extra wall | recorder's own (CPU / wall) |")
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.models:
            print("\n".join(measure(key, args.steps, args.warmup, tmp)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
