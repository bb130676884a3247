"""Merging per-rank artifacts of one distributed run (the body of ``merge_ranks``).

Example
-------
>>> import tempfile
>>> from stepscope.history import HistoryWriter, RunRecord
>>> from stepscope.history.reader import HistoryReader
>>> d = Path(tempfile.mkdtemp())
>>> for rank in (0, 1):  # two ranks of one run, one loss each
...     with HistoryWriter(d / f"r{rank}", RunRecord.new(run_id="job", rank=rank, world_size=2)) as w:
...         w.write_scalar("loss", 0, 1.0 + rank)
>>> merged = merge_rank_artifacts([d / "r0", d / "r1"], d / "merged")
>>> HistoryReader(merged).scalars("rank1/loss").values.tolist()  # user scalars keep their rank
[2.0]
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.artifact import HistoryWriter
from stepscope.history.batch import ObservationBatch
from stepscope.history.decode import batches_from_rows
from stepscope.history.merge import merge_step_batches
from stepscope.history.reader import HistoryReader
from stepscope.history.schema import StepBlockRecord, StepTruth

RANK_PARTIAL = "ranks_partial"  # a step block or cell missing on some rank


def _check(readers: list[HistoryReader]) -> None:
    runs = {r.run.run_id for r in readers}
    ranks = [r.run.rank for r in readers]
    if len(runs) != 1:
        raise Refusal(
            "merge_incompatible",
            f"segments belong to different runs {sorted(runs)}.",
            ["merge the rank directories of one run only"],
        )
    if len(set(ranks)) != len(ranks):
        raise Refusal(
            "merge_incompatible", f"rank ids repeat: {ranks}.", ["pass each rank's artifact once"]
        )
    if len({r.descriptor for r in readers}) != 1:
        raise Refusal(
            "sketch_descriptor_mismatch",
            "rank artifacts use different histogram descriptors.",
            ["record every rank with the same HistogramDescriptor"],
        )


def merge_step_blocks(blocks: list[StepBlockRecord], n_ranks: int) -> tuple[StepBlockRecord, bool]:
    """One step's blocks of several ranks as one (``examples_seen`` summed when every rank
    knows it, truth kept when all agree), and whether every rank agreed and was present."""
    first = blocks[0]
    seen = [b.examples_seen for b in blocks]
    examples = sum(seen) if None not in seen and len(blocks) == n_ranks else None  # type: ignore[arg-type]
    truths_agree = all(b.truth == first.truth for b in blocks)
    merged = replace(
        first,
        examples_seen=examples,
        truth=first.truth if truths_agree else StepTruth(),
        wall_time=max((b.wall_time for b in blocks if b.wall_time is not None), default=None),
    )
    return merged, truths_agree and len(blocks) == n_ranks


def merge_rank_artifacts(paths: list[Path], out: Path, *, durable: bool = True) -> Path:
    """See :func:`stepscope.history.merge_ranks`."""
    if not paths:
        raise Refusal("merge_incompatible", "no rank artifacts given.", ["pass two or more runs"])
    readers = sorted((HistoryReader(p) for p in paths), key=lambda r: r.run.rank)
    _check(readers)
    base = readers[0].run
    extra = dict(base.extra)
    extra["merged_ranks"] = [
        {"rank": r.run.rank, "segment_id": r.segments[-1].segment_id, "path": str(r.path)}
        for r in readers
    ]
    run = replace(base.resumed(0), parent_segment=None, resumed_at_step=None, extra=extra)
    with HistoryWriter(out, run, durable=durable, commit_steps=64) as w:
        remaps: list[np.ndarray] = []
        by_structure: dict[tuple[str, str, str, int | None], int] = {}
        for r in readers:  # sites match by structure, never by name alone
            structures = [(*s.structure, s.started_step) for s in r.sites]
            for s, structure in zip(r.sites, structures):
                if structure not in by_structure:
                    by_structure[structure] = w.add_site_record(s)
            remaps.append(np.array([by_structure[st] for st in structures], dtype=np.int32))
        per_rank: list[dict[int, list[ObservationBatch]]] = []
        blocks: dict[int, list[StepBlockRecord]] = {}
        scalars: dict[int, dict[str, float]] = {}
        for r, remap in zip(readers, remaps):
            obs, hist = r.table("observations"), r.table("histograms")
            obs["site"], hist["site"] = remap[obs["site"]], remap[hist["site"]]
            per_rank.append(batches_from_rows(obs, hist, r.disclosures))
            for b in r.step_blocks():
                blocks.setdefault(b.optimizer_step, []).append(b)
            sc = r.table("scalars")
            for step, name, value in zip(sc["step"], sc["name"], sc["value"]):
                key = f"rank{r.run.rank}/{r.scalar_names[name]}"
                scalars.setdefault(int(step), {})[key] = float(value)
        disagreements = 0
        for step in sorted(blocks):
            block, complete = merge_step_blocks(blocks[step], len(readers))
            disagreements += not complete
            merged = merge_step_batches([pr.get(step, []) for pr in per_rank])
            if not complete:
                merged = [replace(b, disclosures=(*b.disclosures, RANK_PARTIAL)) for b in merged]
            w.write_step(block, merged, scalars=scalars.pop(step, None))
        for step, values in sorted(scalars.items()):  # scalars at steps without a block
            for name, value in values.items():
                w.write_scalar(name, step, value)
    if disagreements:
        warnings.warn(
            f"{disagreements} step(s) differed or were missing across ranks; their cells carry "
            f"the disclosure {RANK_PARTIAL!r}.",
            stacklevel=3,
        )
    return out
