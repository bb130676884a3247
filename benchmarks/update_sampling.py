"""The update stream's cost per due step: one native gather per direction vs one copy per row.

Run:  OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python -m benchmarks.update_sampling
                                                  [--model gpt] [--steps 200] [--threads 1]

Two collectors (``streams=["update"]``, due every step) watch two copies of one benchmark model
(``benchmarks.overhead.MODELS``; SGD with momentum), steps alternating between them. In one the
update sampler gathers the eligible rows natively (:class:`stepscope.stats.gather.SampleGather`),
in the other it samples every row one by one (``UpdateSampler.native = False``, the path every
ineligible row takes). Timed with ``time.perf_counter`` around the three calls the collector
makes per due step: ``UpdateSampler.snapshot`` (pre-step), ``UpdateSampler.deltas`` (post-step)
and ``Reducer.reduce_many("update", ...)``; medians over the timed steps, in microseconds. The
last column is the time inside the two ``stepscope_gather_many`` calls: reading the sampled
parameters' memory, which no amount of Python trimming removes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.overhead import MODELS, Arm
from stepscope.collect import HistoryCollector, WatchSettings
from stepscope.stats.gather import SampleGather

PHASES = ("snapshot", "deltas", "reduce_many")
#: seconds inside the C gather calls of the current step (the memory traffic of the sampling)
_in_c = [0.0]


def _timed_gather(gather: Callable[[SampleGather, bool], None]) -> Callable[..., None]:
    def call(self: SampleGather, subtract: bool) -> None:
        t0 = time.perf_counter()
        gather(self, subtract)
        _in_c[0] += time.perf_counter() - t0

    return call


def instrument(collector: HistoryCollector, times: dict[str, list[float]]) -> None:
    """Wrap the three update-stream calls of ``collector`` to record their seconds."""
    steps: Any = collector._steps  # a benchmark reads the internals it times
    sampler, reducer = steps.updates, steps.reducer

    def timed(name: str, fn: Callable[..., Any], consume: bool = False) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args)
            if consume:  # deltas is a generator: its work happens as it is consumed
                out = iter(list(out))
            times[name].append(time.perf_counter() - t0)
            return out

        return call

    sampler.snapshot = timed("snapshot", sampler.snapshot)
    sampler.deltas = timed("deltas", sampler.deltas, consume=True)
    reduce_many = reducer.reduce_many

    def reduce_update(stream: str, pairs: Any) -> None:
        if stream != "update":
            reduce_many(stream, pairs)
            return
        t0 = time.perf_counter()
        reduce_many(stream, pairs)
        times["reduce_many"].append(time.perf_counter() - t0)

    reducer.reduce_many = reduce_update


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gpt", choices=list(MODELS))
    ap.add_argument("--steps", type=int, default=200, help="timed steps per arm")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    make, data_fn = MODELS[args.model]
    g = torch.Generator().manual_seed(0)
    data = [data_fn(g) for _ in range(4)]
    tmp = tempfile.mkdtemp()
    SampleGather.gather = _timed_gather(SampleGather.gather)  # type: ignore[method-assign]
    arms: dict[str, tuple[Arm, HistoryCollector, dict[str, list[float]]]] = {}
    for name, native in (("native gather", True), ("per row", False)):
        arm = Arm(name, make)
        settings = WatchSettings(output_dir=tempfile.mkdtemp(dir=tmp), durable=False)
        c = HistoryCollector(arm.model, streams=["update"], cadence=1, settings=settings)
        c._steps.updates.native = native
        times: dict[str, list[float]] = {p: [] for p in (*PHASES, "C gather")}
        instrument(c, times)
        arms[name] = (arm, c, times)
    for i in range(args.warmup + args.steps):
        x, y = data[i % len(data)]
        order = list(arms.values())
        for arm, c, times in order if i % 2 == 0 else order[::-1]:
            if i == args.warmup:
                for v in times.values():
                    v.clear()
            _in_c[0] = 0.0
            with c.step(arm.opt, examples=len(y)):
                arm.plain(x, y, i)
            times["C gather"].append(_in_c[0])
    rows = sum(1 for r in next(iter(arms.values()))[1].rows if r.stream == "update")
    print("command: python -m benchmarks.update_sampling " + " ".join(sys.argv[1:]))
    print(
        f"model {args.model}: {rows} update rows, {args.steps} timed due steps per arm, "
        f"{args.threads} thread(s); median microseconds per due step"
    )
    print("| arm | " + " | ".join(PHASES) + " | total | of which in the C gather |")
    print("|---|" + "---:|" * (len(PHASES) + 2))
    totals = {}
    for name, (_, c, times) in arms.items():
        c.close()
        med = [statistics.median(times[p]) * 1e6 for p in PHASES]
        total = statistics.median([sum(t) for t in zip(*(times[p] for p in PHASES))]) * 1e6
        totals[name] = total
        in_c = statistics.median(times["C gather"]) * 1e6
        cells = " | ".join(f"{m:.0f}" for m in med)
        print(f"| {name} | {cells} | {total:.0f} | {in_c:.0f} |")
    print(f"per row / native gather: {totals['per row'] / totals['native gather']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
