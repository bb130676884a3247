"""``stepscope demo``: train the reference model with telemetry on."""

from __future__ import annotations

import argparse

from stepscope.demo.run import DemoConfig, run_demo


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``demo`` sub-command."""
    p = subparsers.add_parser(
        "demo", help="train the reference MLP on bundled digits and show its statistics"
    )
    d = DemoConfig()
    p.add_argument("--out", default=d.out_dir, help="output directory (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument(
        "--width-scale", type=float, default=d.width_scale, help="scale of the Ciresan widths"
    )
    p.add_argument(
        "--final-relu", action="store_true", help="ReLU after the last layer (legacy study)"
    )
    p.add_argument("--data", default=d.data_source, choices=["auto", "mnist", "digits"])
    p.add_argument("--quick", action="store_true", help="a tiny run for tests")
    p.set_defaults(func=_main)


def _main(args: argparse.Namespace) -> int:
    cfg = DemoConfig(
        out_dir=args.out,
        seed=args.seed,
        epochs=args.epochs,
        width_scale=args.width_scale,
        final_relu=args.final_relu,
        data_source=args.data,
        quick=args.quick,
    )
    result = run_demo(cfg)
    print(f"\nthe run's history ({result.artifact}), as `stepscope show` prints it:\n")
    from stepscope.cli import main as cli_main

    cli_main(["show", str(result.artifact)])
    print(f"\noutput directory: {result.out_dir}")
    return 0
