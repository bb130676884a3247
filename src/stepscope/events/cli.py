"""``stepscope export RUN --tensorboard DIR --jsonl FILE --wandb DIR``: send a run on later.

Replays a history artifact through the same converter and trackers used during training (see
:mod:`stepscope.events.export`). W&B output is an offline run directory (``wandb sync`` it).

Example
-------
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> from stepscope.cli import main
>>> main(["export", run, "--jsonl", run + ".jsonl"])
exported run a (id ...): 3 steps, 3 events (scalar 3)
  x-axis: all
  jsonl: ...a.jsonl
0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from stepscope.errors import require_extra
from stepscope.events.coordinates import Axis
from stepscope.events.export import check_destinations, export_run
from stepscope.history import find_runs
from stepscope.history.discover import runs_at
from stepscope.history.files import atomic_write_json
from stepscope.history.frames import to_arrow
from stepscope.history.reader import HistoryReader
from stepscope.progress import progress_bar

EPILOG = """\
examples:
  stepscope export runs/demo --tensorboard tb          # every run under runs/demo: tb/<run name>/
  tensorboard --logdir tb                               # then open the Scalars page
  stepscope export runs/demo/plain-seed0 --tensorboard tb --name baseline --detail full --overwrite
  stepscope export runs/demo --jsonl demo.jsonl --wandb wb  # demo.<run>.jsonl for each run
  wandb sync wb/wandb/offline-run-*                     # send the offline W&B runs later
  stepscope export runs/demo --parquet tables            # tables/<run>/observations.parquet

A second export of an unchanged run into the same DIR writes nothing (the series would double);
a run that has grown since refuses export_exists unless --overwrite.

