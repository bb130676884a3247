"""What one activation row costs the training step: per forward-hook call, and per extra call.

Run:  .venv/bin/python benchmarks/activation_rows.py [--steps 60] [--rounds 3]
                                                     [--against OTHER_CHECKOUT/src]

The model is 64 ``Linear(8, 8)`` layers at batch 1, so the reductions themselves cost next to
nothing and what is left is the collector's per-row work (hook Python, the ctypes call, staging).
Arms take turns step by step in one process: the unobserved control and stepscope with the
``activation`` stream (and with ``activation`` + ``activation_grad``) every step; the same again
with the model called twice per step (every row folds a second call: micro-batches, a reused
module). Statistic: the median over steps of the **thread CPU time** (``time.thread_time``; the
machine is shared, and wall time mostly measures the neighbours) of an observed step minus the
control's, divided by the row-calls of a step.

``--against DIR`` runs every round twice, once with ``PYTHONPATH=DIR`` (another checkout's
``src``, with its compiled kernel) and once with this one, alternating, and prints both side by
side with their ratio (before / after).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

LAYERS = 64


class Twice(nn.Module):
    """The same stack applied twice: every module fires two times per forward."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.body(x))


def make(twice: bool) -> nn.Module:
    torch.manual_seed(0)
    body = nn.Sequential(*[nn.Linear(8, 8) for _ in range(LAYERS)])
    return Twice(body) if twice else body


def arm(streams: tuple[str, ...] | None, twice: bool, tmp: str):
    from stepscope.collect import Cadence, HistoryCollector, WatchSettings

    m = make(twice)
    opt = torch.optim.SGD(m.parameters(), lr=1e-3)
    x = torch.randn(1, 8)
    c = None
    if streams is not None:
        settings = WatchSettings(output_dir=tempfile.mkdtemp(dir=tmp))
        c = HistoryCollector(m, streams=streams, cadence=Cadence(1, None), settings=settings)

    def plain() -> None:
        loss = m(x).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()

    def step() -> None:
        if c is None:
            plain()
            return
        with c.step(opt, examples=1):
            plain()

    return step, (c.close if c is not None else (lambda: None))


def measure(steps: int) -> dict[str, float]:
    """Microseconds per row-call for each case (this process's checkout)."""
    torch.set_num_threads(1)
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for twice in (False, True):
            cases = {
                "activation": ("activation",),
                "activation+grad": ("activation", "activation_grad"),
            }
            arms = {"control": arm(None, twice, tmp)}
            arms.update({k: arm(s, twice, tmp) for k, s in cases.items()})
            times: dict[str, list[float]] = {k: [] for k in arms}
            for i in range(steps + 10):
                for k in arms if i % 2 == 0 else list(arms)[::-1]:
                    t0 = time.thread_time()
                    arms[k][0]()
                    if i >= 10:
                        times[k].append(time.thread_time() - t0)
            for _, close in arms.values():
                close()
            control = statistics.median(times["control"])
            for k, streams in cases.items():
                calls = LAYERS * (2 if twice else 1) * len(streams)
                extra = statistics.median(times[k]) - control
                out[f"{k}{', called twice' if twice else ''}"] = extra / calls * 1e6
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3, help="repeats; the median is reported")
    ap.add_argument("--against", help="another checkout's src/ to measure beside this one")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # one round, as JSON
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps(measure(args.steps)))
        return 0
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    checkouts = {"this": os.path.abspath(here)}
    if args.against:
        checkouts = {"against": os.path.abspath(args.against), **checkouts}
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in checkouts}
    for _ in range(args.rounds):
        for name, src in checkouts.items():
            env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}
            cmd = [sys.executable, os.path.abspath(__file__), "--json", "--steps", str(args.steps)]
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(res.stdout.strip().splitlines()[-1]))
    print(f"$ {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(
        f"{LAYERS} Linear(8,8) at batch 1, one thread, median of {args.rounds} rounds of "
        f"{args.steps} steps; thread CPU time per row-call over the control (us)"
    )
    cols = list(checkouts)
    head = " | ".join(f"{c} ({checkouts[c]})" for c in cols)
    print(f"| case | {head} |" + (" before/after |" if len(cols) == 2 else ""))
    print("|---|" + "---:|" * (len(cols) + (len(cols) == 2)))
    for case in runs[cols[-1]][0]:
        vals = [statistics.median(r[case] for r in runs[c]) for c in cols]
        ratio = f" {vals[0] / vals[1]:.1f}x |" if len(vals) == 2 and vals[1] > 0 else ""
        print(f"| {case} | " + " | ".join(f"{v:.1f}" for v in vals) + " |" + ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
