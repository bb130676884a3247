"""``stepscope profile TRACE``: the hot path of a saved chrome trace.

``--by auto`` (the default) ranks by device time when device events were joined to ops and by
CPU time otherwise (a CPU-only trace), and says which it used.

Example
-------
::

    stepscope profile trace.json.gz --top 15
    stepscope profile trace.json.gz --by cpu_time --json
"""

from __future__ import annotations

import argparse
import json

from stepscope.profile.capture import load_trace
from stepscope.profile.draw import draw
from stepscope.profile.results import Availability

EPILOG = """\
examples:
  stepscope profile trace.json.gz                 # device time if joined, else CPU time
  stepscope profile trace.json.gz --by cpu_time --top 15
  stepscope profile trace.json.gz --json > hot_path.json
  stepscope profile trace.json.gz --draw tree.svg  # the call tree, sized by time

exit codes: 0 printed; 3 refused (e.g. device_time_unavailable with --by device_time)
"""


def _run(args: argparse.Namespace) -> int:
    result = load_trace(args.trace)
    by = args.by
    if by == "auto":
        joined = result.availability in (Availability.PARTIAL, Availability.JOINED)
        by = "device_time" if joined else "cpu_time"
    if args.draw:
        draw(result, args.draw, color_by=by, size_by=by)
    if args.json:
        rows = result.hot_path(by=by, top=args.top)
        payload = {
            "availability": result.availability.value,
            "by": by,
            "source": result.source,
            "rows": [
                {**vars(r), "owner_class": r.owner_class.value if r.owner_class else None}
                for r in rows
            ],
        }
        print(json.dumps(payload, indent=1))
    else:
        print(f"ranked by {by.replace('_', ' ')} (device time {result.availability.value})")
        print(result.table(by=by, top=args.top))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``profile`` sub-command."""
    parser = subparsers.add_parser(
        "profile",
        help="print the hot path of a saved torch.profiler chrome trace",
        description="Join device time to ops in a saved chrome trace and print the hot path.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("trace", help="a chrome trace (.json or .json.gz) from torch.profiler")
    parser.add_argument(
        "--by",
        choices=("auto", "device_time", "cpu_time"),
        default="auto",
        help="ranking metric (default auto: device time when joined, else CPU time)",
    )
    parser.add_argument("--top", type=int, default=20, help="rows to print (default 20)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--draw", metavar="FILE", help="also draw the call tree to FILE (.svg or .png)"
    )
    parser.set_defaults(func=_run)