exit codes: 0 exported, 1 a tracker failed, 3 refused (e.g. export_exists)
"""


def register(subparsers: Any) -> None:
    """Add the ``export`` sub-command to the ``stepscope`` parser."""
    p = subparsers.add_parser(
        "export",
        help="replay a history artifact into TensorBoard, JSONL and/or W&B (offline)",
        description="Replay a history artifact through the same trackers used in training.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run",
        help="artifact directory (finished, live or left by a killed run), or a folder of runs",
    )
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="TensorBoard log directory; the run is written to DIR/<run name>",
    )
    p.add_argument(
        "--name",
        metavar="NAME",
        help="the run's name in TensorBoard and W&B (default: the run's folder name)",
    )
    p.add_argument(
        "--detail",
        choices=["default", "full"],
        default="default",
        help="default: a few readable quantities per site; full: every quantity (default: default)",
    )
    p.add_argument("--jsonl", metavar="FILE", help="JSONL file, one event per line")
    p.add_argument("--wandb", metavar="DIR", help="directory for an offline W&B run")
    p.add_argument(
        "--parquet",
        metavar="DIR",
        help="write DIR/observations.parquet: the tidy table of Run.to_pandas() (extra arrow)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier TensorBoard export of this run (default: refuse export_exists)",
    )
    p.add_argument("--no-progress", action="store_true", help="do not draw the progress bar")
    p.add_argument(
        "--axis",
        choices=[a.value for a in Axis],
        default=Axis.OPTIMIZER_STEP.value,
        help="x-axis of TensorBoard and W&B (default: optimizer_step)",
    )
    p.add_argument(
        "--wandb-project", default="stepscope", help="W&B project name (default: stepscope)"
    )
    p.add_argument(
        "--no-exponent-view",
        action="store_true",
        help="skip the TensorBoard per-sign log2|x| exponent views",
    )
    p.set_defaults(func=_export)


def _parquet(run: str, out: str) -> None:
    """``--parquet DIR``: each run's tidy observation table (``Run.to_arrow()``) as
    ``DIR/observations.parquet``, or ``DIR/<run path>/observations.parquet`` for a folder of
    several runs (found as :func:`stepscope.history.find_runs` finds them)."""

    pq = require_extra("pyarrow.parquet", "arrow", "stepscope export --parquet")
    runs = find_runs(run) or [Path(run)]  # none: the reader refuses history_artifact_missing
    for path in runs:
        reader = HistoryReader(path)
        table = to_arrow(reader)
        where = Path(out) / (path.relative_to(run) if len(runs) > 1 else "")
        where.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, where / "observations.parquet")
        print(
            f"exported run {reader.run.run_id}: {table.num_rows} rows to {where}/observations.parquet"
        )


#: Written into ``DIR/<run>/`` after a TensorBoard export: what was exported, so that the same
#: export again is recognised (and skipped) rather than doubling every series.
EXPORT_MARK = "stepscope-export.json"


def _mark(run: Path, args: argparse.Namespace) -> dict[str, Any]:
    """What identifies one TensorBoard export of ``run`` with these options."""
    h = HistoryReader(run)
    return {
        "run": str(run.resolve()),
        "run_id": h.run.run_id,
        "steps": len(h.steps),
        "commits": len(h.commits),
        "axis": args.axis,
        "exponent_view": not args.no_exponent_view,
        "name": args.name,
        "detail": args.detail,
    }


def _exported_before(mark: dict[str, Any], log_dir: str) -> Path | None:
    """The folder under ``log_dir`` that already holds exactly this export, if any."""
    for found in sorted(Path(log_dir).rglob(EXPORT_MARK)):  # run names may hold a "/"
        try:
            if json.loads(found.read_text()) == mark:
                return found.parent
        except (OSError, ValueError):
            continue
    return None


def _check_destinations(args: argparse.Namespace) -> None:
    """Refuse ``export_destination_invalid`` before any work (see :func:`check_destinations`)."""
    check_destinations(
        {"--tensorboard ": args.tensorboard, "--parquet ": args.parquet, "--wandb ": args.wandb},
        {"--jsonl ": args.jsonl},
    )


def _export(args: argparse.Namespace) -> int:
    _check_destinations(args)
    runs = runs_at([args.run], "export")
    if args.parquet:
        _parquet(args.run, args.parquet)
        if not (args.tensorboard or args.jsonl or args.wandb):
            return 0
    failed = 0
    for run in runs:
        jsonl = args.jsonl
        if jsonl is not None and len(runs) > 1:  # one file per run: demo.jsonl -> demo.<run>.jsonl
            rel = run.relative_to(args.run).as_posix().replace("/", ".")
            jsonl = str(Path(jsonl).with_suffix(f".{rel}{Path(jsonl).suffix or '.jsonl'}"))
        failed += _export_one(run, args, jsonl)
    return 1 if failed else 0


def _export_one(run: Path, args: argparse.Namespace, jsonl: str | None) -> int:
    tensorboard, mark = args.tensorboard, None
    if tensorboard is not None:
        mark = _mark(run, args)
        done = None if args.overwrite else _exported_before(mark, tensorboard)
        if done is not None:
            print(
                f"tensorboard: {done} already holds this export of run {mark['run_id']} (the run "
                "is unchanged since); nothing written (--overwrite writes it again)"
            )
            if jsonl is None and args.wandb is None:
                return 0
            tensorboard = None
    report = export_run(
        run,
        tensorboard=tensorboard,
        jsonl=jsonl,
        wandb=args.wandb,
        axis=args.axis,
        name=args.name,
        detail=args.detail,
        wandb_project=args.wandb_project,
        exponent_view=not args.no_exponent_view,
        overwrite=args.overwrite,
        progress=None if args.no_progress else progress_bar(f"export {run.name}", unit="step"),
    )
    if mark is not None and "tensorboard" in report.outputs and not report.subscriber_failures:
        atomic_write_json(Path(report.outputs["tensorboard"]) / EXPORT_MARK, mark)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind.items()))
    print(
        f"exported run {report.name} (id {report.run_id}): {report.steps} steps, "
        f"{report.events} events ({kinds})"
    )
    print(f"  x-axis: {report.axis}")
    for kind, dest in report.outputs.items():
        print(f"  {kind}: {dest}")
    for name, n in report.subscriber_failures.items():
        print(f"  {name} failed {n} time(s)")
    return 1 if report.subscriber_failures else 0
