"""``stepscope report RUN [RUN...] --out report.html``: one self-contained HTML report."""

from __future__ import annotations

import argparse

from stepscope.errors import Refusal
from stepscope.history.discover import runs_at
from stepscope.progress import progress_bar
from stepscope.report.html import render_report


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``report`` sub-command."""
    p = subparsers.add_parser(
        "report", help="write a self-contained HTML report (plots embedded) over run artifacts"
    )
    p.add_argument(
        "runs",
        nargs="+",
        metavar="RUN",
        help="run directories (seeds of one recipe), or folders of runs (searched recursively)",
    )
    p.add_argument("--out", required=True, help="HTML file to write")
    p.add_argument(
        "--endpoints",
        default=None,
        help="comma-separated optimizer steps for gap/confusion (default: first,last probe step)",
    )
    p.add_argument(
        "--histogram-limit", type=int, default=8, help="most histogram panels (default: 8)"
    )
    p.add_argument(
        "--every-seed",
        action="store_true",
        help="draw per-run panels (heatmaps, confusion, histograms, curvature) for every run, "
        "not only the first run of each recipe",
    )
    p.add_argument(
        "--overlay",
        action="append",
        default=[],
        metavar="FILE.json",
        help="historical evaluation points to overlay (repeatable; see stepscope.report.overlay)",
    )
    p.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    endpoints = None
    if args.endpoints:
        try:
            endpoints = [int(v) for v in args.endpoints.split(",") if v.strip()]
        except ValueError:
            raise Refusal(
                "report_input_invalid",
                f"--endpoints {args.endpoints!r} is not a comma-separated list of steps.",
                ["e.g. --endpoints 0,990"],
            ) from None
    out = render_report(
        [str(run) for run in runs_at(args.runs, "report")],
        args.out,
        endpoints=endpoints,
        histogram_limit=args.histogram_limit,
        overlays=args.overlay,
        every_seed=args.every_seed,
        progress=None if args.no_progress else progress_bar("report", unit="section"),
    )
    print(f"wrote {out}")
    return 0
