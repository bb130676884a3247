"""``stepscope merge`` of many synthetic rank segments: wall time and peak memory.

Each synthetic rank writes ``--sites`` parameter sites x 3 streams (gradient, parameter,
update) for ``--steps`` steps, histograms every ``--hist-every`` steps, like a sharded run
(spines are random rows with consistent counts). The merge runs in a fresh interpreter so its
peak resident memory (``VmHWM``) is its own.

Run it::

    OMP_NUM_THREADS=1 python benchmarks/merge_ranks.py --ranks 1000 --sites 16 --steps 10
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from stepscope.history import HistoryWriter, ObservationBatch, RunRecord, StepBlockRecord
from stepscope.stats import HistogramDescriptor, reduce_spines

STREAMS = (("gradient", "backward"), ("parameter", "post_step"), ("update", "post_step"))

MERGE = """
import json, sys, time
from stepscope.history import merge_ranks
paths, out = sys.argv[1:-1], sys.argv[-1]
t0 = time.perf_counter()
merge_ranks(paths, out, durable=False)
sec = time.perf_counter() - t0
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": sec, "peak_rss_mib": int(hwm) / 1024}))
"""


def write_segments(root: Path, ranks: int, sites: int, steps: int, hist_every: int) -> float:
    """Write ``ranks`` segments of one run; returns the seconds it took."""
    import torch

    width = HistogramDescriptor().width
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    shards = [torch.randn(sites, 64, generator=gen, dtype=torch.float64) for _ in range(4)]
    rows = [reduce_spines(list(s)).numpy() for s in shards]
    hist = np.ones((sites, width), dtype=np.int64)
    for rank in range(ranks):
        run = RunRecord.new(run_id="synthetic", rank=rank, world_size=ranks)
        with HistoryWriter(root / f"rank{rank:04d}", run, durable=False, commit_steps=64) as w:
            ids = [w.register_site(f"layers.{i}.weight", "Linear", "f32[64]") for i in range(sites)]
            for step in range(steps):
                h = step % hist_every == 0
                spines = rows[(rank + step) % len(rows)]
                batches = [
                    ObservationBatch.observed(
                        s, ph, ids, spines, scale_grad="unscaled" if s == "gradient" else None,
                        hist_rows=np.arange(sites) if h else None,
                        histograms=hist if h else None,
                    )
                    for s, ph in STREAMS
                ]  # fmt: skip
                w.write_step(StepBlockRecord(step, examples_seen=8 * (step + 1)), batches)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    """Write the segments, merge them in a child interpreter, print and return the numbers."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=1000)
    p.add_argument("--sites", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--hist-every", type=int, default=5)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_s = write_segments(root / "ranks", a.ranks, a.sites, a.steps, a.hist_every)
        paths = sorted(str(x) for x in (root / "ranks").iterdir())
        size = sum(f.stat().st_size for f in (root / "ranks").rglob("*") if f.is_file())
        done = subprocess.run(
            [sys.executable, "-c", MERGE, *paths, str(root / "merged")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        merged = json.loads(done.stdout.strip().splitlines()[-1])
    out = {
        "ranks": a.ranks, "sites": a.sites, "streams": len(STREAMS), "steps": a.steps,
        "segments_mib": size / 2**20, "write_seconds": write_s, **merged,
    }  # fmt: skip
    print(" ".join(sys.argv))
    print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
