"""Validation of index rows and whole-artifact checksum verification.

Example
-------
>>> validate_commit({"seq": 0, "segment": "a", "step_lo": 0, "step_hi": 0, "n_steps": 1,
...                  "files": []}, "a.log")["seq"]
0
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.files import MAX_DECLARED, check_dir, check_name, read_regular
from stepscope.history.layout import COUNT_DTYPES, TABLES
from stepscope.history.vocab import Phase, Presence, StepProvenance, Stream, Tristate
from stepscope.stats.layout import REDUCTION_DTYPES

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _bad(log: str, what: str) -> Refusal:
    return Refusal(
        "history_json_invalid",
        f"index log {log}: {what}.",
        ["restore the index log from a copy", "run `stepscope verify`"],
    )


def _int(row: dict[str, Any], key: str, log: str) -> int:
    v = row.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_DECLARED:
        raise _bad(log, f"field {key!r} is {str(v)[:40]}, not an int in 0..2**62")
    return v


def validate_commit(row: Any, log: str) -> dict[str, Any]:
    """Check the shape of one index row; file names must be plain names (no ``/``, no ``..``)."""
    if not isinstance(row, dict):
        raise _bad(log, "a row is not an object")
    for key in ("seq", "step_lo", "step_hi", "n_steps"):
        _int(row, key, log)
    if row["step_hi"] > np.iinfo(np.int64).max // 2:
        raise _bad(log, "step_hi is beyond int64")
    if row["step_hi"] < row["step_lo"]:
        raise _bad(log, "step_hi < step_lo")
    if not isinstance(row.get("segment"), str):
        raise _bad(log, "segment is not a string")
    files = row.get("files")
    if not isinstance(files, list):
        raise _bad(log, "files is not a list")
    for f in files:
        if not isinstance(f, dict):
            raise _bad(log, "a file entry is not an object")
        check_name(f.get("name"), f"index log {log}")
        if not str(f.get("name")).endswith(".npy"):
            raise Refusal("history_chunk_name_invalid", f"{f.get('name')!r} is not a .npy chunk.")
        if (
            not isinstance(f.get("table"), str)
            or "stream" not in f
            or not isinstance(f["stream"], (str, type(None)))
        ):
            raise _bad(log, "a file entry lacks table/stream")
        if not isinstance(f.get("sha256"), str) or not _HEX64.match(f["sha256"]):
            raise _bad(log, "a file entry has no valid sha256")
        if f.get("counts_dtype", "<i8") not in COUNT_DTYPES:
            raise _bad(log, f"counts_dtype {f.get('counts_dtype')!r} not in {COUNT_DTYPES}")
        _int(f, "rows", log)
        _int(f, "bytes", log)
        if ("site_lo" in f) != ("site_hi" in f):
            raise _bad(log, "site_lo/site_hi come together")
        if "site_lo" in f:
            _int(f, "site_lo", log)
            _int(f, "site_hi", log)
    return row


def check_codes(
    rows: np.ndarray, table: str, name: str, sites: list, scalar_names: list, disclosures: list
) -> None:
    """Refuse ``history_artifact_corrupt`` if a stored code or id is outside its vocabulary.

    Checked once per chunk when it is loaded (vectorised), so decoding never indexes out of range:
    enum codes, site / scalar-name / disclosure ids and reduction dtypes. (Spine counts are
    checked where they become ints: :func:`stepscope.history.decode.records_from_rows`.)
    """

    def need(ok: np.ndarray | bool, what: str) -> None:
        if not np.all(ok):
            raise Refusal(
                "history_artifact_corrupt",
                f"chunk {name} holds {what} outside its vocabulary.",
                ["restore the chunk from a copy", "run `stepscope verify`"],
            )

    def codes(col: str, vocab: Any) -> None:
        need((rows[col] >= 1) & (rows[col] <= len(vocab)), f"{col} codes")

    if not len(rows):
        return
    if table == "steps":
        codes("provenance", StepProvenance)
        for col in ("applied", "unscaled", "clipped"):
            codes(col, Tristate)
    elif table == "scalars":
        need((rows["name"] >= 0) & (rows["name"] < len(scalar_names)), "scalar-name ids")
    elif table in ("observations", "histograms"):
        need((rows["site"] >= 0) & (rows["site"] < len(sites)), "site ids")
        codes("stream", Stream)
        codes("phase", Phase)
        need(rows["micro_batch"] >= -1, "micro-batch indices")
        if table == "observations":
            codes("presence", Presence)
            need(rows["rdtype"] < len(REDUCTION_DTYPES), "reduction dtypes")
            d = rows["disclosure"]
            need((d >= -1) & (d < len(disclosures)), "disclosure ids")


def _inconsistent(what: str) -> Refusal:
    return Refusal(
        "history_artifact_inconsistent",
        f"{what}.",
        ["restore the artifact from a copy", "run `stepscope verify` to list every inconsistency"],
    )


def commit_inconsistencies(commits: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """What the index rows contradict in each other, checksums aside (each as a verify failure).

    A commit names its chunks ``<segment>-<seq>-<table>[-<stream>].npy``: a chunk named by a row
    of another segment or sequence number, under another table or stream, or named twice, is a
    row copied, renumbered or relabelled (re-signed or not). The rows' own ``seq`` order is
    checked where they are read (:mod:`stepscope.history.commits`).
    """
    out: list[tuple[str, str, str]] = []
    seen: dict[str, int] = {}
    for k, row in enumerate(commits):
        prefix = f"{row['segment']}-{row['seq']:07d}-"
        for f in row["files"]:
            name = f["name"]
            if f["table"] not in TABLES:  # a newer writer's table: skipped by this reader
                continue
            expected = f"{prefix}{f['table']}" + (f"-{f['stream']}" if f["stream"] else "") + ".npy"
            if name != expected:
                out.append(
                    (
                        name,
                        "history_artifact_inconsistent",
                        f"commit {row['seq']} of segment {row['segment']} names chunk {name}, "
                        f"but its {f['table']}/{f['stream']} chunk is {expected} "
                        f"({_steps_of(row)})",
                    )
                )
            if name in seen:
                out.append(
                    (
                        name,
                        "history_artifact_inconsistent",
                        f"chunk {name} is named by commits {seen[name]} and {k} ({_steps_of(row)})",
                    )
                )
            seen.setdefault(name, k)
    return out


def check_chunk(rows: np.ndarray, row: dict[str, Any], f: dict[str, Any]) -> None:
    """Refuse ``history_artifact_inconsistent`` where a chunk contradicts its index entry.

    Every row's step lies in the commit's ``step_lo..step_hi``; a steps chunk holds ``n_steps``
    increasing steps; an observation or histogram chunk holds only its entry's stream and sites
    within its ``site_lo..site_hi``. (The bytes' sha256 is checked before this.)
    """
    name = f["name"]
    if not len(rows):
        return
    step = rows["step"]
    if step.min() < row["step_lo"] or step.max() > row["step_hi"]:
        raise _inconsistent(
            f"chunk {name} holds steps {int(step.min())}..{int(step.max())} outside its commit's "
            f"steps {row['step_lo']}..{row['step_hi']}"
        )
    if f["table"] == "steps":
        if len(rows) != row["n_steps"] or (len(step) > 1 and not np.all(np.diff(step) > 0)):
            raise _inconsistent(
                f"chunk {name} holds {len(rows)} steps, not {row['n_steps']} increasing ones"
            )
    elif f["table"] in ("observations", "histograms"):
        streams = list(Stream)
        want = [i + 1 for i, s in enumerate(streams) if s.value == f["stream"]]
        if not want or not np.all(rows["stream"] == want[0]):
            raise _inconsistent(f"chunk {name} holds rows of another stream than {f['stream']!r}")
        site = rows["site"]
        if "site_lo" in f and (site.min() < f["site_lo"] or site.max() > f["site_hi"]):
            raise _inconsistent(
                f"chunk {name} holds sites outside its entry's {f['site_lo']}..{f['site_hi']}"
            )


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of recomputing every committed chunk's sha256 and accounting for every commit.

    ``failures`` lists ``(chunk or log name, code, message)``, each message naming the step range
    it leaves unaccounted for; ``ok`` is True only when it is empty.
    """

    checked_files: int
    checked_bytes: int
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    #: files in ``chunks/`` that no committed row names (left by a killed writer; harmless)
    orphans: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every committed chunk exists and matches its sha256, and no commit is unaccounted."""
        return not self.failures

    def raise_if_failed(self) -> None:
        """Raise the first failure as a :class:`Refusal` (all failures are in the message)."""
        if self.failures:
            name, code, _ = self.failures[0]
            listing = "; ".join(f"{n}: {m}" for n, _, m in self.failures[:10])
            raise Refusal(
                code,
                f"{len(self.failures)} committed chunk(s) damaged, first {name}: {listing}",
                ["restore the named chunks from a copy", "re-run the affected steps"],
            )


def _steps_of(row: dict[str, Any]) -> str:
    return f"steps {row['step_lo']}..{row['step_hi']} unaccounted for"


def list_chunks(chunk_dir: Path) -> list[str]:
    """The names in ``chunks/`` (sorted); a missing or linked directory refuses with a code."""
    try:
        return sorted(p.name for p in check_dir(chunk_dir, "chunk directory").iterdir())
    except Refusal:
        raise
    except OSError as exc:  # an unreadable directory (another user's run)
        raise Refusal(
            "history_artifact_missing",
            f"chunk directory {chunk_dir} cannot be listed ({exc.strerror}).",
            ["read the run as a user who may list chunks/", "or copy the run first"],
        ) from None


def verify_files(
    chunk_dir: Path,
    commits: list[dict[str, Any]],
    log_rows: dict[str, int] | None = None,
    listing: list[str] | None = None,
) -> VerifyReport:
    """Recompute the sha256 of each indexed chunk file under ``chunk_dir``.

    ``log_rows`` (rows read per segment log) lets chunks of unindexed *later* commits be reported
    as a shortened log (a killed commit leaves only the very next commit's chunks: an orphan).
    ``listing`` is ``chunks/`` as listed *before* ``log_rows`` were read (default: listed here):
    a live writer writes commit ``k``'s chunks only after row ``k - 1`` is durable, so a listing
    taken first never shows chunks beyond the next commit of the rows read after it.
    """
    failures: list[tuple[str, str, str]] = []
    nbytes = 0
    files = 0
    for row in commits:
        for f in row["files"]:
            files += 1
            try:
                data = read_regular(chunk_dir / f["name"], "chunk", max_bytes=f["bytes"])
            except Refusal as exc:
                failures.append((f["name"], exc.code, f"{exc.message} ({_steps_of(row)})"))
                continue
            nbytes += len(data)
            digest = hashlib.sha256(data).hexdigest()
            if digest != f["sha256"]:
                failures.append(
                    (
                        f["name"],
                        "history_artifact_corrupt",
                        f"sha256 {digest[:12]}… != indexed ({_steps_of(row)})",
                    )
                )
    named = {f["name"] for r in commits for f in r["files"]}
    if listing is None:
        try:
            listing = list_chunks(chunk_dir)
        except Refusal as exc:
            failures.append((chunk_dir.name, exc.code, exc.message))
            listing = []
    orphans = [n for n in listing if n not in named]
    shortened: dict[str, int] = {}
    for name in orphans:  # <segment>-<seq>-<table>.npy beyond the next commit: a lost row
        m = _CHUNK.match(name)
        if m is None or log_rows is None or f"{m['segment']}.log" not in log_rows:
            continue
        if int(m["seq"]) > log_rows[f"{m['segment']}.log"]:
            shortened[m["segment"]] = max(shortened.get(m["segment"], 0), int(m["seq"]))
    for seg, top in sorted(shortened.items()):
        n = (log_rows or {})[f"{seg}.log"]
        failures.append(
            (
                f"index/{seg}.log",
                "history_index_incomplete",
                f"the log lists {n} commits but chunks of commits up to {top} exist "
                f"(their steps are unaccounted for)",
            )
        )
    return VerifyReport(files, nbytes, failures, orphans)


_CHUNK = re.compile(r"^(?P<segment>[A-Za-z0-9_]+)-(?P<seq>\d{7})-")
