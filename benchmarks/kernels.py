"""Throughput of the spine and histogram reductions, as ratios to one ``torch.sum`` pass.

Run:  .venv/bin/python benchmarks/kernels.py [--sizes 1048576 16777216] [--threads N] [--repeats 15]
                                             [--against OLD.so] [--data randn zeros ones relu]

Everything is timed in this one process, alternating the contenders, and reported as the median
time relative to ``torch.sum`` over the same tensor (absolute times on shared machines are noise).
Contenders: the stepscope kernel that runs by default (C on the CPU when a compiler is present),
the pure-torch path, a naive eager spine (separate torch reductions with masks, as one would write
it), ``torch.histc`` with the same number of bins as our histogram row (520), and the spine and
histogram of a histogram step in one read (``spine_and_histogram_into``).
Targets: spine <= 2x one sum pass, histogram <= 4x.

``--against OLD.so`` adds a second kernel library built from another commit (``git show
REV:src/stepscope/stats/_kernels.c > old.c; cc -O3 -fno-wrapv -std=c11 -fno-math-errno
-fopenmp-simd -pthread -fPIC -shared old.c -o old.so -lm``), its float32 spine and histogram
entry points called directly and this build's beside them (same arguments, same process,
alternating): the before/after of a kernel change. ``--data`` picks the inputs (a standard
normal, all zeros, all ones, or ReLU outputs: half exact zeros).

Second table: the per-row cost of the collector's staging path for many small tensors (200
tensors of 64 elements, what a step's activation or parameter rows look like on small layers):
one ``Staging.write`` per tensor (the activation hooks' path) against one ``Staging.write_many``
per stream (the multi-tensor path of the gradient, parameter and update streams).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time

import torch

from stepscope.collect.staging import Staging
from stepscope.stats import (
    SPINE_WIDTH,
    HistogramDescriptor,
    backend_info,
    reduce_histograms,
    reduce_spines,
    spine_and_histogram_into,
)


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
    ap.add_argument("--against", help="another compiled _kernels library to time beside this one")
    ap.add_argument("--data", nargs="+", default=["randn"], choices=list(DATA))
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    desc = HistogramDescriptor()
    print(f"command: {' '.join([sys.executable.split('/')[-1], *sys.argv])}")
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, kernel: {backend_info()}")
    print(
        f"| elements | torch.sum ms | spine ({backend_info()['cpu']}) | spine (torch path) | naive eager spine "
        f"| histogram ({backend_info()['cpu']}) | histogram (torch path) | torch.histc 520 bins "
        f"| spine + histogram, one read ({backend_info()['cpu']}) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    srow = torch.empty(SPINE_WIDTH, dtype=torch.float64)
    hrow = torch.empty(desc.width, dtype=torch.int64)
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
                "both": lambda x=x: spine_and_histogram_into(x, srow, hrow, desc),
            },
            args.repeats,
        )
        base = t["sum"]
        r = {k: v / base for k, v in t.items()}
        print(
            f"| {n:,} | {base * 1e3:.2f} | {r['spine']:.2f}x | {r['spine_torch']:.1f}x | {r['naive']:.1f}x "
            f"| {r['hist']:.2f}x | {r['hist_torch']:.1f}x | {r['histc']:.1f}x | {r['both']:.2f}x |"
        )
    if args.against:
        print_against(args.against, args.sizes, args.data, args.repeats, desc)
    print_row_costs(args.repeats)
    return 0


DATA = {
    "randn": lambda n, g: torch.randn(n, generator=g),
    "zeros": lambda n, g: torch.zeros(n),
    "ones": lambda n, g: torch.ones(n),
    "relu": lambda n, g: torch.relu(torch.randn(n, generator=g)),
}


def print_against(path: str, sizes: list[int], data: list[str], repeats: int, desc) -> None:
    """This build's float32 spine and histogram entry points beside another build's."""
    from stepscope.stats import _native
    from stepscope.stats._backend import F32 as _F32
    from stepscope.stats.binning import slot_tables as _tables

    new = _native.load()
    if new is None:
        print("\n(no C kernel in this build: --against skipped)")
        return
    old = ctypes.CDLL(path)
    for name in ("stepscope_spine_f32", "stepscope_hist_f32"):  # signatures unchanged since ABI 1
        argtypes, restype = _native.EXPORTS[name]
        getattr(old, name).argtypes, getattr(old, name).restype = argtypes, restype
    table, thr = _tables(desc, _F32)
    hargs = (table.ctypes.data, thr.ctypes.data, len(thr), 2 * desc.n_bins, desc.width, 1)
    spine = torch.empty(SPINE_WIDTH, dtype=torch.float64)
    hist = torch.zeros(desc.width, dtype=torch.int64)
    print(
        f"\n| data | elements | spine: {path} | spine: this build | histogram: {path} | histogram: this build |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    g = torch.Generator().manual_seed(0)
    for kind in data:
        for n in sizes:
            x = DATA[kind](n, g)
            p = x.data_ptr()
            t = bench(
                {
                    "sum": lambda x=x: torch.sum(x),
                    "s_old": lambda p=p, n=n: old.stepscope_spine_f32(p, n, 1, spine.data_ptr()),
                    "s_new": lambda p=p, n=n: new.stepscope_spine_f32(p, n, 1, spine.data_ptr()),
                    "h_old": lambda p=p, n=n: old.stepscope_hist_f32(p, n, *hargs, hist.data_ptr()),
                    "h_new": lambda p=p, n=n: new.stepscope_hist_f32(p, n, *hargs, hist.data_ptr()),
                },
                repeats,
            )
            r = {k: v / t["sum"] for k, v in t.items()}
            print(
                f"| {kind} | {n:,} | {r['s_old']:.2f}x | {r['s_new']:.2f}x | {r['h_old']:.2f}x "
                f"| {r['h_new']:.2f}x |"
            )


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
    print(
        f"| Staging.write_many per stream (gradient/parameter/update) | {t['many'] / n_rows * 1e6:.1f} |"
    )


if __name__ == "__main__":
    sys.exit(main())
