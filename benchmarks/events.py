"""Events per second: ``events_from_step`` (the collector's hot path) and the built-in checks.

One thread (``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``). A step has ``--sites`` sites in
five (stream, phase) batches (activation, micro-batch gradient, gradient, parameter, update);
each observed row gives eight spine scalars. Three numbers, best of ``--repeat``:

* ``spine`` — events/s of ``events_from_step`` on steps without histograms (the common step);
* ``histogram`` — events/s on steps where every row also carries histogram counts;
* ``checks`` — events/s through an ``EventBus`` with the four built-in checks subscribed.

``--against REV`` runs the same measurement on another commit's ``src/`` (``git archive``, this
checkout's compiled kernel copied in) in alternating child processes and prints the ratios::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/events.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/events.py --against 0c02377 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _scenario(n_sites: int, hist: bool):
    import numpy as np
    import torch

    from stepscope.history import ObservationBatch, SiteRecord, StepBlockRecord
    from stepscope.stats import HistogramDescriptor, reduce_histograms, reduce_spines

    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(256, generator=g) for _ in range(n_sites)]
    desc = HistogramDescriptor()
    spines = reduce_spines(xs).numpy()
    kw = {}
    if hist:
        kw = {"hist_rows": np.arange(n_sites), "histograms": reduce_histograms(xs, desc).numpy()}
    ids = list(range(n_sites))
    batches = [
        ObservationBatch.observed("activation", "forward", ids, spines, **kw),
        ObservationBatch.observed(
            "gradient", "backward", ids, spines, scale_grad="scaled", micro_batch=0, **kw
        ),
        ObservationBatch.observed("gradient", "pre_step", ids, spines, scale_grad="unscaled", **kw),
        ObservationBatch.observed("parameter", "post_step", ids, spines, **kw),
        ObservationBatch.observed("update", "post_step", ids, spines, **kw),
    ]
    sites = [SiteRecord(i, f"layer{i}", "torch.nn.Linear", "f32[256]") for i in ids]
    return (StepBlockRecord(3, examples_seen=192, epoch=0), batches, sites, desc)


def _best_rate(fn, repeat: int, min_seconds: float = 0.3) -> tuple[float, int]:
    """Best events/s over ``repeat`` timings, each running ``fn`` until ``min_seconds`` pass."""
    best, n_events = 0.0, 0
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            n_events = fn()
            n += n_events
            dt = time.perf_counter() - t0
            if dt >= min_seconds:
                break
        best = max(best, n / dt)
    return best, n_events


def measure(n_sites: int, repeat: int) -> dict[str, float]:
    """events/s of the three workloads on the ``stepscope`` importable here."""
    import torch

    from stepscope.events import (
        EventBus,
        GradientNormCheck,
        NonFiniteCheck,
        UpdateRatioCheck,
        ZeroFractionCheck,
        events_from_step,
    )

    torch.set_num_threads(1)
    out: dict[str, float] = {}
    for label, hist in (("spine", False), ("histogram", True)):
        block, batches, sites, desc = _scenario(n_sites, hist)
        out[label], out[f"{label}_events_per_step"] = _best_rate(
            lambda b=block, bs=batches, s=sites, d=desc: len(events_from_step(b, bs, s, d)),
            repeat,
        )
    block, batches, sites, desc = _scenario(n_sites, False)
    events = events_from_step(block, batches, sites, desc, {"loss": 0.5})
    bus = EventBus(capacity=64)
    for check in (NonFiniteCheck(), ZeroFractionCheck(), GradientNormCheck(), UpdateRatioCheck()):
        bus.subscribe(check)

    def publish() -> int:
        bus.publish(events)
        return len(events)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out["checks"], _ = _best_rate(publish, repeat)
    return out


def _source_of(rev: str, into: Path) -> Path:
    """``src/`` of commit ``rev`` extracted under ``into``, with this checkout's kernel copied in."""
    data = subprocess.run(
        ["git", "archive", rev, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    tar = into / "src.tar"
    tar.write_bytes(data)
    with tarfile.open(tar) as tf:
        tf.extractall(into, filter="data")
    for so in (ROOT / "src/stepscope/stats").glob("_stepscope_kernels*.so"):
        shutil.copy2(so, into / "src/stepscope/stats" / so.name)
    return into / "src"


def _child(src: Path, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child", "--sites", str(args.sites)]
    cmd += ["--repeat", str(args.repeat)]
    res = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sites", type=int, default=64)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--against", metavar="REV", help="compare with this commit's src/")
    p.add_argument("--rounds", type=int, default=3, help="alternating child runs per side")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.sites, args.repeat)))
        return 0
    print("command:", " ".join([Path(sys.executable).name, *sys.argv]))
    if args.against is None:
        r = measure(args.sites, args.repeat)
        for k in ("spine", "histogram", "checks"):
            print(f"{k:>10}: {r[k]:12,.0f} events/s")
        return 0
    with tempfile.TemporaryDirectory() as d:
        other = _source_of(args.against, Path(d))
        here = ROOT / "src"
        best: dict[str, dict[str, float]] = {"here": {}, args.against: {}}
        for _ in range(args.rounds):
            for label, src in (("here", here), (args.against, other)):
                for k, v in _child(src, args).items():
                    best[label][k] = max(best[label].get(k, 0.0), v)
    print(f"{'workload':>10} {'this checkout':>16} {args.against:>16}  ratio (this / other)")
    for k in ("spine", "histogram", "checks"):
        a, b = best["here"][k], best[args.against][k]
        print(f"{k:>10} {a:>12,.0f} ev/s {b:>12,.0f} ev/s  {a / b:6.2f}x")
    n = best["here"]["spine_events_per_step"], best[args.against]["spine_events_per_step"]
    print(f"events per step (spine): {n[0]:.0f} here, {n[1]:.0f} there")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
