"""Cost of the live rank merge per logged step against the unobserved FSDP2 step (gloo, CPU).

For each world size, three launches of ``examples/fsdp_train.py --mode fsdp`` (float64 tiny
transformer layer + head, every stream every step with histograms: the most rows a step can
log): unobserved, observed with ``live_merge=False``, observed with the live merge. Reported per
rank 0: the median unobserved step, the median observed step with and without the live merge,
and the live merge's own seconds per step (pack, one gather, unpack, merge) as a ratio of the
unobserved step. Short runs: absolute times are noisy on a shared machine, read the ratios.

Run it::

    OMP_NUM_THREADS=1 python benchmarks/live_merge.py --worlds 2 4 --steps 20
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fsdp_train.py"


def launch(world: int, steps: int, root: Path, *flags: str) -> dict:
    """Rank 0's facts of one launch."""
    dump = root / "dump"
    cmd = [sys.executable, str(EXAMPLE), "--mode", "fsdp", "--world-size", str(world)]
    cmd += ["--steps", str(steps), "--out", str(root / "run"), "--dump", str(dump), *flags]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads((dump / "rank0.json").read_text())


def main(argv: list[str] | None = None) -> list[dict]:
    """Measure and print one table row per world size."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--steps", type=int, default=20)
    a = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in a.worlds:
            base = launch(world, a.steps, Path(tmp, f"u{world}"), "--unwatched")
            off = launch(world, a.steps, Path(tmp, f"o{world}"), "--no-live-merge")
            on = launch(world, a.steps, Path(tmp, f"l{world}"))
            skip = min(2, a.steps - 1)  # warm-up steps
            step = float(np.median(base["seconds"][skip:]))
            live = on["live_seconds"] / a.steps
            rows.append({
                "world": world,
                "unobserved_step_ms": 1e3 * step,
                "observed_no_live_ms": 1e3 * float(np.median(off["seconds"][skip:])),
                "observed_live_ms": 1e3 * float(np.median(on["seconds"][skip:])),
                "live_merge_ms_per_step": 1e3 * live,
                "live_merge_over_unobserved_step": live / step,
                "bytes_per_rank_per_step": on["bytes_per_step"],
            })  # fmt: skip
    print(" ".join(sys.argv))
    for r in rows:
        print(json.dumps(r))
    return rows


if __name__ == "__main__":
    main()
