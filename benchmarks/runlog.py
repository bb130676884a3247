"""Cost of logging user scalars: RunLog and the collector vs a plain list append and .item().

Marginal cost of one scalar per step = (loop with k logged scalars - the same loop with none) / k
per step, including the call, the boundary transfer and the row write. Compared side by side with
the naive alternatives (``float(t.item())`` per call into a list, a plain ``list.append``).

Run::

    .venv/bin/python benchmarks/runlog.py            # default: 2000 steps, best of 5
    .venv/bin/python benchmarks/runlog.py --steps 500 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import torch

from stepscope.runlog import RunLog


def _loop(make, steps: int, k: int, tensor: bool) -> float:
    """Seconds for ``steps`` steps logging ``k`` scalars each (values: 0-d tensors or floats)."""
    rl = make()
    values = [torch.tensor(float(i)) if tensor else float(i) for i in range(k)]
    names = [f"s{i}" for i in range(k)]
    t0 = time.perf_counter()
    for _ in range(steps):
        for n, v in zip(names, values):
            rl.log(n, v)
        rl.end_step(examples=1)
    rl.close()
    return time.perf_counter() - t0


class _ItemList:
    """The naive alternative: ``.item()`` per call into a Python list."""

    def __init__(self) -> None:
        self.rows: list = []
        self.step = 0

    def log(self, name, value) -> None:
        v = value.item() if isinstance(value, torch.Tensor) else value
        self.rows.append((self.step, name, v))

    def end_step(self, examples=None) -> None:
        self.step += 1

    def close(self) -> None:
        pass


def _marginal_us(make, steps: int, k: int, tensor: bool, repeat: int) -> float:
    base, full = [], []
    for _ in range(repeat):  # interleaved, so load changes hit both sides alike
        base.append(_loop(make, steps, 0, tensor))
        full.append(_loop(make, steps, k, tensor))
    return (min(full) - min(base)) / (steps * k) * 1e6


def _boundary_us(make, steps: int, repeat: int) -> float:
    return min(_loop(make, steps, 0, False) for _ in range(repeat)) / steps * 1e6


def _overhead(with_collector: bool, steps: int) -> tuple[float, float, float]:
    """Overhead fraction, median telemetry and training us/step of a real MLP loop."""
    import stepscope as ss

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(128, 64), torch.randint(0, 10, (128,))
    ram = ss.WatchSettings(in_memory=True, ram_policy="drop_oldest")
    log = ss.HistoryCollector(model, settings=ram) if with_collector else RunLog()
    for _ in range(steps):
        ctx = log.step(opt, examples=128) if with_collector else log.step(examples=128)
        with ctx:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            log.log("loss", loss)
            log.log("lr", 0.1)
    clocks = log.run_view().clocks() if with_collector else log.view().clocks()
    log.close()
    training, telemetry = clocks.per_step()
    return (
        clocks.overhead_fraction or float("nan"),
        float(np.median(telemetry)) * 1e6,
        float(np.median(training)) * 1e6,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--scalars", type=int, default=1, help="scalars logged per step")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp()
    counter = iter(range(10**6))
    makers = {
        "RunLog (RAM)": RunLog,
        "RunLog (artifact, durable=False)": lambda: RunLog(
            f"{tmp}/r{next(counter)}", durable=False
        ),
        "list + .item() per call": _ItemList,
    }
    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    load = os.getloadavg()[0]
    print(
        f"torch {torch.__version__}, CPU, 1 thread, {os.cpu_count()} cores, load {load:.1f}; "
        f"{a.steps} steps x {a.scalars} scalar(s), best of {a.repeat}"
    )
    print(f"{'logger':36s} {'float us/scalar':>16s} {'tensor us/scalar':>17s} {'step us':>9s}")
    out = {}
    for label, make in makers.items():
        f = _marginal_us(make, a.steps, a.scalars, False, a.repeat)
        t = _marginal_us(make, a.steps, a.scalars, True, a.repeat)
        b = _boundary_us(make, a.steps, a.repeat)
        out[label] = (f, t, b)
        print(f"{label:36s} {f:16.2f} {t:17.2f} {b:9.2f}")
    ram_f, ram_t, _ = out["RunLog (RAM)"]
    naive_f, naive_t, _ = out["list + .item() per call"]
    print(
        f"ratios RunLog(RAM)/naive: float {ram_f / naive_f:.1f}x, tensor {ram_t / naive_t:.1f}x "
        "(the naive list has no step blocks, clocks, axes or durability)"
    )
    print("measured overhead (clocks: telemetry / isolated training), MLP 64-256-10, batch 128:")
    for label, flag in (("RunLog only (collector off)", False), ("HistoryCollector", True)):
        frac, tel_us, train_us = _overhead(flag, max(a.steps // 10, 50))
        print(
            f"  {label:30s} overhead {100 * frac:6.2f}%   median per step: telemetry "
            f"{tel_us:7.1f} us, training {train_us:8.1f} us"
        )


if __name__ == "__main__":
    main()
