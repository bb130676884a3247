"""Where a collector's steps go: a disk-first artifact (a new version, or ``output_dir``) or RAM.

:func:`open_store` builds the run record (fingerprint, descriptor, cadences, streams) and the
writer, ring and site catalog that the collector writes through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from stepscope.collect import stepstate
from stepscope.collect.resume import artifact_run_id, resumed_examples_seen
from stepscope.collect.settings import Cadence, WatchSettings
from stepscope.collect.sites import SiteCatalog
from stepscope.errors import Refusal
from stepscope.history import (
    HistoryWriter,
    ObservationBatch,
    RunRecord,
    StepBlockRecord,
    StepRing,
    model_fingerprint,
)
from stepscope.history.versions import claim_version, default_root
from stepscope.runlog import ClockRow, write_clock_rows
from stepscope.stats import backend_info


@dataclass
class Store:
    """The opened destination of a collector."""

    run: RunRecord
    ring: StepRing
    catalog: Any  # HistoryWriter (disk) or SiteCatalog (RAM): both register and end sites
    writer: HistoryWriter | None
    path: Path | None
    next_step: int  # 0, or the step after the last committed one when resuming
    examples_seen: int | None = 0  # examples consumed before next_step (None: unknown)

    def write_step(
        self,
        rows: Any,
        block: StepBlockRecord,
        batches: Sequence[ObservationBatch],
        scalars: Mapping[str, float],
        dated: Sequence[tuple[str, int, float]],
        late_clocks: Sequence[ClockRow],
    ) -> None:
        """Write one finished step: its block and observations (artifact, or RAM ring and
        ``rows``), user scalars logged for other steps, and clock rows of earlier steps resolved
        late (CUDA events)."""
        if self.writer is not None:  # the boundary's own batches: see HistoryWriter.write_step
            self.writer.write_step(
                block, list(batches), scalars=dict(scalars), trusted=stepstate.FAST_BOUNDARY
            )
        else:
            self.ring.push(block, list(batches))
            rows.write_step(block, scalars=dict(scalars))
        for name, at, value in dated:
            rows.write_scalar(name, at, value)
        write_clock_rows(rows, list(late_clocks))


def run_directory(settings: WatchSettings, rank: int = 0, world: int = 1) -> Path | None:
    """The directory a collector writes to (``None``: ``in_memory``); claims a new version.

    ``output_dir`` is used as given; otherwise the next ``version_<N>`` of
    ``<root_dir>/<name>`` is created (:func:`~stepscope.history.versions.claim_version`). Under
    several ranks each rank writes its own ``rank<r>`` subdirectory.
    """
    s = settings
    if s.in_memory:
        return None
    slot = f"rank{rank:03d}" if world > 1 else None
    if s.output_dir:
        return Path(s.output_dir) / (slot or "")
    parent = Path(s.root_dir) if s.root_dir else default_root()
    return claim_version(parent / s.name if s.name else parent, slot)


def run_exists_remedies(path: Path) -> list[str]:
    """What to do when an exact ``output_dir`` already holds a run: the two exact spellings."""
    name = (
        path.name
        if (default_root() / path.name).resolve() != path.resolve()
        else f"{path.name}_runs"
    )
    return [
        f"continue that run: ss.WatchSettings(output_dir={str(path)!r}, resume=True)",
        f"or a new run every time: ss.WatchSettings(name={name!r}) writes "
        f"{default_root() / name}/version_<N> (collector.run_dir says which)",
    ]


def open_store(
    model: torch.nn.Module,
    settings: WatchSettings,
    streams: Sequence[str],
    cadences: Mapping[str, Cadence],
    auto: Any,
) -> Store:
    """Open the artifact (or RAM ring) a collector of ``model`` writes to."""
    s = settings
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    device = next((str(p.device) for p in model.parameters()), "cpu")
    run = RunRecord.new(
        run_id=s.run_id,
        model_fingerprint=model_fingerprint(model),
        histogram_descriptor=s.descriptor.to_dict(),
        cadences={k: c.spine for k, c in cadences.items() if isinstance(c.spine, int)},
        device=device,
        rank=rank,
        world_size=world,
        extra={
            **dict(s.extra),
            "cadences": {k: c.describe() for k, c in cadences.items()},
            "auto_cadence": None if auto is None else asdict(auto),
            "streams": list(streams),
            "update_sample_size": s.update_sample_size,
            "update_seed": s.update_seed,
            "kernel_backend": backend_info(),  # which reduction kernels produced the rows
        },
    )
    path = run_directory(s, rank, world)
    if path is None:
        ring = StepRing(s.ram_capacity, s.ram_policy)
        return Store(run, ring, SiteCatalog(), None, None, 0)
    ring = StepRing(s.ram_capacity, "refuse", disk_backed=True)
    if s.resume and s.run_id is None:
        found = artifact_run_id(path)
        if found is not None:  # continue the artifact's run (none yet: keep the new run id)
            run = replace(run, run_id=found)
    try:
        writer = HistoryWriter(
            path,
            run,
            resume=s.resume,
            resume_at_step=s.resume_step,
            commit_steps=s.commit_steps,
            commit_seconds=s.commit_seconds,
            durable=s.durable,
            ring=ring,
        )
    except Refusal as err:
        if err.code != "history_run_exists":
            raise
        raise Refusal("history_run_exists", err.message, run_exists_remedies(path)) from err
    if not s.resume:
        return Store(run, ring, writer, writer, path, 0)
    step = int(writer.run.resumed_at_step or 0)
    seen = resumed_examples_seen(step, writer.resumed_after, s.resume_examples_seen)
    return Store(writer.run, ring, writer, writer, path, step, seen)
