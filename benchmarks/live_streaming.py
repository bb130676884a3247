"""What live streaming to TensorBoard (``WatchSettings(tensorboard=DIR)``) costs a training step.

Run:  .venv/bin/python benchmarks/live_streaming.py [--steps 150] [--rounds 3] [--cadence 10]

The README quickstart model (``Linear(784, 256), ReLU, Linear(256, 10)``, ``sites="*"``, batch
64) trains ``--steps`` steps per arm; arms take turns, round by round, in one process: the
collector writing its artifact, and the same with ``tensorboard=DIR``. Queueing a step costs the
training thread one ``put_nowait``; the streaming thread's conversion and TensorBoard's writer
compete with training for the GIL and the CPU, which is what this measures (wall time per step,
median over rounds; the machine is shared, so read the ratio, not the milliseconds).
``--cadence 1`` (rows every step) is the worst case; the default cadence writes rows every 10th.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

import stepscope as ss


def _arm(live: bool, steps: int, cadence: int | None) -> float:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    root = tempfile.mkdtemp()
    settings = ss.WatchSettings(
        output_dir=root + "/run", tensorboard=root + "/tb" if live else None, durable=False
    )
    x, y = torch.rand(64, 784), torch.randint(0, 10, (64,))
    with ss.HistoryCollector(model, sites="*", cadence=cadence, settings=settings) as c:
        t0 = time.perf_counter()
        for _ in range(steps):
            with c.step(opt, examples=64) as st:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                st.log("loss", loss)
        seconds = time.perf_counter() - t0
        if live:
            assert c.live is not None and c.live.counts.dropped_steps == 0
    return seconds / steps * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cadence", type=int, default=None, help="spine every k steps (default: 10)")
    a = p.parse_args()
    off, on = [], []
    for _ in range(a.rounds):
        off.append(_arm(False, a.steps, a.cadence))
        on.append(_arm(True, a.steps, a.cadence))
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"cadence {a.cadence or 10}, {a.steps} steps x {a.rounds} rounds (ms/step, wall)")
    print(f"  artifact only       {m_off:8.2f}   rounds {[round(v, 2) for v in off]}")
    print(f"  + tensorboard=DIR   {m_on:8.2f}   rounds {[round(v, 2) for v in on]}")
    print(f"  ratio               {m_on / m_off:8.3f}")


if __name__ == "__main__":
    main()
