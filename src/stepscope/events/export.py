"""Export a history artifact (finished, live or left by a killed run) through the trackers.

:func:`replay` reads committed steps with :func:`~stepscope.open_history` and publishes, step by
step, exactly the events :func:`events_from_step` makes during training — same converter, same
trackers — so a run can be sent to TensorBoard / W&B / JSONL later. :func:`export_run` builds the
trackers from paths (the ``stepscope export`` command).

Steps are read in windows of ``window`` steps, so memory does not grow with the run. A user
scalar logged at a step without a step block gets a block with unknown ``examples_seen`` and
``epoch`` (``None``), never 0.

Example
-------
>>> report = export_run("runs/demo", jsonl="runs/demo.jsonl")  # doctest: +SKIP
>>> report.steps, report.axis  # doctest: +SKIP
(100, 'optimizer_step')
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from stepscope.events.convert import events_from_step
from stepscope.events.event import Axis, ObserverEvent
from stepscope.events.stream import EventStream

__all__ = ["ExportReport", "export_run", "replay", "step_events"]


@dataclass(frozen=True)
class ExportReport:
    """What an export did: steps replayed, events per kind, the axis, failing subscribers."""

    run_id: str
    steps: int
    events: int
    by_kind: dict[str, int]
    axis: str
    outputs: dict[str, str] = field(default_factory=dict)
    subscriber_failures: dict[str, int] = field(default_factory=dict)


def step_events(path: str | os.PathLike[str], window: int = 256) -> Iterator[list[ObserverEvent]]:
    """The events of each committed step of an artifact, in step order (one list per step)."""
    from stepscope.history import StepBlockRecord, open_history
    from stepscope.history.decode import batches_from_rows

    reader = open_history(path)
    blocks = {b.optimizer_step: b for b in reader.step_blocks()}
    scalar_rows = reader.table("scalars")
    all_steps = np.union1d(np.fromiter(blocks, np.int64, len(blocks)), scalar_rows["step"])
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


def replay(path: str | os.PathLike[str], stream: EventStream, window: int = 256) -> ExportReport:
    """Publish every committed step of ``path`` on ``stream`` (does not close it)."""
    from stepscope.history import open_history

    kinds: Counter[str] = Counter()
    n_steps = 0
    for events in step_events(path, window):
        stream.publish(events)
        kinds.update(e.kind.value for e in events)
        n_steps += 1
    axes = {a for s in stream.subscribers if isinstance(a := getattr(s, "axis", None), Axis)}
    failures = {
        type(s).__name__: stream.status(s).failures
        for s in stream.subscribers
        if stream.status(s).failures
    }
    return ExportReport(
        run_id=open_history(path).run.run_id,
        steps=n_steps,
        events=sum(kinds.values()),
        by_kind=dict(kinds),
        axis=",".join(sorted(a.value for a in axes)) or "all",
        subscriber_failures=failures,
    )


def export_run(
    path: str | os.PathLike[str],
    *,
    tensorboard: str | os.PathLike[str] | None = None,
    jsonl: str | os.PathLike[str] | None = None,
    wandb: str | os.PathLike[str] | None = None,
    axis: Axis | str = Axis.OPTIMIZER_STEP,
    wandb_project: str = "stepscope",
    wandb_mode: str = "offline",
    exponent_view: bool = True,
) -> ExportReport:
    """Replay an artifact into the requested outputs (at least one).

    Parameters
    ----------
    path
        The artifact directory.
    tensorboard, jsonl, wandb
        A TensorBoard log directory, a JSONL file, a W&B directory (``wandb_mode`` run, offline
        by default: send it later with ``wandb sync``).
    axis
        The x-axis of TensorBoard and W&B (JSONL lines carry all three axes).
    """
    from stepscope.errors import Refusal
    from stepscope.history import open_history

    if tensorboard is None and jsonl is None and wandb is None:
        raise Refusal(
            "settings_invalid",
            "export needs at least one output.",
            ["pass --tensorboard DIR, --jsonl FILE or --wandb DIR"],
        )
    run_id = open_history(path).run.run_id  # refuses before any output is created
    outputs: dict[str, str] = {}
    with EventStream(capacity=1) as stream:
        if tensorboard is not None:
            from stepscope.events.trackers.tensorboard import TensorBoardTracker

            stream.subscribe(
                TensorBoardTracker(tensorboard, axis=axis, exponent_view=exponent_view)
            )
            outputs["tensorboard"] = str(tensorboard)
        if jsonl is not None:
            from stepscope.events.trackers.jsonl import JsonlTracker

            stream.subscribe(JsonlTracker(jsonl))
            outputs["jsonl"] = str(jsonl)
        if wandb is not None:
            from stepscope.events.trackers.wandb import WandbTracker

            stream.subscribe(
                WandbTracker(
                    axis=axis, project=wandb_project, dir=wandb, mode=wandb_mode, name=run_id
                )
            )
            outputs["wandb"] = str(wandb)
        report = replay(path, stream)
    return ExportReport(
        run_id=report.run_id,
        steps=report.steps,
        events=report.events,
        by_kind=report.by_kind,
        axis=report.axis,
        outputs=outputs,
        subscriber_failures=report.subscriber_failures,
    )
