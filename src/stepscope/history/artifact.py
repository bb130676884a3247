"""The crash-safe writer of ``stepscope.history.v1`` artifacts.

The directory's layout and ``index.json`` are described in :mod:`stepscope.history.segment`.

A commit writes each chunk to a temporary file, fsyncs it, renames it, fsyncs ``chunks/``, then
appends one checksummed line to the segment's index log and fsyncs it. The commit costs the same
at step 10 and at step 10 million: nothing growing is rewritten. A chunk is visible only once its
line is durable, so a kill loses at most the steps written since the last commit
(``commit_steps`` steps or ``commit_seconds`` seconds, whichever comes first).

A commit that fails on the disk (``ENOSPC``, a read-only remount, ``EIO``) raises nothing into
the caller: the rows stay pending in RAM and the commit is retried ``commit_steps`` steps later;
the first failure warns once with the code ``history_disk_fault``. Past ``max_pending_steps``
pending steps the oldest steps' payloads are dropped and their cells kept as
``budget_dropped`` rows disclosed ``disk_fault`` (step blocks are never dropped). ``close()``
returns a :class:`CloseReport` that says what stayed uncommitted instead of raising.

Example
-------
>>> import tempfile, numpy as np
>>> import stepscope as ss
>>> from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
>>> from stepscope.stats import SPINE_WIDTH
>>> path = tempfile.mkdtemp() + "/run"
>>> with HistoryWriter(path, commit_steps=2) as w:
...     fc = w.register_site("fc", "torch.nn.Linear", "f32[4,3]")
...     for step in range(3):
...         spine = np.zeros((1, SPINE_WIDTH)); spine[0, :2] = 12
...         _ = w.write_step(StepBlockRecord(step), [ObservationBatch.observed("activation", "forward", [fc], spine)])
>>> ss.open_run(path).steps.tolist()
[0, 1, 2]
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.batch import ObservationBatch, batches_from_records
from stepscope.history.files import append_log_row, fsync_dir, read_log
from stepscope.history.inputs import check_real, check_step, check_text
from stepscope.history.layout import encode_batch, histogram_dtype, observation_dtype
from stepscope.history.pending import (
    CloseReport,
    PendingRows,
    check_commit_policy,
    check_unique,
    write_chunk,
)
from stepscope.history.runrecord import RunRecord
from stepscope.history.schema import ObservationRecord, StepBlockRecord
from stepscope.history.segment import (
    committed_artifact,
    lock_writer,
    make_run_dir,
    read_resume,
    seal_extents,
    write_catalog,
    write_index,
    write_manifest,
)
from stepscope.history.sitetable import SiteTable
from stepscope.stats import HistogramDescriptor
from stepscope.stats.layout import SPINE_WIDTH

__all__ = ["HistoryWriter"]


class HistoryWriter(SiteTable):
    """Append step blocks, observations and scalars to an artifact directory.

    Parameters
    ----------
    path
        The run directory. Must not hold an artifact unless ``resume=True``.
    run
        The run record of a fresh run (default: :meth:`RunRecord.new`).
    resume
        Open an existing artifact and append a new segment whose record names its parent. A
        directory with no committed artifact (empty, or a creation killed before
        ``index.json``) starts a fresh run, with ``resumed_after=None``, the same way with or
        without ``resume``. The lock is taken before the directory is examined.
    resume_at_step
        The step training resumes from (default: one past the last committed step); a
        checkpoint's step before it supersedes the ancestors' steps from there on.
        With ``resume=True``, ``run`` (optional) is the new segment's own record: its model
        fingerprint and histogram descriptor must equal the artifact's (else
        ``resume_fingerprint_mismatch`` / ``resume_descriptor_mismatch``), and its fingerprint,
        cadences, device and ``extra`` are recorded for the new segment. ``resumed_after`` is
        the last committed step block before the resume step (``None``: none).
    commit_steps, commit_seconds
        Commit when this many steps are pending or this much time passed since the last commit.
    durable
        ``fsync`` files and directories (turn off only for throwaway benchmarks).
    ring
        An optional :class:`~stepscope.history.ring.StepRing` kept as a RAM cache of recent blocks.
    max_pending_steps
        Steps kept pending in RAM while commits fail on the disk before the oldest steps' payloads
        are dropped (default: the ring's capacity, else 256; at least ``commit_steps``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        run: RunRecord | None = None,
        *,
        resume: bool = False,
        resume_at_step: int | None = None,
        commit_steps: int = 32,
        commit_seconds: float | None = 10.0,
        durable: bool = True,
        ring: Any = None,
        max_pending_steps: int | None = None,
    ) -> None:
        check_commit_policy(commit_steps, commit_seconds, max_pending_steps)
        self.path = Path(path)
        self.commit_steps, self.commit_seconds = commit_steps, commit_seconds
        self.durable, self.ring = durable, ring
        capacity = getattr(ring, "capacity", None)
        self.max_pending_steps = max(
            commit_steps,
            max_pending_steps or (capacity if isinstance(capacity, int) else 256),
        )
        self.faults: list[Refusal] = []  # every failed commit, oldest first
        self.dropped_steps = 0  # steps whose payload was dropped while the disk failed
        self._due_at = commit_steps
        self._closed = False
        super().__init__()  # the site table: sites, scalar names, disclosure sets
        self.commits = 0
        self._sealed_catalog: str | None = None  # set by close(): the final catalog's sha256
        self._catalog_sha = ""
        self.committed_step: int | None = None  # the last step durable on disk (effective view)
        self._lock_fd: int | None = None
        #: the last committed block before the resume step (``None``: none, or a fresh run)
        self.resumed_after: StepBlockRecord | None = None
        make_run_dir(self.path)
        # the lock first, then the existence check: a second writer that saw an empty directory
        # must not re-create a run that another writer created and closed in the meantime
        self._lock()
        try:
            if committed_artifact(self.path):
                if not resume:
                    raise Refusal(
                        "history_run_exists",
                        f"{self.path} already holds a stepscope artifact.",
                        ["pass resume=True to append a segment", "choose a new output directory"],
                    )
                self._open_resume(resume_at_step, run)
            else:  # empty, or a creation killed before index.json: nothing was ever committed
                self._open_fresh(run or RunRecord.new())
        except BaseException as exc:
            self._unlock()  # a refused open must not keep the artifact locked
            if isinstance(exc, OSError) and not isinstance(exc, Refusal):  # full / read-only disk
                raise Refusal(
                    "history_output_unwritable",
                    f"the run directory {self.path} cannot be written ({exc.strerror or exc}).",
                    ["free disk space or remount the output read-write", "or pick another path"],
                ) from None
            raise
        self._reset_pending()
        self._last_commit = time.monotonic()

    # -- setup -------------------------------------------------------------------------------
    def _lock(self) -> None:
        """Hold an exclusive advisory lock for the writer's life (released by the OS on a kill)."""
        self._lock_fd = lock_writer(self.path)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _open_fresh(self, run: RunRecord) -> None:
        (self.path / "chunks").mkdir(parents=True, exist_ok=True)
        (self.path / "index").mkdir(exist_ok=True)
        if not run.histogram_descriptor:  # a hand-built record: the default grid, recorded
            run = replace(run, histogram_descriptor=HistogramDescriptor().to_dict())
        self.run = run
        self.segments = [run]
        self.descriptor = HistogramDescriptor.from_dict(dict(run.histogram_descriptor))
        self._logs: list[str] = []
        self._sealed: dict[str, dict[str, int]] = {}
        self._write_catalog()
        self._start_segment()

    def _open_resume(self, at_step: int | None, run: RunRecord | None) -> None:
        r = read_resume(self.path, at_step, run)
        self.run, self.segments, self.descriptor = r.run, r.segments, r.descriptor
        self.resumed_after = r.resumed_after
        self._logs, self._sealed, self._catalog_sha = r.logs, r.sealed, r.catalog_sha
        self.sites, self.scalar_names, self.disclosures = r.sites, r.scalar_names, r.disclosures
        self._active = {s.name: s.site_id for s in self.sites if s.ended_step is None}
        self._last_step = r.at_step - 1
        self.committed_step = r.committed_step
        self._start_segment()

    def _start_segment(self) -> None:
        log = f"{self.run.segment_id}.log"
        self._log_path = self.path / "index" / log
        read_log(self._log_path, missing_ok=True)  # a link or a non-file refuses here
        self._log_path.touch()
        self._logs.append(log)
        self._seq = 0
        # manifest before index.json: every log that index.json names has a segment record
        write_manifest(self.path, self.descriptor.to_dict(), self.segments, self.durable)
        self._write_index()
        self._obs_dtype = observation_dtype(SPINE_WIDTH)
        self._hist_dtype = histogram_dtype(self.descriptor.width)

    def _write_index(self) -> None:
        write_index(self.path, self._logs, self._sealed, self._sealed_catalog, self.durable)

    def _seal(self) -> None:
        """Record the final extent of this segment's log and of ``evals.log`` in ``index.json``."""
        self._sealed = seal_extents(self.path, self._sealed, self._log_path)
        self._sealed_catalog = self._catalog_sha
        self._write_index()

    def _write_catalog(self) -> None:
        self._catalog_sha = write_catalog(
            self.path, self.sites, self.scalar_names, self.disclosures, self.durable
        )
        self._catalog_dirty = False

    def _reset_pending(self) -> None:
        self._pending = PendingRows()

    # -- writing ---------------------------------------------------------------------------
    def write_step(
        self,
        block: StepBlockRecord,
        batches: Sequence[ObservationBatch] = (),
        observations: Iterable[ObservationRecord] = (),
        scalars: dict[str, float] | None = None,
        *,
        trusted: bool = False,
    ) -> bool:
        """Append one step block with its observations; returns True if this call committed.

        ``batches`` is the hot path (columnar, no per-element Python); ``observations`` takes
        per-observation records for convenience. ``scalars`` adds user scalar rows.
        ``trusted``: the batches come from a producer that registered every site id it writes
        with this writer and gives each stream at most one batch of distinct sites (the
        collector's step boundary), so the per-step site-range and repeated-cell checks are
        skipped; everything else is written exactly as without it.
        """
        self._check_open()
        if not isinstance(block, StepBlockRecord):
            raise Refusal(
                "history_write_invalid",
                f"write_step was given {type(block).__name__}, not a StepBlockRecord.",
                ["pass StepBlockRecord(step) as the first argument"],
            )
        scalar_rows = [
            (check_text(name, "scalar name"), check_real(value, f"scalar {name!r}"))
            for name, value in (scalars or {}).items()
        ]
        step = block.optimizer_step
        if self._last_step is not None and step <= self._last_step:
            raise Refusal(
                "history_step_out_of_order",
                f"step {step} written after step {self._last_step}.",
                ["write each optimizer step once, in increasing order"],
            )
        all_batches = list(batches)
        recs = list(observations)
        if recs:  # records are user input: checked like any batch
            for r in recs:
                if r.step != step:
                    raise Refusal(
                        "history_step_out_of_order", f"record of step {r.step} in {step}."
                    )
            all_batches += batches_from_records(recs)
            trusted = False
        encoded = [self._encode(step, b, trusted) for b in all_batches]
        if not trusted:
            check_unique(encoded)
        pending = self._pending
        pending.steps.append(block)
        for b, (obs, hist) in zip(all_batches, encoded):
            pending.add(b.stream.value, obs, hist)
        for name, value in scalar_rows:
            pending.scalars.append((step, self._intern(self.scalar_names, name), value))
        self._last_step = step
        if self.ring is not None:
            self.ring.push(block, all_batches)
        return self._maybe_commit()

    def write_scalar(self, name: str, step: int, value: float) -> None:
        """Add one user scalar row (e.g. a loss) at ``step``; committed with the next commit."""
        self._check_open()
        name = check_text(name, "scalar name")
        row = (check_step(step, "write_scalar step"), check_real(value, f"scalar {name!r}"))
        self._pending.scalars.append((row[0], self._intern(self.scalar_names, name), row[1]))

    def _encode(
        self, step: int, b: ObservationBatch, trusted: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if (
            not trusted
            and b.n_rows
            and (b.site_ids.min() < 0 or b.site_ids.max() >= len(self.sites))
        ):
            raise Refusal(
                "history_series_unknown",
                f"{b.stream.value} batch names site ids outside 0..{len(self.sites) - 1}.",
                ["register every site with register_site() first"],
            )
        discl: int | np.ndarray = (
            self._intern(self.disclosures, b.disclosures) if b.disclosures else -1
        )
        rows = b.row_disclosures
        distinct = set() if rows is None else set(rows)
        if rows is not None and not b.disclosures and all(len(set(d)) == len(d) for d in distinct):
            # a row's disclosures are its own (no batch-wide ones, no repeats): row_disclosure(i)
            # is rows[i], so the sets are interned in the same order without the per-row calls
            ids = {d: self._intern(self.disclosures, d) if d else -1 for d in distinct}
            discl = np.array([ids[d] for d in rows], np.int32)
        elif rows is not None:  # few distinct sets: intern each once
            ids = {
                d: self._intern(self.disclosures, d) if d else -1
                for d in set(map(b.row_disclosure, range(b.n_rows)))
            }
            discl = np.array([ids[b.row_disclosure(i)] for i in range(b.n_rows)], np.int32)
        return encode_batch(step, b, discl, self._obs_dtype, self._hist_dtype)

    def _maybe_commit(self) -> bool:
        due = len(self._pending.steps) >= self._due_at
        if not due and self.faults and self._due_at > self.commit_steps:
            return False  # after a failed commit: retry after commit_steps more steps
        if not due and self.commit_seconds is not None:
            due = time.monotonic() - self._last_commit >= self.commit_seconds
        return due and self.commit() is not None

    def commit(self) -> dict[str, Any] | None:
        """Make everything pending durable and visible; returns the index row (or None).

        A disk failure (``OSError``) returns None and keeps the rows pending (see the module
        docstring); :attr:`faults` lists every failure.
        """
        self._check_open()
        if not self._pending:
            return None
        try:
            row = self._commit_pending()
        except Refusal:  # a refusal (even an OSError-like one) is not a disk fault to retry
            raise
        except OSError as exc:
            self._commit_failed(exc)
            return None
        self._due_at = self.commit_steps
        return row

    @property
    def pending_steps(self) -> int:
        """Steps written but not yet committed (more than usual only while the disk fails)."""
        return len(self._pending.steps)

    def _commit_failed(self, exc: OSError) -> None:
        steps = [b.optimizer_step for b in self._pending.steps]
        span = f"steps {min(steps)}..{max(steps)}" if steps else "scalar rows"
        fault = Refusal(
            "history_disk_fault",
            f"commit of {span} to {self.path} failed ({exc.strerror or exc}); "
            f"the rows stay pending in RAM and the commit is retried.",
            ["free disk space or remount the output read-write; training continues"],
        )
        if not self.faults:
            warnings.warn(str(fault), RuntimeWarning, stacklevel=4)
        self.faults.append(fault)
        self._due_at = len(self._pending.steps) + self.commit_steps
        self._last_commit = time.monotonic()
        self._drop_oldest_payloads()

    def _drop_oldest_payloads(self) -> None:
        """Keep at most ``max_pending_steps`` steps' payloads; older cells become disclosed drops."""
        if len(self._pending.steps) <= self.max_pending_steps:
            return
        disc = self._intern(self.disclosures, ("disk_fault",))
        self.dropped_steps += self._pending.drop_oldest_payloads(self.max_pending_steps, disc)

    def _commit_pending(self) -> dict[str, Any]:
        if self._catalog_dirty:  # catalog first: every index row's site ids are cataloged
            self._write_catalog()
        prefix = f"{self.run.segment_id}-{self._seq:07d}"
        chunks = self.path / "chunks"
        pending = self._pending
        files = [write_chunk(chunks, prefix, *t, self.durable) for t in pending.tables()]
        if self.durable:
            fsync_dir(chunks)
        step_lo, step_hi = pending.step_range()
        row = {
            "seq": self._seq,
            "segment": self.run.segment_id,
            "step_lo": step_lo,
            "step_hi": step_hi,
            "n_steps": len(pending.steps),
            "catalog_sha256": self._catalog_sha,
            "files": files,
            "time": time.time(),
        }
        append_log_row(self._log_path, row, durable=self.durable)
        self._seq += 1
        self.commits += 1
        self.committed_step = self._last_step
        self._last_commit = time.monotonic()
        self._reset_pending()
        return row

    # -- lifecycle -------------------------------------------------------------------------
    def _check_open(self) -> None:  # the site table's changes refuse once closed, too
        if self._closed:
            raise Refusal("history_writer_closed", f"the writer of {self.path} is closed.")

    def close(self) -> CloseReport:
        """Commit what is pending, seal the segment and close (idempotent).

        A disk failure is reported, not raised: the returned :class:`CloseReport` says how many
        steps stayed uncommitted (and lists the faults).
        """
        if not self._closed:
            try:
                self.commit()
                if not self._pending:
                    try:
                        if self._catalog_dirty:
                            self._write_catalog()
                        self._seal()
                    except Refusal:
                        raise
                    except OSError as exc:
                        self._commit_failed(exc)
            finally:
                self._closed = True
                self._unlock()
        return CloseReport(
            committed_step=self.committed_step,
            uncommitted_steps=len(self._pending.steps),
            dropped_steps=self.dropped_steps,
            faults=tuple(self.faults),
        )

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
