"""The crash-safe writer of ``stepscope.history.v1`` artifacts.

Layout::

    RUN/manifest.json     format, schema version, descriptor, one run record per segment
    RUN/catalog.json      sites (series), scalar names, disclosure sets, table descriptions
    RUN/index.json        names the index logs (one append-only log per segment)
    RUN/index/<seg>.log   one checksummed line per commit, naming its chunk files + sha256
    RUN/chunks/*.npy      immutable chunk files (structured arrays, no pickle)

A commit writes each chunk to a temporary file, fsyncs it, renames it, fsyncs ``chunks/``, then
appends one checksummed line to the segment's index log and fsyncs it. The commit costs the same
at step 10 and at step 10 million: nothing growing is rewritten. A chunk is visible only once its
line is durable, so a kill loses at most the steps written since the last commit
(``commit_steps`` steps or ``commit_seconds`` seconds, whichever comes first).

``index.json`` is self-checksummed and carries the manifest's sha256; when a segment ends
(``close()``, or a resume after a kill) it also *seals* the segment's log (and ``evals.log``) with
their row count and byte length, so a reader refuses a shortened or deleted log
(``history_index_incomplete``) instead of showing a shorter run.

A commit that fails on the disk (``ENOSPC``, a read-only remount, ``EIO``) raises nothing into
the caller: the rows stay pending in RAM and the commit is retried ``commit_steps`` steps later;
the first failure warns once with the code ``history_disk_fault``. Past ``max_pending_steps``
pending steps the oldest steps' payloads are dropped and their cells kept as
``budget_dropped`` rows disclosed ``disk_fault`` (step blocks are never dropped). ``close()``
returns a :class:`CloseReport` that says what stayed uncommitted instead of raising.

Example
-------
>>> import tempfile, numpy as np
>>> from stepscope.history import ArtifactWriter, ObservationBatch, StepBlockRecord, open_history
>>> from stepscope.stats import SPINE_WIDTH
>>> path = tempfile.mkdtemp() + "/run"
>>> with ArtifactWriter(path, commit_steps=2) as w:
...     fc = w.register_site("fc", "torch.nn.Linear", "f32[4,3]")
...     for step in range(3):
...         spine = np.zeros((1, SPINE_WIDTH)); spine[0, :2] = 12
...         _ = w.write_step(StepBlockRecord(step), [ObservationBatch.observed("activation", "forward", [fc], spine)])
>>> open_history(path).steps.tolist()
[0, 1, 2]
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.batch import ObservationBatch, batches_from_records, code_of
from stepscope.history.files import (
    append_log_row,
    atomic_write_bytes,
    atomic_write_json,
    check_dir,
    fsync_dir,
    json_sha256,
    log_extent,
    read_log,
    read_regular,
)
from stepscope.history.layout import (
    SCALAR_DTYPE,
    catalog_dict,
    encode_batch,
    encode_steps,
    histogram_dtype,
    narrow_histograms,
    npy_bytes,
    observation_dtype,
)
from stepscope.history.schema import (
    FORMAT,
    SCHEMA_VERSION,
    ObservationRecord,
    Presence,
    RunRecord,
    SiteRecord,
    StepBlockRecord,
)


def check_resume_facts(parent: RunRecord, descriptor: dict[str, Any], run: RunRecord) -> None:
    """Refuse to append ``run`` as a segment of ``parent`` when its structure or grid differs.

    ``merge_incompatible``: another run id; ``resume_fingerprint_mismatch``: another model
    architecture (:func:`~stepscope.history.model_fingerprint`), whose series would be read
    as continuations of the parent's; ``resume_descriptor_mismatch``: another histogram grid,
    whose counts would be decoded on the parent's bins. Each message names both values.
    """
    if run.run_id != parent.run_id:
        raise Refusal(
            "merge_incompatible",
            f"resume of run {parent.run_id!r} was given a record of run {run.run_id!r}.",
            ["resume with the same run_id", "or start a new run in a new directory"],
        )
    fp = run.model_fingerprint
    if fp is not None and parent.model_fingerprint is not None and fp != parent.model_fingerprint:
        raise Refusal(
            "resume_fingerprint_mismatch",
            f"the artifact's model fingerprint is {parent.model_fingerprint!r}, the resuming "
            f"model's is {fp!r}: a different architecture cannot continue its series.",
            ["resume with the checkpoint's architecture", "or start a new run in a new directory"],
        )
    if run.histogram_descriptor and dict(run.histogram_descriptor) != dict(descriptor):
        raise Refusal(
            "resume_descriptor_mismatch",
            f"the artifact's histogram descriptor is {dict(descriptor)}, the resuming run's is "
            f"{dict(run.histogram_descriptor)}: histograms would be decoded on the wrong grid.",
            ["resume with the artifact's histogram_descriptor", "or start a new run elsewhere"],
        )


@dataclass(frozen=True)
class CloseReport:
    """What :meth:`ArtifactWriter.close` left on disk.

    ``uncommitted_steps`` steps were written but could not be committed (the disk kept failing);
    ``dropped_steps`` steps had their payload dropped (disclosed ``disk_fault`` rows, if later
    committed); ``faults`` are the ``history_disk_fault`` refusals, oldest first.
    """

    committed_step: int | None
    uncommitted_steps: int
    dropped_steps: int
    faults: tuple[Refusal, ...]

    @property
    def ok(self) -> bool:
        """Everything written was committed and nothing was dropped."""
        return not self.uncommitted_steps and not self.dropped_steps


def _check_commit_policy(steps: Any, seconds: Any, pending: Any) -> None:
    for name, v in (("commit_steps", steps), ("max_pending_steps", pending)):
        if v is None and name == "max_pending_steps":
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
        if v < 1:
            raise Refusal("settings_invalid", f"{name} must be >= 1, not {v}.")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(
                f"commit_seconds must be a number or None, not {type(seconds).__name__}"
            )
        if not (seconds > 0 and seconds != float("inf")):
            raise Refusal(
                "settings_invalid", f"commit_seconds must be finite and > 0, not {seconds}."
            )


class ArtifactWriter:
    """Append step blocks, observations and scalars to an artifact directory.

    Parameters
    ----------
    path
        The run directory. Must not hold an artifact unless ``resume=True``.
    run
        The run record of a fresh run (default: :meth:`RunRecord.new`).
    resume
        Open an existing artifact and append a new segment whose record names its parent.
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
        _check_commit_policy(commit_steps, commit_seconds, max_pending_steps)
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
        self.sites: list[SiteRecord] = []
        self.scalar_names: list[str] = []
        self.disclosures: list[tuple[str, ...]] = []
        self._active: dict[str, int] = {}  # site name -> open series id
        self._last_step: int | None = None
        self._catalog_dirty = False
        self.commits = 0
        self._sealed_catalog: str | None = None  # set by close(): the final catalog's sha256
        self._catalog_sha = ""
        self.committed_step: int | None = None  # the last step durable on disk (effective view)
        self._lock_fd: int | None = None
        if (self.path / "manifest.json").exists() or (self.path / "index.json").exists():
            if not resume:
                raise Refusal(
                    "history_run_exists",
                    f"{self.path} already holds a stepscope artifact.",
                    ["pass resume=True to append a segment", "choose a new output directory"],
                )
            self._lock()
            opener = lambda: self._open_resume(resume_at_step, run)  # noqa: E731
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock()
            opener = lambda: self._open_fresh(run or RunRecord.new())  # noqa: E731
        try:
            opener()
        except BaseException:
            self._unlock()  # a refused open must not keep the artifact locked
            raise
        self._reset_pending()
        self._last_commit = time.monotonic()

    # -- setup -------------------------------------------------------------------------------
    def _lock(self) -> None:
        """Hold an exclusive advisory lock for the writer's life (released by the OS on a kill)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on POSIX: no lock, documented
            return
        # read-only: flock needs no write access, and a read-only remount is not blocked by it
        flags = os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        try:
            fd = os.open(self.path / "writer.lock", flags, 0o644)
        except OSError as exc:
            raise Refusal(
                "history_file_kind_invalid",
                f"{self.path / 'writer.lock'} cannot be opened as a plain file ({exc.strerror}).",
                ["remove the link or directory named writer.lock", "do not resume untrusted runs"],
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise Refusal(
                "history_writer_active",
                f"another live writer holds {self.path / 'writer.lock'}.",
                [
                    "give each process (rank) its own output directory",
                    "close the other writer first; a killed writer's lock is released by the OS",
                ],
            ) from None
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the flock
            self._lock_fd = None

    def _open_fresh(self, run: RunRecord) -> None:
        from stepscope.stats import HistogramDescriptor

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
        from stepscope.history.reader import HistoryReader

        reader = HistoryReader(self.path)
        check_dir(self.path / "chunks", "chunk directory")
        parent = reader.segments[-1]
        last = int(reader.steps[-1]) if len(reader.steps) else None
        if at_step is None:
            at_step = 0 if last is None else last + 1
        if at_step < 0:
            raise Refusal("settings_invalid", f"resume step {at_step} is negative.", [])
        self.run = parent.resumed(at_step)
        if run is not None:
            check_resume_facts(parent, reader.descriptor.to_dict(), run)
            self.run = replace(  # the new segment's own facts, with its ancestry
                self.run,
                model_fingerprint=run.model_fingerprint,
                cadences=dict(run.cadences),
                budgets=dict(run.budgets),
                device=run.device,
                rank=run.rank,
                world_size=run.world_size,
                extra=dict(run.extra),
            )
        # the last committed block before the resume step (examples_seen, epoch continue from it)
        before = [b for b in reader.step_blocks() if b.optimizer_step < at_step]
        self.resumed_after: StepBlockRecord | None = before[-1] if before else None
        self.segments = [*reader.segments, self.run]
        self.descriptor = reader.descriptor
        self._logs = list(reader.logs)
        self._sealed = dict(reader.sealed)
        for name in self._logs:  # a killed writer never sealed its log: seal what it left
            if f"index/{name}" not in self._sealed:
                self._sealed[f"index/{name}"] = log_extent(self.path / "index" / name)
        self._catalog_sha = reader.catalog_sha256
        self.sites = list(reader.sites)
        self.scalar_names = list(reader.scalar_names)
        self.disclosures = list(reader.disclosures)
        self._active = {s.name: s.site_id for s in self.sites if s.ended_step is None}
        self._last_step = at_step - 1
        for stale in (self.path / "chunks").glob(".*.tmp*"):  # a killed writer's temp files
            stale.unlink(missing_ok=True)
        if last is not None and at_step > 0:
            self.committed_step = min(last, at_step - 1)
        self._start_segment()

    def _start_segment(self) -> None:
        log = f"{self.run.segment_id}.log"
        self._log_path = self.path / "index" / log
        read_log(self._log_path, missing_ok=True)  # a link or a non-file refuses here
        self._log_path.touch()
        self._logs.append(log)
        self._seq = 0
        manifest = {
            "format": FORMAT,
            "schema_version": SCHEMA_VERSION,
            "descriptor": self.descriptor.to_dict(),
            "run": self.segments[0].to_dict(),
            "segments": [s.to_dict() for s in self.segments],
        }
        # manifest before index.json: every log that index.json names has a segment record
        atomic_write_json(self.path / "manifest.json", manifest, durable=self.durable)
        self._write_index()
        self._obs_dtype = observation_dtype(self._spine_width())
        self._hist_dtype = histogram_dtype(self.descriptor.width)

    def _write_index(self) -> None:
        """``index.json``: the logs, the manifest's sha256, the seals, and its own sha256."""
        manifest = read_regular(self.path / "manifest.json", "manifest")
        index: dict[str, Any] = {
            "format": FORMAT,
            "logs": [f"index/{name}" for name in self._logs],
            "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
            "sealed": self._sealed,
        }
        if self._sealed_catalog is not None:  # a closed run: the catalog is final
            index["catalog_sha256"] = self._sealed_catalog
        index["sha256"] = json_sha256(index)
        atomic_write_json(self.path / "index.json", index, durable=self.durable)

    def _seal(self) -> None:
        """Record the final extent of this segment's log and of ``evals.log`` in ``index.json``."""
        sealed = dict(self._sealed)
        sealed[f"index/{self._log_path.name}"] = log_extent(self._log_path)
        evals = self.path / "evals.log"
        if os.path.lexists(evals):
            try:
                sealed["evals.log"] = log_extent(evals)
            except Refusal:  # a damaged evals.log is left to the reader to refuse
                pass
        self._sealed = sealed
        self._sealed_catalog = self._catalog_sha
        self._write_index()

    @staticmethod
    def _spine_width() -> int:
        from stepscope.stats import SPINE_WIDTH

        return SPINE_WIDTH

    def _write_catalog(self) -> None:
        cat = catalog_dict(self.sites, self.scalar_names, self.disclosures)
        data = (json.dumps(cat, indent=1) + "\n").encode()
        atomic_write_bytes(self.path / "catalog.json", data, durable=self.durable)
        self._catalog_sha = hashlib.sha256(data).hexdigest()
        self._catalog_dirty = False

    def _reset_pending(self) -> None:
        self._dropped_seen: set[int] = set()
        self._p_steps: list[StepBlockRecord] = []
        self._p_obs: dict[str, list[np.ndarray]] = {}
        self._p_hist: dict[str, list[np.ndarray]] = {}
        self._p_scalars: list[tuple[int, int, float]] = []

    # -- catalog ---------------------------------------------------------------------------
    def register_site(
        self,
        name: str,
        module_type: str,
        signature: str,
        label: str | None = None,
        step: int | None = None,
    ) -> int:
        """Return the series id for this structure, starting a new series on topology drift.

        A site whose name is already bound to a *different* structure ends that series
        (``ended_reason="topology_drift"``) and opens a new one; it never re-binds.
        """
        self._check_open()
        current = self._active.get(name)
        if current is not None:
            site = self.sites[current]
            if site.structure == (name, module_type, signature):
                return current
            self.end_site(
                current, step if step is not None else self._next_step(), "topology_drift"
            )
        site_id = len(self.sites)
        self.sites.append(SiteRecord(site_id, name, module_type, signature, label, step))
        self._active[name] = site_id
        self._catalog_dirty = True
        return site_id

    def add_site_record(self, site: SiteRecord) -> int:
        """Append a copy of ``site`` as a new series as-is (for merges and copies); returns its id."""
        self._check_open()
        site_id = len(self.sites)
        self.sites.append(replace(site, site_id=site_id))
        if site.ended_step is None:
            self._active[site.name] = site_id
        self._catalog_dirty = True
        return site_id

    def end_site(self, site_id: int, step: int, reason: str) -> None:
        """Close a series at ``step`` (exclusive) with a reason."""
        site = self._site(site_id)
        self.sites[site_id] = replace(site, ended_step=int(step), ended_reason=reason)
        self._active.pop(site.name, None)
        self._catalog_dirty = True

    def _site(self, site_id: int) -> SiteRecord:
        if not 0 <= site_id < len(self.sites):
            raise Refusal("history_series_unknown", f"site id {site_id} is not registered.")
        return self.sites[site_id]

    def _next_step(self) -> int:
        return 0 if self._last_step is None else self._last_step + 1

    def _intern(self, table: list, value: Any) -> int:
        try:
            return table.index(value)
        except ValueError:
            table.append(value)
            self._catalog_dirty = True
            return len(table) - 1

    # -- writing ---------------------------------------------------------------------------
    def write_step(
        self,
        block: StepBlockRecord,
        batches: Sequence[ObservationBatch] = (),
        observations: Iterable[ObservationRecord] = (),
        scalars: dict[str, float] | None = None,
    ) -> bool:
        """Append one step block with its observations; returns True if this call committed.

        ``batches`` is the hot path (columnar, no per-element Python); ``observations`` takes
        per-observation records for convenience. ``scalars`` adds user scalar rows.
        """
        self._check_open()
        step = block.optimizer_step
        if self._last_step is not None and step <= self._last_step:
            raise Refusal(
                "history_step_out_of_order",
                f"step {step} written after step {self._last_step}.",
                ["write each optimizer step once, in increasing order"],
            )
        all_batches = list(batches)
        recs = list(observations)
        for r in recs:
            if r.step != step:
                raise Refusal("history_step_out_of_order", f"record of step {r.step} in {step}.")
        all_batches += batches_from_records(recs)
        encoded = [self._encode(step, b) for b in all_batches]
        self._check_unique(encoded)
        self._p_steps.append(block)
        for b, (obs, hist) in zip(all_batches, encoded):
            self._p_obs.setdefault(b.stream.value, []).append(obs)
            if hist is not None:
                self._p_hist.setdefault(b.stream.value, []).append(hist)
        for name, value in (scalars or {}).items():
            self._p_scalars.append((step, self._intern(self.scalar_names, name), float(value)))
        self._last_step = step
        if self.ring is not None:
            self.ring.push(block, all_batches)
        return self._maybe_commit()

    def write_scalar(self, name: str, step: int, value: float) -> None:
        """Add one user scalar row (e.g. a loss) at ``step``; committed with the next commit."""
        self._check_open()
        self._p_scalars.append((int(step), self._intern(self.scalar_names, name), float(value)))

    def _encode(self, step: int, b: ObservationBatch) -> tuple[np.ndarray, np.ndarray | None]:
        if b.n_rows and (b.site_ids.min() < 0 or b.site_ids.max() >= len(self.sites)):
            raise Refusal(
                "history_series_unknown",
                f"{b.stream.value} batch names site ids outside 0..{len(self.sites) - 1}.",
                ["register every site with register_site() first"],
            )
        discl: int | np.ndarray = (
            self._intern(self.disclosures, b.disclosures) if b.disclosures else -1
        )
        if b.row_disclosures is not None:  # few distinct sets: intern each once
            ids = {
                d: self._intern(self.disclosures, d) if d else -1
                for d in set(map(b.row_disclosure, range(b.n_rows)))
            }
            discl = np.array([ids[b.row_disclosure(i)] for i in range(b.n_rows)], np.int32)
        return encode_batch(step, b, discl, self._obs_dtype, self._hist_dtype)

    @staticmethod
    def _check_unique(encoded: list[tuple[np.ndarray, np.ndarray | None]]) -> None:
        if len(encoded) < 2:
            return
        # one int64 key per cell: site | micro_batch | stream | phase (cheaper than a record sort)
        keys = np.concatenate(
            [
                (e[0]["site"].astype(np.int64) << 32)
                | ((e[0]["micro_batch"].astype(np.int64) + 1) << 16)
                | (e[0]["stream"].astype(np.int64) << 8)
                | e[0]["phase"].astype(np.int64)
                for e in encoded
            ]
        )
        if len(np.unique(keys)) != len(keys):
            raise Refusal(
                "stat_payload_invalid",
                "a (site, stream, phase, micro_batch) cell appears twice in one step.",
                ["send each cell once per step"],
            )

    def _maybe_commit(self) -> bool:
        due = len(self._p_steps) >= self._due_at
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
        if not (self._p_steps or self._p_scalars):
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
        return len(self._p_steps)

    def _commit_failed(self, exc: OSError) -> None:
        steps = [b.optimizer_step for b in self._p_steps]
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
        self._due_at = len(self._p_steps) + self.commit_steps
        self._last_commit = time.monotonic()
        self._drop_oldest_payloads()

    def _drop_oldest_payloads(self) -> None:
        """Keep at most ``max_pending_steps`` steps' payloads; older cells become disclosed drops."""
        excess = len(self._p_steps) - self.max_pending_steps
        if excess <= 0:
            return
        last_dropped = self._p_steps[excess - 1].optimizer_step
        disc = self._intern(self.disclosures, ("disk_fault",))
        dropped_code = code_of(Presence.BUDGET_DROPPED)
        for parts in self._p_obs.values():
            for arr in parts:
                if not len(arr) or arr["step"][0] > last_dropped:
                    continue
                sel = (arr["step"] <= last_dropped) & (arr["presence"] != dropped_code)
                arr["presence"][sel] = dropped_code
                arr["spine"][sel] = np.nan
                arr["disclosure"][sel] = disc
                arr["rdtype"][sel] = 0
        for stream, parts in self._p_hist.items():
            self._p_hist[stream] = [a[a["step"] > last_dropped] for a in parts]
        newly = sum(1 for b in self._p_steps[:excess] if b.optimizer_step not in self._dropped_seen)
        self._dropped_seen.update(b.optimizer_step for b in self._p_steps[:excess])
        self.dropped_steps += newly

    def _commit_pending(self) -> dict[str, Any]:
        if self._catalog_dirty:  # catalog first: every index row's site ids are cataloged
            self._write_catalog()
        prefix = f"{self.run.segment_id}-{self._seq:07d}"
        tables: list[tuple[str, str | None, np.ndarray]] = [
            ("steps", None, encode_steps(self._p_steps))
        ]
        for stream, parts in self._p_obs.items():
            tables.append(("observations", stream, np.concatenate(parts)))
        for stream, parts in self._p_hist.items():
            tables.append(("histograms", stream, np.concatenate(parts)))  # narrowed on write
        if self._p_scalars:
            tables.append(("scalars", None, np.array(self._p_scalars, dtype=SCALAR_DTYPE)))
        files = [self._write_chunk(prefix, *t) for t in tables]
        if self.durable:
            fsync_dir(self.path / "chunks")
        steps = [b.optimizer_step for b in self._p_steps] + [s[0] for s in self._p_scalars]
        row = {
            "seq": self._seq,
            "segment": self.run.segment_id,
            "step_lo": min(steps),
            "step_hi": max(steps),
            "n_steps": len(self._p_steps),
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

    def _write_chunk(self, prefix: str, table: str, stream: str | None, arr: np.ndarray) -> dict:
        import hashlib

        name = f"{prefix}-{table}" + (f"-{stream}" if stream else "") + ".npy"
        counts_dtype = None
        if table == "histograms":
            arr, counts_dtype = narrow_histograms(arr)
        data = npy_bytes(arr)
        # temp + fsync + rename; the chunks/ directory is fsynced once per commit by the caller
        atomic_write_bytes(self.path / "chunks" / name, data, durable=self.durable, sync_dir=False)
        entry: dict[str, Any] = {
            "name": name,
            "table": table,
            "stream": stream,
            "rows": len(arr),
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        if counts_dtype is not None:
            entry["counts_dtype"] = counts_dtype
        if table in ("observations", "histograms") and len(arr):
            entry["site_lo"], entry["site_hi"] = int(arr["site"].min()), int(arr["site"].max())
        return entry

    # -- lifecycle -------------------------------------------------------------------------
    def _check_open(self) -> None:
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
                if not self._p_steps and not self._p_scalars:
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
            uncommitted_steps=len(self._p_steps),
            dropped_steps=self.dropped_steps,
            faults=tuple(self.faults),
        )

    def __enter__(self) -> ArtifactWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
