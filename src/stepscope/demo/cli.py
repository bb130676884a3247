"""``stepscope demo``: the reference study with every instrument on."""

from __future__ import annotations

import argparse

from stepscope.cli import main as cli_main
from stepscope.demo.study import StudyConfig, run_study


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser(
        "demo",
        help="train the reference MLP (seeds x plain/residual) with telemetry, curvature and a report",
    )
    d = StudyConfig()
    p.add_argument("--out", default=d.out_dir, help="output directory (default: %(default)s)")
    p.add_argument(
        "--seeds", type=int, nargs="+", default=list(d.seeds), help="seeds (default: %(default)s)"
    )
    p.add_argument(
        "--variants",
        nargs="+",
        default=list(d.variants),
        choices=["plain", "residual"],
        help="model variants (default: %(default)s)",
    )
    p.add_argument("--epochs", type=int, default=d.epochs, help="epochs (default: %(default)s)")
    p.add_argument(
        "--width-scale", type=float, default=d.width_scale, help="scale of the Ciresan widths"
    )
    p.add_argument(
        "--probe-every", type=int, default=d.probe_every, help="dense probe cadence in steps"
    )
    p.add_argument(
        "--data",
        default=d.data_source,
        choices=["auto", "mnist", "digits"],
        help="dataset: auto = MNIST when present locally, else the bundled digits",
    )
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument(
        "--overlay",
        default=d.overlay,
        metavar="FILE.json",
        help="historical points for the report (default: an illustrative example)",
    )
    p.add_argument("--no-overlay", action="store_true", help="draw no historical overlay")
    p.add_argument(
        "--quick", action="store_true", help="a tiny run for tests (one seed, small widths)"
    )
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cfg = StudyConfig(
        out_dir=args.out,
        seeds=tuple(args.seeds),
        variants=tuple(args.variants),
        epochs=args.epochs,
        width_scale=args.width_scale,
        probe_every=args.probe_every,
        data_source=args.data,
        report=not args.no_report,
        quick=args.quick,
        overlay=None if args.no_overlay else args.overlay,
    )
    result = run_study(cfg)
    first = result.runs[0]
    print(f"\n{first.path}, as `stepscope show` prints it:\n")

    cli_main(["show", str(first.path)])
    print(f"\nfinished in {result.elapsed_seconds:.0f} s; artifacts:")
    for r in result.runs:
        print(f"  {r.path}  (curvature: {', '.join(r.curvature_files) or 'none'})")
    print(f"report: {result.report}" if result.report else "report: not rendered")
    return 0
