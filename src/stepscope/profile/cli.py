"""``stepscope profile TRACE``: the hot path of a saved chrome trace.

Example
-------
::

    stepscope profile trace.json.gz --by device_time --top 15
"""

from __future__ import annotations

import argparse
import json

from stepscope.profile.capture import load_trace


def _run(args: argparse.Namespace) -> int:
    result = load_trace(args.trace)
    if args.json:
        rows = result.hot_path(by=args.by, top=args.top)
        payload = {
            "availability": result.availability.value,
            "source": result.source,
            "rows": [
                {**vars(r), "owner_class": r.owner_class.value if r.owner_class else None}
                for r in rows
            ],
        }
        print(json.dumps(payload, indent=1))
    else:
        print(result.table(by=args.by, top=args.top))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``profile`` sub-command."""
    parser = subparsers.add_parser(
        "profile",
        help="print the hot path of a saved torch.profiler chrome trace",
        description="Join device time to ops in a saved chrome trace and print the hot path.",
    )
    parser.add_argument("trace", help="a chrome trace (.json or .json.gz) from torch.profiler")
    parser.add_argument("--by", choices=("device_time", "cpu_time"), default="device_time")
    parser.add_argument("--top", type=int, default=20, help="rows to print (default 20)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.set_defaults(func=_run)
