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

Background writer (``background=True``; the collector's default): ``write_step`` only checks
its input, interns disclosure sets and scalar names (the site table is guarded by a lock) and
hands the step to a queue; a daemon thread, ``stepscope-writer``, encodes the queued steps and
makes the group commit when it is due (the same ``commit_steps`` / ``commit_seconds`` rule, the
time rule also while training is idle), so no file is written or fsynced on the training
thread. The step rule commits at the same steps as without the thread, however many steps the
thread takes from the queue at once: the chunks, and the order in which the reader returns
rows, do not depend on thread scheduling (only the time rule does, as without the thread).
The durability window is the same: a kill loses at most the ``commit_steps`` steps /
``commit_seconds`` seconds not yet committed, plus the steps still queued for the thread.
``committed_step`` and ``commits`` change only once a commit is durable. At most
``max_queued_steps`` steps wait for the thread: a step written while the queue is full is not
waited for either; its block and scalars are kept and its cells become ``budget_dropped`` rows
disclosed ``writer_behind`` (counted in :attr:`CloseReport.behind_steps`). A disk fault on the
thread is handled as above; its one warning is raised on the caller's thread by the next
``write_step`` / ``commit`` / ``close``. ``commit()`` waits for the queue and commits
everything written so far; ``close()`` flushes and joins the thread; at interpreter exit an
``atexit`` hook closes background writers still open.

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

import atexit
import copy
import os
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.batch import ObservationBatch, batches_from_records
from stepscope.history.files import append_log_row, fsync_dir, read_log
from stepscope.history.inputs import check_real, check_step, check_text
from stepscope.history.layout import (
    check_histogram_width,
    encode_batch,
    histogram_dtype,
    observation_dtype,
)
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

WRITER_THREAD = "stepscope-writer"
#: queued calls that wake the writer thread (at most; fewer with a smaller ``commit_steps``)
WAKE_STEPS = 64
#: background writers still open in this process, closed at interpreter exit
_OPEN: weakref.WeakSet[HistoryWriter] = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:
    """Close (flush) every background writer this process left open (``atexit``)."""
    for w in list(_OPEN):
        if w._pid == os.getpid():  # a forked child does not own its parent's writers
            try:
                w.close()
            except Exception:  # exiting: a refusal has nowhere to go
                pass


@dataclass
class _Queued:
    """One ``write_step`` / ``write_scalar`` call, checked and interned, not yet encoded."""

    block: StepBlockRecord | None
    batches: list[tuple[ObservationBatch, int | np.ndarray]]  # with their disclosure ids
    scalars: list[tuple[int, int, float]]
    last_step: int | None  # the writer's last step after this call (committed_step if durable)
    behind: int | None = None  # the writer_behind disclosure id: no room, payload not kept
    task: Callable[[], Any] | None = None  # file work beside the artifact (run_beside)


def _payload_free(b: ObservationBatch) -> ObservationBatch:
    """``b``'s keys without its spines and histograms (a step the queue had no room for)."""
    out = copy.copy(b)
    nan = np.broadcast_to(np.float64(np.nan), b.spines.shape)  # no memory per row
    for name, value in (("spines", nan), ("hist_rows", None), ("histograms", None)):
        object.__setattr__(out, name, value)
    return out


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
    background
        Encode and commit on a daemon thread (``stepscope-writer``) instead of the caller's
        thread (see the module docstring). ``False`` (default): everything happens inside
        ``write_step`` / ``commit``, as documented there. The batches handed to ``write_step``
        must not be changed afterwards (the thread encodes them later).
    max_queued_steps
        With ``background=True``: steps that may wait for the thread (default: the larger of
        ``max_pending_steps`` and 256). A step written while that many wait is kept without
        its payload: its cells become ``budget_dropped`` rows disclosed ``writer_behind``.

    Examples
    --------
    >>> import tempfile, numpy as np
    >>> import stepscope as ss
    >>> from stepscope.history import ObservationBatch, StepBlockRecord
    >>> from stepscope.stats import SPINE_WIDTH
    >>> path = tempfile.mkdtemp() + "/run"
    >>> w = HistoryWriter(path, commit_steps=2, background=True)
    >>> fc = w.register_site("fc", "torch.nn.Linear", "f32[4,3]")
    >>> spine = np.zeros((1, SPINE_WIDTH)); spine[0, :2] = 12
    >>> for step in range(3):
    ...     _ = w.write_step(StepBlockRecord(step), [ObservationBatch.observed("activation", "forward", [fc], spine)])
    >>> w.commit()["step_hi"], w.committed_step  # waits for the thread, commits what is left
    (2, 2)
    >>> w.close().ok, ss.open_run(path).steps.tolist()
    (True, [0, 1, 2])
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
        background: bool = False,
        max_queued_steps: int | None = None,
    ) -> None:
        check_commit_policy(commit_steps, commit_seconds, max_pending_steps, max_queued_steps)
        if not isinstance(background, bool):
            raise Refusal(
                "settings_invalid",
                f"background must be a bool, not {type(background).__name__}.",
                ["pass background=True or background=False"],
            )
        self.path = Path(path)
        self.commit_steps, self.commit_seconds = commit_steps, commit_seconds
        self.durable, self.ring = durable, ring
        #: called with ``committed_step`` once each commit is durable, on the thread that
        #: committed (the writer thread with ``background=True``); must not raise
        self.on_commit: list[Callable[[int | None], None]] = []
        capacity = getattr(ring, "capacity", None)
        self.max_pending_steps = max(
            commit_steps,
            max_pending_steps or (capacity if isinstance(capacity, int) else 256),
        )
        self.background = background
        self.max_queued_steps = max_queued_steps or max(self.max_pending_steps, 256)
        self.faults: list[Refusal] = []  # every failed commit, oldest first
        self.dropped_steps = 0  # steps whose payload was dropped while the disk failed
        self.behind_steps = 0  # steps whose payload the full queue could not take
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
        self._scalar_ids: dict[str, int] = {}  # scalar name -> id, once interned
        self._pending_last = self._last_step  # committed_step once the pending rows are durable
        self._written = self._committed = 0  # steps written / committed by this writer
        self._last_commit = time.monotonic()
        self._fault_lock = threading.Lock()
        self._unwarned: list[Refusal] = []  # faults to warn about on the caller's thread
        self._thread_error: BaseException | None = None  # raised on the writer thread, unreported
        self._thread: threading.Thread | None = None
        if background:
            self._start_thread()

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
        snapshot = self.catalog_snapshot()  # on the writer thread while sites are registered
        try:
            self._catalog_sha = write_catalog(self.path, *snapshot, self.durable)
        except BaseException:
            self._dirty()  # written again before the next index row
            raise

    def _reset_pending(self) -> None:
        self._pending = PendingRows()

    # -- writing (the caller's thread) --------------------------------------------------------
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
        skipped; everything else is written exactly as without it. With ``background=True``
        the step is queued (the thread commits it): the return value is always False.
        """
        if trusted and not batches and not observations and self._thread is not None:
            bare = self._write_bare(block, scalars)  # a step with no rows (nine in ten)
            if bare:
                return False
        self._check_open()
        self._report_thread()
        if not isinstance(block, StepBlockRecord):
            raise Refusal(
                "history_write_invalid",
                f"write_step was given {type(block).__name__}, not a StepBlockRecord.",
                ["pass StepBlockRecord(step) as the first argument"],
            )
        scalar_rows = self._check_scalars(scalars) if scalars else []
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
        # no room in the queue: the step is kept without its payload (never waited for)
        behind = self._thread is not None and self._queued_full >= self.max_queued_steps
        discl = [self._prepare(b, trusted, intern=not behind) for b in all_batches]
        if not trusted:
            check_unique(all_batches)
        item = _Queued(
            block,
            list(zip(all_batches, discl)),
            [(step, self._scalar_id(n) if i is None else i, v) for n, i, v in scalar_rows],
            step,
        )
        if behind:
            item.behind = self._intern(self.disclosures, ("writer_behind",))
            item.batches = [(_payload_free(b), -1) for b in all_batches]
            self.behind_steps += 1
        self._last_step = step
        self._written += 1
        self._hand(item)
        if self.ring is not None:
            self.ring.push(block, all_batches)
        return self._thread is None and self._maybe_commit()

    def _write_bare(self, block: StepBlockRecord, scalars: dict[str, float] | None) -> bool:
        """Queue a trusted producer's step without rows whose scalar names were all written
        before (a quiet step's clocks and losses): what :meth:`write_step` does for it, in
        one call. Returns False, having done nothing, where the checked path must take it (a
        new or non-float scalar, a step out of order, a fault to report, a closed writer)."""
        step = block.optimizer_step
        last = self._last_step
        if (
            self._closed
            or self._unwarned
            or self._thread_error
            or (last is not None and step <= last)
            or block.__class__ is not StepBlockRecord
        ):
            return False
        ids, rows = self._scalar_ids, []
        if scalars:
            for name, value in scalars.items():
                i = ids.get(name)
                if i is None or value.__class__ is not float:
                    return False
                rows.append((step, i, value))
        item = _Queued(block, [], rows, step)
        if self._queued_full >= self.max_queued_steps:  # no room: disclosed like any step
            item.behind = self._intern(self.disclosures, ("writer_behind",))
            self.behind_steps += 1
        self._last_step = step
        self._written += 1
        self._enqueue(item)
        if self.ring is not None:
            self.ring.push(block, ())
        return True

    def _check_scalars(self, scalars: dict[str, float]) -> list[tuple[str, int | None, float]]:
        """``(name, id or None, value)`` of each scalar, checked (before anything is interned: a
        refused step leaves no trace); a name written before is not checked again."""
        ids, out = self._scalar_ids, []
        for name, value in scalars.items():
            i = ids.get(name)
            if i is None:
                check_text(name, "scalar name")
            if value.__class__ is not float:
                value = check_real(value, f"scalar {name!r}")
            out.append((name, i, value))
        return out

    def _scalar_id(self, name: str) -> int:
        """The id of scalar ``name`` (interned on first use, then looked up in a dict)."""
        i = self._scalar_ids.get(name)
        if i is None:
            i = self._scalar_ids[name] = self._intern(self.scalar_names, name)
        return i

    def write_scalar(self, name: str, step: int, value: float) -> None:
        """Add one user scalar row (e.g. a loss) at ``step``; committed with the next commit."""
        self._check_open()
        name = check_text(name, "scalar name")
        row = (check_step(step, "write_scalar step"), check_real(value, f"scalar {name!r}"))
        scalar = (row[0], self._scalar_id(name), row[1])
        self._hand(_Queued(None, [], [scalar], self._last_step))

    def run_beside(self, task: Callable[[], Any], *, urgent: bool = True) -> bool:
        """Run ``task`` (file work beside the artifact, such as an ``evals.log`` append) on the
        writer thread, after every step written before it; the thread takes it at once
        (``urgent=False``: with the next steps it takes, for work that comes at every step).

        Returns ``False`` without running it where there is no writer thread (the caller runs
        it itself). ``task`` must not raise: a disk fault is recorded with
        :meth:`note_fault` (warned about on the caller's thread); anything else it raises is
        raised by the caller's next call, like the thread's own errors. :meth:`commit` and
        :meth:`close` wait for it.
        """
        self._check_open()
        if self._thread is None:
            return False
        with self._cond:
            self._queue.append(_Queued(None, [], [], self._last_step, task=task))
            if urgent:
                self._urgent = True
                self._cond.notify()
        return True

    def _hand(self, item: _Queued) -> None:
        """To the writer thread's queue, or (``background=False``) encoded at once."""
        if self._thread is not None:
            self._enqueue(item)
        else:
            self._absorb(item)

    def _prepare(
        self, b: ObservationBatch, trusted: bool = False, intern: bool = True
    ) -> int | np.ndarray:
        """Check ``b`` against the run (site ids, histogram width) and intern its disclosure
        sets; returns the disclosure id(s) its rows are encoded with."""
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
        check_histogram_width(b, self._hist_dtype)
        if not intern:
            return -1
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
        return discl

    def _encode(
        self, step: int, b: ObservationBatch, trusted: bool = False
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``b`` checked, interned and encoded as the rows of ``step``."""
        return encode_batch(step, b, self._prepare(b, trusted), self._obs_dtype, self._hist_dtype)

    # -- encoding and committing (the writer thread with background=True) ---------------------
    def _absorb(self, item: _Queued) -> None:
        """Encode one queued call into the pending rows."""
        pending = self._pending
        if item.block is not None:
            step = item.block.optimizer_step
            pending.steps.append(item.block)
            for b, discl in item.batches:
                obs, hist = encode_batch(step, b, discl, self._obs_dtype, self._hist_dtype)
                if item.behind is None:
                    pending.add(b.stream.value, obs, hist)
                else:
                    pending.add_dropped(b.stream.value, obs, step, item.behind)
        pending.scalars.extend(item.scalars)
        self._pending_last = item.last_step
        if item.task is not None:
            item.task()

    def _due_by_steps(self) -> bool:
        return len(self._pending.steps) >= self._due_at

    def _due(self) -> bool:
        due = self._due_by_steps()
        if not due and self.faults and self._due_at > self.commit_steps:
            return False  # after a failed commit: retry after commit_steps more steps
        if not due and self.commit_seconds is not None and self._pending:
            due = time.monotonic() - self._last_commit >= self.commit_seconds
        return due

    def _maybe_commit(self) -> bool:
        return self._due() and self.commit() is not None

    def commit(self) -> dict[str, Any] | None:
        """Make everything pending durable and visible; returns the index row (or None).

        A disk failure (``OSError``) returns None and keeps the rows pending (see the module
        docstring); :attr:`faults` lists every failure. With ``background=True`` this waits
        for the writer thread to take and commit every step written so far.
        """
        self._check_open()
        row = self._commit_now() if self._thread is None else self._flush()
        self._report_thread()
        return row

    def _commit_now(self) -> dict[str, Any] | None:
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
        """Steps written but not yet committed (more than usual only while the disk fails, and
        with ``background=True`` the steps still queued)."""
        return self._written - self._committed

    def _commit_failed(self, exc: OSError) -> None:
        steps = [b.optimizer_step for b in self._pending.steps]
        span = f"steps {min(steps)}..{max(steps)}" if steps else "scalar rows"
        self._fault(
            Refusal(
                "history_disk_fault",
                f"commit of {span} to {self.path} failed ({exc.strerror or exc}); "
                f"the rows stay pending in RAM and the commit is retried.",
                ["free disk space or remount the output read-write; training continues"],
            )
        )
        self._due_at = len(self._pending.steps) + self.commit_steps
        self._last_commit = time.monotonic()
        self._drop_oldest_payloads()

    def _fault(self, fault: Refusal) -> None:
        """Record a disk fault (on any thread); the first of the run is warned about once, on
        the caller's thread (:meth:`_report_thread`)."""
        with self._fault_lock:
            if not self.faults:
                self._unwarned.append(fault)
            self.faults.append(fault)

    def note_fault(self, fault: Refusal) -> None:
        """Record a disk fault met beside this writer (e.g. an ``evals.log`` append): the run's
        first fault warns once with its code, whichever thread or file met it.

        >>> import tempfile, warnings
        >>> w = HistoryWriter(tempfile.mkdtemp() + "/run")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     w.note_fault(Refusal("history_disk_fault", "evals.log append failed"))
        ...     w.note_fault(Refusal("history_disk_fault", "evals.log append failed again"))
        >>> len(caught), len(w.faults)
        (1, 2)
        >>> w.close().faults == tuple(w.faults)
        True
        """
        self._fault(fault)
        if threading.current_thread() is not self._thread:  # (the thread's own: reported later)
            self._report_thread()

    def _report_thread(self) -> None:
        """On the caller's thread: warn about a new fault, raise what the writer thread raised."""
        if not (self._unwarned or self._thread_error):
            return
        with self._fault_lock:
            unwarned, self._unwarned = self._unwarned, []
            error, self._thread_error = self._thread_error, None
        for fault in unwarned:
            warnings.warn(str(fault), RuntimeWarning, stacklevel=3)
        if error is not None:
            raise error

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
        # durable from here on: only now is it reported committed
        self._seq += 1
        self._committed += len(pending.steps)
        self.commits += 1
        self.committed_step = self._pending_last
        self._last_commit = time.monotonic()
        self._reset_pending()
        for hook in self.on_commit:  # (the thread's, with background=True)
            hook(self.committed_step)
        return row

    # -- the writer thread ----------------------------------------------------------------
    def _start_thread(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[_Queued] = []
        self._queued_full = 0  # queued steps with their payload (the bound applies to these)
        self._flush_asked = self._flush_done = 0  # commit() tickets
        self._urgent = False  # a run_beside() task waits: the thread takes the queue at once
        self._flush_row: dict[str, Any] | None = None
        # queued calls that make the thread take the queue (well before the bound is reached)
        self._wake_at = min(self.commit_steps, WAKE_STEPS, max(1, self.max_queued_steps // 2))
        self._stop = False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name=WRITER_THREAD, daemon=True)
        self._thread.start()
        _OPEN.add(self)

    def _enqueue(self, item: _Queued) -> None:
        """Queue one call; the thread takes the queue only when a batch of steps is ready (a
        wake per step would hand it the GIL at every training step): ``_wake_at`` queued calls
        (``min(commit_steps, WAKE_STEPS, max_queued_steps // 2)``), the time rule (its timed
        wait), or ``commit()`` / ``close()``."""
        with self._cond:
            self._queue.append(item)
            if item.block is not None and item.behind is None:
                self._queued_full += 1
            if len(self._queue) >= self._wake_at or len(self._queue) == 1:
                self._cond.notify()  # (the first: the thread starts the time rule's clock)

    def _wait_s(self) -> float | None:
        """Seconds until the time rule makes a commit due (``None``: no time rule now)."""
        if self.commit_seconds is None or not (self._pending or self._queue):
            return None
        if self.faults and self._due_at > self.commit_steps:
            return None  # after a failed commit the retry is by steps
        return self._last_commit + self.commit_seconds - time.monotonic()

    def _run(self) -> None:
        """The writer thread: take what is queued, encode it, commit when due or asked."""
        cond = self._cond
        while True:
            with cond:
                while not (
                    len(self._queue) >= self._wake_at
                    or self._stop
                    or self._urgent
                    or self._flush_asked > self._flush_done
                ):
                    wait = self._wait_s()
                    if wait is not None and wait <= 0:
                        break
                    cond.wait(wait)
                items, self._queue, self._queued_full = self._queue, [], 0
                self._urgent = False
                ticket, stop = self._flush_asked, self._stop
            row = None
            try:
                for item in items:
                    self._absorb(item)
                    if item.block is not None and self._due_by_steps():
                        # at the step the synchronous writer commits at: how many steps the
                        # thread took at once (scheduling) never changes the chunks' grouping
                        row = self._commit_now()
                if ticket > self._flush_done or (not stop and self._due()):
                    row = self._commit_now()  # asked, or the time rule: all that was taken
            except BaseException as exc:  # a refusal or a bug: reported on the caller's thread
                with self._fault_lock:
                    self._thread_error = self._thread_error or exc
                self._last_commit = time.monotonic()  # no immediate retry by time
            with cond:
                if ticket > self._flush_done:
                    self._flush_row, self._flush_done = row, ticket
                cond.notify_all()
            if stop:
                return

    def _flush(self) -> dict[str, Any] | None:
        """Ask the thread to commit everything queued; wait until it did (or failed)."""
        thread = self._thread
        assert thread is not None
        with self._cond:
            self._flush_asked += 1
            ticket = self._flush_asked
            self._cond.notify_all()
            while self._flush_done < ticket and thread.is_alive():
                self._cond.wait(1.0)
            return self._flush_row if self._flush_done == ticket else None

    def _stop_thread(self) -> None:
        thread = self._thread
        if thread is None:
            return
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        thread.join()
        self._thread = None
        _OPEN.discard(self)

    # -- lifecycle -------------------------------------------------------------------------
    def _check_open(self) -> None:  # the site table's changes refuse once closed, too
        if self._closed:
            raise Refusal("history_writer_closed", f"the writer of {self.path} is closed.")

    def close(self) -> CloseReport:
        """Commit what is pending, seal the segment and close (idempotent).

        A disk failure is reported, not raised: the returned :class:`CloseReport` says how many
        steps stayed uncommitted (and lists the faults). With ``background=True`` the queue is
        flushed and the writer thread joined first.
        """
        if not self._closed:
            try:
                self.commit()
                self._stop_thread()  # the thread is gone: sealing happens here
                if not self._pending:
                    try:
                        if self._catalog_dirty:
                            self._write_catalog()
                        self._seal()
                    except Refusal:
                        raise
                    except OSError as exc:
                        self._commit_failed(exc)
                self._report_thread()
            finally:
                self._stop_thread()
                self._closed = True
                self._unlock()
        return CloseReport(
            committed_step=self.committed_step,
            uncommitted_steps=self._written - self._committed,
            dropped_steps=self.dropped_steps,
            faults=tuple(self.faults),
            behind_steps=self.behind_steps,
        )

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
