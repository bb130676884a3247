"""Cost of ``stepscope.region`` enter/exit, side by side with the alternatives.

Run from the repository root::

    python benchmarks/region_overhead.py [--loops 50000] [--repeats 15]

Prints ns per enter/exit (best of ``repeats`` interleaved rounds) for: a bare ``contextlib.nullcontext()``,
``torch.profiler.record_function`` with no profiler running, an inactive ``stepscope.region``
(with and without metadata, and as a decorator), and -- for scale -- a region inside an active
session (a span plus a record_function bracket under a running profiler).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

import torch

import stepscope as ss


def per_call_ns(body, loops: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter_ns()
        body(loops)
        best = min(best, (time.perf_counter_ns() - start) / loops)
    return best


def loop_empty(n):
    for _ in range(n):
        pass


def loop_nullcontext(n):
    for _ in range(n):
        with contextlib.nullcontext():
            pass


def loop_record_function(n):
    for _ in range(n):
        with torch.profiler.record_function("x"):
            pass


def loop_region(n):
    for _ in range(n):
        with ss.region("x"):
            pass


def loop_region_metadata(n):
    for _ in range(n):
        with ss.region("x", step=3, lr=0.1):
            pass


@ss.region("decorated")
def decorated():
    return None


def plain():
    return None


def loop_plain_call(n):
    for _ in range(n):
        plain()


def loop_decorated(n):
    for _ in range(n):
        decorated()


def interleaved_best_ns(bodies: dict, loops: int, repeats: int) -> dict:
    """Best ns per call of each body, measured in interleaved rounds (so load drifts hit all)."""
    best = dict.fromkeys(bodies, float("inf"))
    for _ in range(repeats):
        for label, body in bodies.items():
            start = time.perf_counter_ns()
            body(loops)
            best[label] = min(best[label], (time.perf_counter_ns() - start) / loops)
    return best


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loops", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    loops, repeats = args.loops, args.repeats
    print("command: python " + " ".join(["benchmarks/region_overhead.py", *sys.argv[1:]]))
    print(
        f"torch {torch.__version__}, python {sys.version.split()[0]}, {loops} loops x "
        f"{repeats} interleaved rounds, best round; loop overhead subtracted"
    )
    best = interleaved_best_ns(
        {
            "empty": loop_empty,
            "null": loop_nullcontext,
            "rf": loop_record_function,
            "region": loop_region,
            "region_meta": loop_region_metadata,
            "plain": loop_plain_call,
            "decorated": loop_decorated,
        },
        loops,
        repeats,
    )
    empty = best["empty"]
    rows = [
        ("with contextlib.nullcontext()", best["null"] - empty),
        ("with torch.profiler.record_function (no profiler)", best["rf"] - empty),
        ("with ss.region('x') (inactive)", best["region"] - empty),
        ("with ss.region('x', step=3, lr=0.1) (inactive)", best["region_meta"] - empty),
        (
            "@ss.region decorated call minus plain call (inactive)",
            best["decorated"] - best["plain"],
        ),
    ]
    active_loops = max(loops // 20, 1)
    with ss.session(device_time=False):
        active = per_call_ns(loop_region, active_loops, 3) - empty
    rows.append((f"with ss.region('x') inside an active session ({active_loops} loops)", active))
    base = rows[0][1]
    print(f"{'bracket':<62} {'ns/enter+exit':>14} {'x nullcontext':>14}")
    for label, ns in rows:
        print(f"{label:<62} {ns:>14.1f} {ns / base:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
