"""Export a history artifact (finished, live or left by a killed run) through the trackers.

:func:`replay` reads committed steps with the history layer's reader and publishes, step by
step, exactly the events :func:`events_from_step` makes during training — same converter, same
trackers — so a run can be sent to TensorBoard / W&B / JSONL later. :func:`export_run` builds the
trackers from paths (the ``stepscope export`` command).

TensorBoard output goes to ``DIR/<name>`` (one run directory per exported run, so
TensorBoard names the run after it and several runs share one ``--logdir``); the name is
``name=`` (``--name``) or the run's name, :func:`~stepscope.events.tags.run_name` (its
directory's name, not its hex id). The run record is the text entry ``run/record``. Tags are the
readable layout of :mod:`stepscope.events.tags` (``detail="full"``: every quantity). Exporting into a run directory that already holds event files
refuses ``export_exists`` (it would double every series) unless ``overwrite=True``, which
replaces it.

Steps are read in windows of ``window`` steps, so memory does not grow with the run. A user
scalar logged at a step without a step block gets a block with unknown ``examples_seen`` and
``epoch`` (``None``), never 0.

Example
-------
>>> from stepscope.history.sample import sample_run
>>> run = sample_run()  # a tiny run: three training-loss scalars
>>> report = export_run(run, jsonl=run + ".jsonl")
>>> report.steps, report.axis  # no step blocks were written: the x-axis is every row's step
(3, 'all')
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stepscope.errors import Refusal
from stepscope.events.bus import EventBus
from stepscope.events.convert import events_from_step
from stepscope.events.coordinates import Axis
from stepscope.events.event import ObserverEvent
from stepscope.events.tags import Detail, run_name
from stepscope.events.trackers.jsonl import JsonlTracker
from stepscope.events.trackers.tensorboard import TensorBoardTracker
from stepscope.events.trackers.wandb import WandbTracker
from stepscope.history import StepBlockRecord
from stepscope.history.decode import batches_from_rows
from stepscope.history.reader import HistoryReader

__all__ = [
    "ExportReport",
    "export_run",
    "replay",
    "step_count",
    "step_events",
    "tensorboard_run_dir",
]

#: ``progress(done_steps, total_steps)``, called after each replayed step.
ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True)
class ExportReport:
    """What an export did: steps replayed, events per kind, the axis, failing subscribers.

    ``name`` is the run's name in TensorBoard and W&B (``run_id`` its id).
    """

    run_id: str
    steps: int
    events: int
    by_kind: dict[str, int]
    axis: str
    outputs: dict[str, str] = field(default_factory=dict)
    subscriber_failures: dict[str, int] = field(default_factory=dict)
    name: str = ""


def _steps_of(
    reader: HistoryReader,
) -> tuple[dict[int, StepBlockRecord], np.ndarray, np.ndarray]:
    blocks = {b.optimizer_step: b for b in reader.step_blocks()}
    scalar_rows = reader.table("scalars")
    all_steps = np.union1d(np.fromiter(blocks, np.int64, len(blocks)), scalar_rows["step"])
    return blocks, scalar_rows, all_steps


def step_count(path: str | os.PathLike[str]) -> int:
    """How many steps :func:`step_events` yields for ``path`` (steps with a block or a scalar)."""
    return len(_steps_of(HistoryReader(path))[2])


def step_events(path: str | os.PathLike[str], window: int = 256) -> Iterator[list[ObserverEvent]]:
    """The events of each committed step of an artifact, in step order (one list per step)."""
    reader = HistoryReader(path)
    blocks, scalar_rows, all_steps = _steps_of(reader)
    for lo_i in range(0, len(all_steps), window):
        steps = all_steps[lo_i : lo_i + window]
        span = (int(steps[0]), int(steps[-1]))
        obs = reader.table("observations", steps=span)
        hist = reader.table("histograms", steps=span)
        batches = batches_from_rows(obs, hist, reader.disclosures)
        sc = scalar_rows[(scalar_rows["step"] >= span[0]) & (scalar_rows["step"] <= span[1])]
        for step in steps.tolist():
            block = blocks.get(step) or StepBlockRecord(step)
            rows = sc[sc["step"] == step]
            scalars = {reader.scalar_names[int(r["name"])]: float(r["value"]) for r in rows}
            yield events_from_step(
                block, batches.get(step, []), reader.sites, reader.descriptor, scalars
            )


def replay(
    path: str | os.PathLike[str],
    bus: EventBus,
    window: int = 256,
    progress: ProgressCallback | None = None,
) -> ExportReport:
    """Publish every committed step of ``path`` on ``bus`` (does not close it).

    ``progress(done, total)`` is called after each step when given.
    """
    kinds: Counter[str] = Counter()
    n_steps = 0
    total = step_count(path) if progress is not None else 0
    for events in step_events(path, window):
        bus.publish(events)
        kinds.update(e.kind.value for e in events)
        n_steps += 1
        if progress is not None:
            progress(n_steps, total)
    axes = {a for s in bus.subscribers if isinstance(a := getattr(s, "axis", None), Axis)}
    failures = {
        type(s).__name__: bus.status(s).failures for s in bus.subscribers if bus.status(s).failures
    }
    return ExportReport(
        run_id=HistoryReader(path).run.run_id,
        steps=n_steps,
        events=sum(kinds.values()),
        by_kind=dict(kinds),
        axis=",".join(sorted(a.value for a in axes)) or "all",
        subscriber_failures=failures,
    )


def check_destinations(
    folders: Mapping[str, str | os.PathLike[str] | None],
    files: Mapping[str, str | os.PathLike[str] | None] | None = None,
) -> None:
    """Refuse ``export_destination_invalid`` before any work: a folder destination that is an
    existing file, or a file destination that is an existing folder (each once raised a raw
    ``OSError`` after the export had begun).

    The keys are the spellings the message and remedy use: a CLI flag with its space
    (``"--tensorboard "``) or a keyword with its ``=`` (``"tensorboard="``).

    >>> import tempfile
    >>> d = tempfile.mkdtemp()
    >>> check_destinations({"tensorboard=": d + "/tb"}, {"jsonl=": d + "/events.jsonl"})  # new: fine
    >>> check_destinations({}, {"jsonl=": d})
    Traceback (most recent call last):
    ...
    stepscope.errors.RefusalInputError: [export_destination_invalid] jsonl='...' is a folder; it needs a file path. Remedies: pass jsonl=<a file path>, e.g. jsonl='.../events.jsonl'
    """

    def spelled(flag: str, value: object) -> str:
        return f"{flag}{value!r}" if flag.endswith("=") else f"{flag}{value}"

    for flag, value in folders.items():
        if value is not None and Path(value).exists() and not Path(value).is_dir():
            raise Refusal(
                "export_destination_invalid",
                f"{spelled(flag, str(value))} is an existing file; it needs a folder (new or "
                "existing).",
                [f"pass {flag}<a folder path>, e.g. {spelled(flag, 'tb/')}"],
            )
    for flag, value in (files or {}).items():
        if value is not None and Path(value).is_dir():
            example = str(Path(value) / "events.jsonl")
            raise Refusal(
                "export_destination_invalid",
                f"{spelled(flag, str(value))} is a folder; it needs a file path.",
                [f"pass {flag}<a file path>, e.g. {spelled(flag, example)}"],
            )


def export_run(
    path: str | os.PathLike[str],
    *,
    tensorboard: str | os.PathLike[str] | None = None,
    jsonl: str | os.PathLike[str] | None = None,
    wandb: str | os.PathLike[str] | None = None,
    axis: Axis | str = Axis.OPTIMIZER_STEP,
    name: str | None = None,
    detail: Detail | str = Detail.DEFAULT,
    wandb_project: str = "stepscope",
    wandb_mode: str = "offline",
    exponent_view: bool = True,
    overwrite: bool = False,
    progress: ProgressCallback | None = None,
) -> ExportReport:
    """Replay an artifact into the requested outputs (at least one).

    Parameters
    ----------
    path
        The artifact directory.
    tensorboard, jsonl, wandb
        A TensorBoard log directory (the run goes to ``tensorboard/<name>``), a JSONL file, a
        W&B directory (``wandb_mode`` run, offline by default: send it later with ``wandb sync``).
    axis
        The x-axis of TensorBoard and W&B (JSONL lines carry all three axes).
    name
        The run's name in TensorBoard and W&B (default: :func:`~stepscope.events.tags.run_name`,
        the artifact directory's name).
    detail
        ``"default"`` (the readable tag set) or ``"full"`` (every quantity); JSONL always has
        every event.
    overwrite
        Replace an earlier TensorBoard export of this run (otherwise refuse ``export_exists``).
    progress
        ``progress(done_steps, total_steps)`` after each step.
    """
    if tensorboard is None and jsonl is None and wandb is None:
        raise Refusal(
            "settings_invalid",
            "export needs at least one output.",
            ["pass --tensorboard DIR, --jsonl FILE or --wandb DIR"],
        )
    check_destinations({"tensorboard=": tensorboard, "wandb=": wandb}, {"jsonl=": jsonl})
    record = HistoryReader(path).run  # refuses before any output is created
    label = name if name is not None else run_name(record, path)
    tb_run_dir = None if tensorboard is None else tensorboard_run_dir(tensorboard, label)
    if tb_run_dir is not None and tb_run_dir.exists() and any(tb_run_dir.iterdir()):
        if not overwrite:
            raise Refusal(
                "export_exists",
                f"{tb_run_dir} already holds a TensorBoard export of run {label!r}; writing "
                "again would double every series.",
                [
                    "pass --overwrite (overwrite=True) to replace it",
                    "export under another name: --name NAME (name=...)",
                    "export into another DIR",
                ],
            )
        shutil.rmtree(tb_run_dir)
    outputs: dict[str, str] = {}
    with EventBus(capacity=1) as bus:
        if tb_run_dir is not None:
            tb = TensorBoardTracker(
                tb_run_dir, axis=axis, detail=detail, exponent_view=exponent_view
            )
            tb.write_run_record(record.to_dict(), label)
            bus.subscribe(tb)
            outputs["tensorboard"] = str(tb_run_dir)
        if jsonl is not None:
            bus.subscribe(JsonlTracker(jsonl))
            outputs["jsonl"] = str(jsonl)
        if wandb is not None:
            bus.subscribe(
                WandbTracker(
                    axis=axis,
                    detail=detail,
                    project=wandb_project,
                    dir=wandb,
                    mode=wandb_mode,
                    name=label,
                    config={"stepscope_run_record": record.to_dict()},
                )
            )
            outputs["wandb"] = str(wandb)
        report = replay(path, bus, progress=progress)
    return ExportReport(
        run_id=report.run_id,
        steps=report.steps,
        events=report.events,
        by_kind=report.by_kind,
        axis=report.axis,
        outputs=outputs,
        subscriber_failures=report.subscriber_failures,
        name=label,
    )


def tensorboard_run_dir(log_dir: str | os.PathLike[str], name: str) -> Path:
    """``log_dir/<name>``: where :func:`export_run` writes a run's TensorBoard events.

    ``name`` may have ``/``-separated parts (``exp/version_3``), none of them empty, ``.`` or
    ``..``; otherwise it refuses ``export_run_name_invalid``.

    >>> tensorboard_run_dir("tb", "demo-1").as_posix(), tensorboard_run_dir("tb", "a/version_0").as_posix()
    ('tb/demo-1', 'tb/a/version_0')
    """
    text = str(name)
    parts = text.split("/")
    if not text or any(p in {"", ".", ".."} or os.sep in p or "\\" in p for p in parts):
        raise Refusal(
            "export_run_name_invalid",
            f"run name {name!r} cannot name a directory below the log directory.",
            ["pass --name NAME (name=...) made of folder names, e.g. --name exp1"],
        )
    return Path(log_dir).joinpath(*parts)
