"""Where a collector's steps go: a disk-first artifact (``output_dir``) or a RAM ring.

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
from stepscope.history import (
    ArtifactWriter,
    ObservationBatch,
    RunRecord,
    StepBlockRecord,
    StepRing,
    model_fingerprint,
)
from stepscope.runlog import ClockRow, write_clock_rows
from stepscope.stats import backend_info


@dataclass
class Store:
    """The opened destination of a collector."""

    run: RunRecord
    ring: StepRing
    catalog: Any  # ArtifactWriter (disk) or SiteCatalog (RAM): both register and end sites
    writer: ArtifactWriter | None
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
        if self.writer is not None:  # the boundary's own batches: see ArtifactWriter.write_step
            self.writer.write_step(
                block, list(batches), scalars=dict(scalars), trusted=stepstate.FAST_BOUNDARY
            )
        else:
            self.ring.push(block, list(batches))
            rows.write_step(block, scalars=dict(scalars))
        for name, at, value in dated:
            rows.write_scalar(name, at, value)
        write_clock_rows(rows, list(late_clocks))


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
    if not s.output_dir:
        ring = StepRing(s.ram_capacity, s.ram_policy)
        return Store(run, ring, SiteCatalog(), None, None, 0)
    path = Path(s.output_dir) / (f"rank{rank:03d}" if world > 1 else "")
    ring = StepRing(s.ram_capacity, "refuse", disk_backed=True)
    if s.resume and s.run_id is None:
        found = artifact_run_id(path)
        if found is not None:  # continue the artifact's run (none yet: keep the new run id)
            run = replace(run, run_id=found)
    writer = ArtifactWriter(
        path,
        run,
        resume=s.resume,
        resume_at_step=s.resume_step,
        commit_steps=s.commit_steps,
        commit_seconds=s.commit_seconds,
        durable=s.durable,
        ring=ring,
    )
    if not s.resume:
        return Store(run, ring, writer, writer, path, 0)
    step = int(writer.run.resumed_at_step or 0)
    seen = resumed_examples_seen(step, writer.resumed_after, s.resume_examples_seen)
    return Store(writer.run, ring, writer, writer, path, step, seen)
