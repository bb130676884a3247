"""``stepscope spikes RUN [--json]``: the flight recorder's triggers and the layers that moved first.

``RUN`` is a run directory or a folder holding runs (searched recursively; each rank's segment
of a distributed run is a run of its own). Refuses ``history_artifact_missing`` when it holds no
run. A run without a flight recorder, or where nothing fired, lists no spikes.

Example
-------
>>> from stepscope.cli import main
>>> main(["spikes", "no/such/run"])
3
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from stepscope.errors import Refusal
from stepscope.forensics.attribution import Spike, read_spikes
from stepscope.history.discover import find_runs

EPILOG = """\
examples:
  stepscope spikes runs/demo                      # each trigger, the dense steps, layers that moved first
  stepscope spikes runs/ --json                   # every run under runs/, as one JSON object
"""

#: layers listed per trigger in the text output (``--json`` lists them all)
SHOWN = 8


def register(subparsers: Any) -> None:
    """Add ``stepscope spikes``."""
    p = subparsers.add_parser(
        "spikes",
        help="flight-recorder triggers and the layers that left their range first",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("run", help="run directory, or a folder holding runs (searched recursively)")
    p.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    p.set_defaults(func=_spikes)


def _num(v: float | None) -> str:
    return "-" if v is None else ("nan" if math.isnan(v) else f"{v:.4g}")


def format_spike(s: Spike) -> list[str]:
    """The text lines of one spike."""
    names = ", ".join(s.triggers) or "another rank's trigger"
    lines = [f"step {s.step}  rank {s.rank}  {names}"]
    for c in s.crossings:
        lines.append(
            f"  {c.channel} = {_num(c.value)}  (trailing median {_num(c.center)}, "
            f"limit {_num(c.limit)}, z {_num(c.z)})"
        )
    if s.dense_from is not None:
        lines.append(f"  dense cadence: steps {s.dense_from}..{s.dense_to} ({s.reason})")
    lo, hi = s.window_steps
    if not s.first:
        lines.append(f"  no layer left its trailing range (window steps {lo}..{hi})")
        return lines
    lines.append(f"  moved first (window steps {lo}..{hi}, saved at full resolution):")
    width = max(len(m.site) for m in s.first[:SHOWN])
    for i, m in enumerate(s.first[:SHOWN], 1):
        lines.append(
            f"  {i:>3}. {m.site:<{width}}  {m.field:<12}  step {m.step:<6}  z {m.z:7.1f}  "
            f"{_num(m.value)} (median {_num(m.center)})"
        )
    if len(s.first) > SHOWN:
        lines.append(f"       ... {len(s.first) - SHOWN} more (--json lists all)")
    return lines


def _spikes(args: argparse.Namespace) -> int:
    runs = find_runs(args.run)
    if not runs:
        raise Refusal(
            "history_artifact_missing",
            f"no run at or under {args.run!r}.",
            ["pass a run directory (WatchSettings(output_dir=...)) or a folder holding runs"],
        )
    found = [(str(r), read_spikes(r)) for r in runs]
    if args.json:
        doc = {
            "runs": [p for p, _ in found],
            "spikes": [{"run": p, **s.to_dict()} for p, spikes in found for s in spikes],
        }
        print(json.dumps(doc, indent=1))
        return 0
    for path, spikes in found:
        print(f"{path}: {len(spikes)} spike{'s' if len(spikes) != 1 else ''}")
        for s in spikes:
            print("\n".join(format_spike(s)))
    return 0
