"""``stepscope export RUN --tensorboard DIR --jsonl FILE --wandb DIR``: send a run on later.

Replays a history artifact through the same converter and trackers used during training (see
:mod:`stepscope.events.export`). W&B output is an offline run directory (``wandb sync`` it).

Example
-------
>>> from stepscope.cli import main
>>> main(["export", "runs/demo", "--jsonl", "runs/demo.jsonl"])  # doctest: +SKIP
0
"""

from __future__ import annotations

import argparse
from typing import Any

from stepscope.events.event import Axis


def register(subparsers: Any) -> None:
    """Add the ``export`` sub-command to the ``stepscope`` parser."""
    p = subparsers.add_parser(
        "export", help="replay a history artifact into TensorBoard, JSONL and/or W&B (offline)"
    )
    p.add_argument("run", help="artifact directory")
    p.add_argument("--tensorboard", metavar="DIR", help="TensorBoard log directory")
    p.add_argument("--jsonl", metavar="FILE", help="JSONL file, one event per line")
    p.add_argument("--wandb", metavar="DIR", help="directory for an offline W&B run")
    p.add_argument(
        "--axis",
        choices=[a.value for a in Axis],
        default=Axis.OPTIMIZER_STEP.value,
        help="x-axis of TensorBoard and W&B (default: optimizer_step)",
    )
    p.add_argument("--wandb-project", default="stepscope", help="W&B project name")
    p.add_argument(
        "--no-exponent-view", action="store_true", help="skip the TensorBoard exponent view"
    )
    p.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from stepscope.events.export import export_run

    report = export_run(
        args.run,
        tensorboard=args.tensorboard,
        jsonl=args.jsonl,
        wandb=args.wandb,
        axis=args.axis,
        wandb_project=args.wandb_project,
        exponent_view=not args.no_exponent_view,
    )
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind.items()))
    print(f"exported run {report.run_id}: {report.steps} steps, {report.events} events ({kinds})")
    print(f"  x-axis: {report.axis}")
    for kind, dest in report.outputs.items():
        print(f"  {kind}: {dest}")
    for name, n in report.subscriber_failures.items():
        print(f"  {name} failed {n} time(s)")
    return 1 if report.subscriber_failures else 0
