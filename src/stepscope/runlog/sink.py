"""The one door for writing a step: a :class:`StepSink` on disk or in RAM.

Every producer of step records (the collector's step boundary, :class:`~stepscope.RunLog`, the
trainer callbacks through either) writes through one :class:`StepSink` interface:
``write_step(block, batches, scalars)``, ``write_scalar``, ``write_eval`` and ``close``.
:class:`DiskSink` forwards blocks and scalars to the
:class:`~stepscope.history.HistoryWriter` (committed with its chunks) and appends each evaluation
as one checksummed, fsynced line to ``RUN/evals.log`` (the index-log format: a torn final line is
ignored, a complete line failing its sha256 refuses ``history_artifact_corrupt``). Every line names
its segment, so a resumed segment supersedes its ancestors' evaluations from its resume step on.
:class:`MemorySink` keeps everything in RAM (a collector's observation batches in its
:class:`~stepscope.history.StepRing`) and also has the read side (``step_blocks``,
``scalar_rows``, ``eval_records``).
:func:`write_summary` keeps ``runlog.json`` (clock kinds and totals) beside an artifact; it is a
convenience for reports, the per-step ``clock/*`` rows are authoritative.

Example
-------
>>> from stepscope.history import StepBlockRecord
>>> m = MemorySink()
>>> m.write_step(StepBlockRecord(0, examples_seen=8), scalars={"loss": 2.5})
False
>>> m.write_scalar("lr", 0, 0.1)
>>> rows, names = m.scalar_rows()
>>> [(int(r["step"]), names[r["name"]], float(r["value"])) for r in rows]
[(0, 'loss', 2.5), (0, 'lr', 0.1)]
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history import StepBlockRecord
from stepscope.history.commits import EVAL_LOG
from stepscope.history.files import (
    append_log_row,
    atomic_write_json,
    json_sha256,
    log_extent,
    read_json,
)
from stepscope.history.layout import SCALAR_DTYPE
from stepscope.runlog.evals import EvalRecord

SUMMARY_FILE = "runlog.json"


class StepSink:
    """Where step records go (disk or RAM): the one interface every producer writes through."""

    def write_step(
        self,
        block: StepBlockRecord,
        batches: Sequence[Any] = (),
        scalars: Mapping[str, float] | None = None,
    ) -> bool:
        """Write one step's block, its observation batches and its scalars; ``True`` if this
        call committed them durably (a RAM sink never does)."""
        raise NotImplementedError

    def write_scalar(self, name: str, step: int, value: float) -> None:
        """One scalar row at ``step`` (a row logged for another step, a late clock row)."""
        raise NotImplementedError

    def write_eval(self, rec: EvalRecord) -> None:
        """One evaluation record."""
        raise NotImplementedError

    def close(self, summary: dict[str, Any]) -> Any:
        """Close the sink with the run's clock ``summary``; what was not committed, if anything
        (a :class:`~stepscope.history.artifact.CloseReport` on disk, ``None`` in RAM)."""
        raise NotImplementedError


class DiskSink(StepSink):
    """Step records of an artifact: blocks, batches and scalars via ``writer``, evaluations in a
    log.

    ``trusted``: the producer registered every site it writes with ``writer`` and gives each
    stream at most one batch of distinct sites (the collector's step boundary), so the writer
    skips re-checking them (see :meth:`~stepscope.history.HistoryWriter.write_step`).
    """

    def __init__(self, writer: Any, trusted: bool = False) -> None:
        self.writer, self.trusted = writer, trusted
        self.path = Path(writer.path)
        #: evaluations whose ``evals.log`` line a disk fault kept back (retried at the next one)
        self.unwritten: list[dict[str, Any]] = []
        self._next_n: int | None = None  # rows in evals.log (read once, on first use)
        self._lock = threading.Lock()  # the writer thread appends what the caller queued

    def write_step(
        self,
        block: StepBlockRecord,
        batches: Sequence[Any] = (),
        scalars: Mapping[str, float] | None = None,
    ) -> bool:
        """Forward to :meth:`HistoryWriter.write_step` (a background writer queues the step and
        returns False: its thread commits)."""
        return self.writer.write_step(  # (the writer copies what it keeps)
            block, batches, scalars=scalars, trusted=self.trusted
        )

    def write_scalar(self, name: str, step: int, value: float) -> None:
        """Forward to :meth:`HistoryWriter.write_scalar` (committed with the next commit)."""
        self.writer.write_scalar(name, step, value)

    def write_eval(self, rec: EvalRecord) -> None:
        """Append ``rec`` durably to ``evals.log``: on the writer thread, which takes it at
        once (a background writer: no file work on the caller's thread), else right here.

        A disk fault raises nothing: the line is kept and retried with the next evaluation
        (and by :meth:`flush`); the first fault warns once with ``history_disk_fault`` (on the
        caller's thread, at its next write when the writer thread met it).
        """
        with self._lock:
            self.unwritten.append({"segment": self.writer.run.segment_id, **rec.to_dict()})
        if not self.writer.run_beside(self.flush):
            self.flush()

    def _rows_before(self) -> int:
        if self._next_n is None:
            self._next_n = log_extent(self.path / EVAL_LOG)["rows"]
        return self._next_n

    def flush(self) -> int:
        """Append the kept-back evaluation lines in order; returns how many are still unwritten."""
        with self._lock:
            return self._append_unwritten()

    def _append_unwritten(self) -> int:
        while self.unwritten:
            try:
                row = {**self.unwritten[0], "n": self._rows_before()}  # its position: gaps show
                append_log_row(self.path / EVAL_LOG, row, durable=self.writer.durable)
            except OSError as exc:  # a full disk, or evals.log replaced by a link/directory
                why = exc.message if isinstance(exc, Refusal) else exc.strerror or exc
                fault = Refusal(
                    "history_disk_fault",
                    f"evals.log append failed ({why}); {len(self.unwritten)} "
                    "evaluation line(s) kept in RAM and retried.",
                    ["free disk space or remount the output read-write; training continues"],
                )
                self.writer.note_fault(fault)  # one warning per run, shared with the commits
                break
            self.unwritten.pop(0)
            self._next_n = row["n"] + 1
        return len(self.unwritten)

    def close(self, summary: dict[str, Any]) -> Any:
        """Flush kept-back evaluations, close the writer, write ``runlog.json``; never raises a
        disk fault.

        Returns the writer's :class:`~stepscope.history.artifact.CloseReport`
        (``uncommitted_steps``, ``dropped_steps``, ``behind_steps``, ``faults``), with an
        evaluation line that could not be written counted in ``faults``. ``runlog.json`` is a
        convenience: failing to write it is ignored.
        """
        try:
            self.flush()  # never raises a fault (kept back and counted); the writer closes anyway
        finally:
            report = self.writer.close()
        try:
            write_summary(self.path, summary)
        except Refusal:
            raise
        except OSError:
            pass
        return report


class MemorySink(StepSink):
    """Step blocks, scalar rows and evaluations held in RAM; a collector's observation batches
    go to its ``ring`` (a :class:`~stepscope.history.StepRing`; ``None``: not kept)."""

    def __init__(self, ring: Any = None) -> None:
        self.ring = ring
        self.blocks: list[StepBlockRecord] = []
        self.scalar_names: list[str] = []
        self._name_ids: dict[str, int] = {}
        self._scalars: list[tuple[int, int, float]] = []
        self.evals: list[EvalRecord] = []
        self.summary_data: dict[str, Any] | None = None  # set by the owner (clock totals)

    def _intern(self, name: str) -> int:
        i = self._name_ids.get(name)
        if i is None:
            i = self._name_ids[name] = len(self.scalar_names)
            self.scalar_names.append(name)
        return i

    def write_step(
        self,
        block: StepBlockRecord,
        batches: Sequence[Any] = (),
        scalars: Mapping[str, float] | None = None,
    ) -> bool:
        """Keep a step block and its scalars, and its observation batches in the ring."""
        if self.ring is not None:
            self.ring.push(block, list(batches))
        if self.blocks and block.optimizer_step <= self.blocks[-1].optimizer_step:
            raise Refusal(
                "history_step_out_of_order",
                f"step {block.optimizer_step} after step {self.blocks[-1].optimizer_step}.",
                ["write each optimizer step once, in increasing order"],
            )
        self.blocks.append(block)
        for name, value in (scalars or {}).items():
            self._scalars.append((block.optimizer_step, self._intern(name), float(value)))
        return False

    def write_scalar(self, name: str, step: int, value: float) -> None:
        """One scalar row at ``step``."""
        self._scalars.append((int(step), self._intern(name), float(value)))

    def write_eval(self, rec: EvalRecord) -> None:
        """Keep one evaluation."""
        self.evals.append(rec)

    # -- read side (same shapes as the reader's) ------------------------------------------
    def step_blocks(self) -> list[StepBlockRecord]:
        """Step blocks in step order."""
        return list(self.blocks)

    def scalar_rows(self) -> tuple[np.ndarray, list[str]]:
        """All scalar rows (``SCALAR_DTYPE``) and the name table."""
        return np.array(self._scalars, dtype=SCALAR_DTYPE), list(self.scalar_names)

    def eval_records(self) -> list[EvalRecord]:
        """Every evaluation, in logging order."""
        return list(self.evals)

    def summary(self) -> dict[str, Any] | None:
        """The owner's clock summary (RAM runs keep no ``runlog.json``)."""
        return self.summary_data

    def close(self, summary: dict[str, Any]) -> None:
        """Keep the final clock ``summary``; nothing is left uncommitted in RAM."""
        self.summary_data = summary


def write_summary(directory: str | os.PathLike[str] | None, summary: dict[str, Any]) -> None:
    """Atomically (re)write ``runlog.json`` in an artifact directory (no-op without one).

    The file carries its own ``sha256`` (of the canonical JSON of the other keys), checked by
    :func:`read_summary` and by ``open_run(path).verify()``.
    """
    if directory is None:
        return

    body = {k: v for k, v in summary.items() if k != "sha256"}
    atomic_write_json(Path(directory) / SUMMARY_FILE, {**body, "sha256": json_sha256(body)})


def read_summary(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``runlog.json`` of an artifact, or ``None`` when the run never wrote one.

    Read through the artifact's safe reader (a regular file, bounded, no link followed) and
    checked against its ``sha256``: an edited, truncated or unsigned summary refuses
    ``history_artifact_corrupt`` (its numbers feed the report's overhead table and ``clocks()``).
    """
    path = Path(directory) / SUMMARY_FILE
    if not os.path.lexists(path):
        return None

    summary = read_json(path, "run-log summary", max_bytes=1 << 20)
    claimed = summary.pop("sha256", None)
    if claimed != json_sha256(summary):
        raise Refusal(
            "history_artifact_corrupt",
            f"{path} fails its sha256 (edited, damaged, or written before summaries were signed).",
            ["delete runlog.json (the per-step clock/* rows are authoritative)"],
        )
    return summary


def read_eval_log(reader: Any) -> list[EvalRecord]:
    """Evaluations of an artifact (``reader`` a ``HistoryReader``), superseded rows dropped.

    The reader checks each row (sha256, seal, position: ``HistoryReader.eval_rows``); this
    decodes its values (``history_json_invalid`` for values no evaluation can hold).
    """
    cutoff = _cutoffs(reader.segments)
    out = []
    for row in reader.eval_rows():
        rec = EvalRecord.from_dict(row)
        if rec.optimizer_step < cutoff.get(str(row.get("segment")), np.iinfo(np.int64).max):
            out.append(rec)
    return out


def _cutoffs(segments: list) -> dict[str, int]:
    """First superseded step of each segment: a resume supersedes its ancestors from its step."""
    parents = {s.segment_id: s.parent_segment for s in segments}
    out: dict[str, int] = {}
    for s in segments:
        if s.resumed_at_step is None:
            continue
        ancestor, seen = s.parent_segment, {s.segment_id}
        while ancestor in parents and ancestor not in seen:
            seen.add(ancestor)
            out[ancestor] = min(out.get(ancestor, s.resumed_at_step), s.resumed_at_step)
            ancestor = parents[ancestor]
    return out
