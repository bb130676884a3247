"""A run directory's identity: its writer lock, manifest, catalog, ``index.json`` and seals.

Layout::

    RUN/manifest.json     format, schema version, descriptor, one run record per segment
    RUN/catalog.json      sites, scalar names, disclosure sets, table descriptions
    RUN/index.json        names the index logs (one append-only log per segment)
    RUN/index/<seg>.log   one checksummed line per commit, naming its chunk files + sha256
    RUN/chunks/*.npy      immutable chunk files (structured arrays, no pickle)

The files here describe *which* run and segments an artifact holds and which index logs are
complete; the step rows themselves are written by :mod:`stepscope.history.artifact` (through
:mod:`stepscope.history.pending`). ``index.json`` is self-checksummed and carries the manifest's
sha256; when a segment ends (``close()``, or a resume after a kill) it also *seals* the segment's
log (and ``evals.log``) with their row count and byte length, so a reader refuses a shortened or
deleted log (``history_index_incomplete``) instead of showing a shorter run.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from stepscope.errors import Refusal
from stepscope.history.files import (
    atomic_write_bytes,
    atomic_write_json,
    check_dir,
    json_sha256,
    log_extent,
    read_regular,
)
from stepscope.history.layout import catalog_dict
from stepscope.history.reader import HistoryReader
from stepscope.history.runrecord import FORMAT, SCHEMA_VERSION, RunRecord
from stepscope.history.schema import SiteRecord, StepBlockRecord


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


@dataclass
class ResumeState:
    """What a resuming writer continues from: the artifact's records and the new segment's."""

    run: RunRecord  # the new segment's record, naming its parent
    at_step: int  # the step training resumes from
    resumed_after: StepBlockRecord | None  # the last committed block before ``at_step``
    committed_step: int | None  # the last committed step the new segment's view keeps
    segments: list[RunRecord]
    descriptor: Any  # the artifact's HistogramDescriptor
    logs: list[str]
    sealed: dict[str, dict[str, int]]
    catalog_sha: str
    sites: list[SiteRecord]
    scalar_names: list[str]
    disclosures: list[tuple[str, ...]]


def read_resume(path: Path, at_step: int | None, run: RunRecord | None) -> ResumeState:
    """Read the artifact at ``path`` for a new segment resuming at ``at_step``.

    ``at_step`` defaults to one past the last committed step; ``run`` (optional) is the new
    segment's own record, checked by :func:`check_resume_facts`. Seals every log a killed writer
    left unsealed and removes its temporary chunk files.
    """
    reader = HistoryReader(path)
    check_dir(path / "chunks", "chunk directory")
    parent = reader.segments[-1]
    last = int(reader.steps[-1]) if len(reader.steps) else None
    if at_step is None:
        at_step = 0 if last is None else last + 1
    if at_step < 0:
        raise Refusal("settings_invalid", f"resume step {at_step} is negative.", [])
    new = parent.resumed(at_step)
    if run is not None:
        check_resume_facts(parent, reader.descriptor.to_dict(), run)
        new = replace(  # the new segment's own facts, with its ancestry
            new,
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
    logs = list(reader.logs)
    sealed = dict(reader.sealed)
    for name in logs:  # a killed writer never sealed its log: seal what it left
        if f"index/{name}" not in sealed:
            sealed[f"index/{name}"] = log_extent(path / "index" / name)
    for stale in (path / "chunks").glob(".*.tmp*"):  # a killed writer's temp files
        stale.unlink(missing_ok=True)
    return ResumeState(
        run=new,
        at_step=at_step,
        resumed_after=before[-1] if before else None,
        committed_step=min(last, at_step - 1) if last is not None and at_step > 0 else None,
        segments=[*reader.segments, new],
        descriptor=reader.descriptor,
        logs=logs,
        sealed=sealed,
        catalog_sha=reader.catalog_sha256,
        sites=list(reader.sites),
        scalar_names=list(reader.scalar_names),
        disclosures=list(reader.disclosures),
    )


def make_run_dir(path: Path) -> None:
    """Create the run directory (and its parents), refusing with a code where that cannot work.

    A name with NUL, too long a name, a file (or ``/dev/null``) in the way, a full or read-only
    disk: ``history_output_unwritable`` (never a raw ``OSError``); a link: ``history_file_kind_invalid``.
    """
    try:
        if os.path.islink(path):
            raise Refusal(
                "history_file_kind_invalid",
                f"output directory {path} is a symbolic link.",
                ["pass the real directory, not a link to it"],
            )
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(13, "not writable")
    except Refusal:
        raise
    except (OSError, ValueError) as exc:
        why = getattr(exc, "strerror", None) or str(exc)
        raise Refusal(
            "history_output_unwritable",
            f"output directory {str(path)[:200]!r} cannot be created or written ({why}).",
            [
                "pass output_dir= a plain path (no NUL, each name under 255 bytes) on a writable disk"
            ],
        ) from None


def committed_artifact(path: Path) -> bool:
    """Whether ``path`` holds an artifact that a commit may have written to.

    ``index.json`` is written before the first commit, so a directory with a manifest but no
    ``index.json`` and no chunk or index row is a creation killed half-way: nothing was committed,
    and a new writer may start it afresh. Anything more (a lost ``index.json`` beside committed
    chunks) is an artifact, never overwritten.
    """
    if os.path.lexists(path / "index.json"):
        return True
    if not os.path.lexists(path / "manifest.json"):
        return False
    try:
        chunks = [p for p in (path / "chunks").iterdir() if not p.name.startswith(".")]
        logs = [p for p in (path / "index").iterdir() if p.is_symlink() or p.stat().st_size]
    except FileNotFoundError:
        chunks, logs = [], []
    except OSError:
        return True  # unreadable: treat as an artifact (never overwritten)
    return bool(chunks or logs)


def lock_writer(path: Path) -> int | None:
    """Hold an exclusive advisory lock on ``path/writer.lock``; returns its descriptor.

    The OS releases the lock on a kill; closing the descriptor releases it too. ``None`` where
    there is no ``fcntl`` (not POSIX: no lock, documented).
    """
    try:
        import fcntl  # lazy: POSIX only (no lock elsewhere)
    except ImportError:  # pragma: no cover - not on POSIX: no lock, documented
        return None
    # read-only: flock needs no write access, and a read-only remount is not blocked by it
    flags = os.O_RDONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path / "writer.lock", flags, 0o644)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.EISDIR, errno.ENOTDIR, errno.EMLINK):
            raise Refusal(
                "history_output_unwritable",
                f"{path / 'writer.lock'} cannot be created ({exc.strerror}).",
                ["free disk space or remount the output read-write", "or pick another output_dir"],
            ) from None
        raise Refusal(
            "history_file_kind_invalid",
            f"{path / 'writer.lock'} cannot be opened as a plain file ({exc.strerror}).",
            ["remove the link or directory named writer.lock", "do not resume untrusted runs"],
        ) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise Refusal(
            "history_writer_active",
            f"another live writer holds {path / 'writer.lock'}.",
            [
                "give each process (rank) its own output directory",
                "close the other writer first; a killed writer's lock is released by the OS",
            ],
        ) from None
    return fd


def write_manifest(
    path: Path, descriptor: dict[str, Any], segments: Sequence[RunRecord], durable: bool
) -> None:
    """``manifest.json``: format, schema version, descriptor and one record per segment."""
    manifest = {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "descriptor": descriptor,
        "run": segments[0].to_dict(),
        "segments": [s.to_dict() for s in segments],
    }
    atomic_write_json(path / "manifest.json", manifest, durable=durable)


def write_index(
    path: Path,
    logs: Sequence[str],
    sealed: dict[str, dict[str, int]],
    sealed_catalog: str | None,
    durable: bool,
) -> None:
    """``index.json``: the logs, the manifest's sha256, the seals, and its own sha256."""
    manifest = read_regular(path / "manifest.json", "manifest")
    index: dict[str, Any] = {
        "format": FORMAT,
        "logs": [f"index/{name}" for name in logs],
        "manifest_sha256": hashlib.sha256(manifest).hexdigest(),
        "sealed": sealed,
    }
    if sealed_catalog is not None:  # a closed run: the catalog is final
        index["catalog_sha256"] = sealed_catalog
    index["sha256"] = json_sha256(index)
    atomic_write_json(path / "index.json", index, durable=durable)


def seal_extents(
    path: Path, sealed: dict[str, dict[str, int]], log_path: Path
) -> dict[str, dict[str, int]]:
    """The seals with this segment's log and ``evals.log`` at their current extent added."""
    out = dict(sealed)
    out[f"index/{log_path.name}"] = log_extent(log_path)
    evals = path / "evals.log"
    if os.path.lexists(evals):
        try:
            out["evals.log"] = log_extent(evals)
        except Refusal:  # a damaged evals.log is left to the reader to refuse
            pass
    return out


def write_catalog(
    path: Path,
    sites: Sequence[SiteRecord],
    scalar_names: Sequence[str],
    disclosures: Sequence[tuple[str, ...]],
    durable: bool,
) -> str:
    """Write ``catalog.json`` (sites, scalar names, disclosure sets); returns its sha256."""
    cat = catalog_dict(list(sites), list(scalar_names), list(disclosures))
    data = (json.dumps(cat, indent=1) + "\n").encode()
    atomic_write_bytes(path / "catalog.json", data, durable=durable)
    return hashlib.sha256(data).hexdigest()
