"""Throughput of the spine and histogram reductions, as ratios to one ``torch.sum`` pass.

Run:  .venv/bin/python benchmarks/kernels.py [--sizes 1048576 16777216] [--threads N] [--repeats 15]

Everything is timed in this one process, alternating the contenders, and reported as the median
time relative to ``torch.sum`` over the same tensor (absolute times on shared machines are noise).
Contenders: the stepscope kernel that runs by default (C on the CPU when a compiler is present),
the pure-torch path, a naive eager spine (separate torch reductions with masks, as one would write
it), and ``torch.histc`` with the same number of bins as our histogram row (520).
Targets: spine <= 2x one sum pass, histogram <= 4x.

Second table: the per-row cost of the collector's staging path for many small tensors (200
tensors of 64 elements, what a step's activation or parameter rows look like on small layers):
one ``Staging.write`` per tensor (the activation hooks' path) against one ``Staging.write_many``
per stream (the multi-tensor path of the gradient, parameter and update streams).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from stepscope.collect.staging import Staging
from stepscope.stats import HistogramDescriptor, backend_info, reduce_histograms, reduce_spines


def naive_spine(x: torch.Tensor) -> torch.Tensor:
    fin = torch.isfinite(x)
    xf = torch.where(fin, x, 0.0)
    a = xf.abs()
    return torch.stack(
        [
            fin.sum().float(),
            (x == 0).sum().float(),
            (x < 0).sum().float(),
            torch.isnan(x).sum().float(),
            torch.where(fin, x, float("inf")).min(),
            torch.where(fin, x, float("-inf")).max(),
            a.max(),
            xf.sum(),
            (xf * xf).sum(),
            a.sum(),
        ]
    )


def bench(fns: dict, repeats: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        f()  # warm up (builds the C kernel once)
    for _ in range(repeats):
        for name, f in fns.items():  # alternate contenders so drift hits all alike
            t0 = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 1 << 24])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    desc = HistogramDescriptor()
    print(f"command: {' '.join([sys.executable.split('/')[-1], *sys.argv])}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, kernel: {backend_info()}")
    print(
        f"| elements | torch.sum ms | spine ({backend_info()['cpu']}) | spine (torch path) | naive eager spine "
        f"| histogram ({backend_info()['cpu']}) | histogram (torch path) | torch.histc 520 bins |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for n in args.sizes:
        x = torch.randn(n, generator=g)
        t = bench(
            {
                "sum": lambda x=x: torch.sum(x),
                "spine": lambda x=x: reduce_spines([x]),
                "spine_torch": lambda x=x: reduce_spines([x], backend="torch"),
                "naive": lambda x=x: naive_spine(x),
                "hist": lambda x=x: reduce_histograms([x], desc),
                "hist_torch": lambda x=x: reduce_histograms([x], desc, backend="torch"),
                "histc": lambda x=x: torch.histc(x, desc.width, -4, 4),
            },
            args.repeats,
        )
        base = t["sum"]
        r = {k: v / base for k, v in t.items()}
        print(
            f"| {n:,} | {base * 1e3:.2f} | {r['spine']:.2f}x | {r['spine_torch']:.1f}x | {r['naive']:.1f}x "
            f"| {r['hist']:.2f}x | {r['hist_torch']:.1f}x | {r['histc']:.1f}x |"
        )
    print_row_costs(args.repeats)
    return 0


def print_row_costs(repeats: int, n_rows: int = 200, numel: int = 64) -> None:
    """Per-row seconds of Staging.write (one call per tensor) vs Staging.write_many (one call)."""
    g = torch.Generator().manual_seed(1)
    ts = [torch.randn(numel, generator=g) for _ in range(n_rows)]
    st = Staging(n_rows, torch.device("cpu"), HistogramDescriptor())
    rows = list(range(n_rows))

    def per_row() -> None:
        st.reset()
        for i, t in enumerate(ts):
            st.write(i, t, False)

    def many() -> None:
        st.reset()
        st.write_many(rows, ts, False)

    t = bench({"per_row": per_row, "many": many}, repeats)
    print(f"\n| staging path, {n_rows} tensors of {numel} | us per row |")
    print("|---|---:|")
    print(f"| Staging.write per tensor (activation hooks) | {t['per_row'] / n_rows * 1e6:.1f} |")
    print(f"| Staging.write_many per stream (gradient/parameter/update) | {t['many'] / n_rows * 1e6:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
