"""What a reader may see of an artifact: its committed index rows, seals, manifest and catalog.

:class:`CommittedArtifact` reads ``index.json`` (checked against its own sha256), then every
index log it names (a torn final line is ignored; an ended segment's log must be sealed and is
read up to its seal), then the manifest and catalog whose sha256 the index names. It checks the
order of the rows and the segments they name, and picks up a live writer's new commits on
:meth:`~CommittedArtifact.refresh`. It decodes no chunk: the table and series views over the
committed chunks are :class:`~stepscope.history.reader.HistoryReader`'s, which extends this class.

Example
-------
>>> import tempfile, numpy as np
>>> from stepscope.history import HistoryWriter, StepBlockRecord
>>> path = tempfile.mkdtemp() + "/run"
>>> with HistoryWriter(path) as w:
...     _ = w.write_step(StepBlockRecord(0), [])
>>> c = CommittedArtifact(path)
>>> len(c.commits), c.commits[0]["step_lo"], c.torn_tail_bytes
(1, 0, 0)
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.files import (
    MAX_DECLARED,
    check_dir,
    check_name,
    json_file_bytes,
    json_sha256,
    parse_json_object,
    read_json,
    read_log,
    read_regular,
)
from stepscope.history.layout import (
    SCALAR_DTYPE,
    STEP_DTYPE,
    TABLES,
    histogram_dtype,
    observation_dtype,
    parse_catalog,
)
from stepscope.history.runrecord import FORMAT, SCHEMA_VERSION, RunRecord
from stepscope.history.verify import (
    VerifyReport,
    commit_inconsistencies,
    list_chunks,
    validate_commit,
    verify_files,
)
from stepscope.stats import HistogramDescriptor
from stepscope.stats.layout import SPINE_WIDTH

MAX_JSON = 64 << 20
#: The run log's evaluation lines beside the index (written by :mod:`stepscope.runlog`).
EVAL_LOG = "evals.log"


class CommittedArtifact:
    """The committed state of one artifact directory (see the module docstring).

    Attributes: ``commits`` (index rows in commit order), ``logs`` (index log names),
    ``sealed`` (the seals of ended logs), ``torn_tail_bytes``, ``segments`` and ``run`` (run
    records), ``descriptor``, ``sites``, ``scalar_names``, ``disclosures``, ``catalog_sha256``
    and ``catalog_confirmed``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not os.path.isdir(self.path):
            raise Refusal(
                "history_artifact_missing",
                f"{self.path} is not a directory.",
                ["pass the run directory that holds manifest.json, catalog.json and index.json"],
            )
        self.commits: list[dict[str, Any]] = []
        self.logs: list[str] = []
        self.torn_tail_bytes = 0
        #: ``{"index/<seg>.log" or "evals.log": {"rows": n, "bytes": b}}`` of ended segments
        self.sealed: dict[str, dict[str, int]] = {}
        self._offsets: dict[str, int] = {}
        self._rows: dict[str, int] = {}
        self.refresh()

    # -- loading -----------------------------------------------------------------------------
    def refresh(self) -> int:
        """Pick up commits a live writer made since the last read; returns how many."""
        for attempt in range(3):  # a writer starting a segment replaces manifest, then index
            index = _read_index(self.path)
            try:
                self._load_meta(index["manifest_sha256"], index.get("catalog_sha256"))
                break
            except _ManifestChanged:
                if attempt == 2:
                    raise Refusal(
                        "history_artifact_corrupt",
                        f"{self.path} manifest.json or catalog.json does not match the sha256 "
                        "in index.json.",
                        ["restore the file from a copy", "run `stepscope verify`"],
                    ) from None
        check_dir(self.path / "index", "index directory")
        check_dir(self.path / "chunks", "chunk directory")
        self.logs = [_log_name(x) for x in index["logs"]]
        self.sealed = index["sealed"]
        before = len(self.commits)
        torn = 0
        for i, name in enumerate(self.logs):
            seal = self.sealed.get(f"index/{name}")
            if seal is None and i < len(self.logs) - 1:
                raise _incomplete(f"index log {name} of an ended segment was never sealed")
            torn += self._read_log_rows(name, seal)
        self.torn_tail_bytes = torn
        self._check_segments()
        #: what the index rows contradict in each other (``verify`` lists them, reads refuse)
        self.inconsistencies = commit_inconsistencies(self.commits)
        last = self.commits[-1].get("catalog_sha256") if self.commits else None
        #: False when the catalog could not be matched to a checksum: a killed (unsealed) run
        #: whose catalog is newer than its last commit (or was edited). Disclosed by ``verify``.
        self.catalog_confirmed = "catalog_sha256" in index or last == self.catalog_sha256
        return len(self.commits) - before

    def _read_log_rows(self, name: str, seal: dict[str, int] | None) -> int:
        """Append the new rows of one log; returns its torn-tail bytes."""
        path = self.path / "index" / name
        offset = self._offsets.get(name, 0)
        got = read_log(path, offset, seal=seal)
        seq0 = self._rows.get(name, 0)
        n = seq0 + len(got.rows)
        if seal is None and os.path.lexists(self.path / "chunks" / _steps_chunk(name, n + 1)):
            # chunks of commit n + 1 are written only after row n is durable (a kill between
            # chunks and line leaves commit n's chunks only): the log lost rows, unless a live
            # writer appended since the read above, so read again after the check
            got = read_log(path, offset)
            if seq0 + len(got.rows) <= n:
                raise _incomplete(
                    f"index log {name} ends after {n} rows but chunks of commit {n + 1} exist"
                )
        for row in got.rows:
            validate_commit(row, name)
        rows = got.rows
        torn = got.torn_tail_bytes
        got_next = got.next_offset
        if seal is not None:  # rows past the seal are not part of the run: ignored
            rows = [r for r, o in zip(rows, got.row_offsets) if o < seal["bytes"]]
            torn, got_next = 0, max(offset, seal["bytes"])
        for k, row in enumerate(rows):
            if row["seq"] != seq0 + k:
                raise _incomplete(
                    f"index log {name} row {seq0 + k + 1} has seq {row['seq']}, expected "
                    f"{seq0 + k}: rows are missing or reordered before it"
                )
            self.commits.append(row)
        self._rows[name] = seq0 + len(rows)
        self._offsets[name] = got_next
        return torn

    def _load_meta(self, manifest_sha256: str, catalog_sha256: str | None) -> None:
        raw = read_regular(self.path / "manifest.json", "manifest", max_bytes=MAX_JSON)
        if hashlib.sha256(raw).hexdigest() != manifest_sha256:
            man = _before_new_segment(raw, manifest_sha256)
        else:
            man = parse_json_object(raw, self.path / "manifest.json", "manifest")
        if man.get("format") != FORMAT or man.get("schema_version") != SCHEMA_VERSION:
            raise Refusal(
                "history_schema_unsupported",
                f"manifest format {man.get('format')!r} version {man.get('schema_version')!r}; "
                f"this stepscope reads {FORMAT} version {SCHEMA_VERSION}.",
                ["open it with the stepscope version that wrote it"],
            )
        segs = man.get("segments")
        if not isinstance(segs, list) or not segs or not isinstance(man.get("descriptor"), dict):
            raise Refusal("history_json_invalid", "manifest lacks segments/descriptor.", [])
        self.segments = [RunRecord.from_dict(s) for s in segs]
        self.run = self.segments[0]
        try:
            self.descriptor = HistogramDescriptor.from_dict(man["descriptor"])
        except TypeError as exc:
            raise Refusal("history_json_invalid", f"manifest descriptor: {exc}", []) from None
        raw = read_regular(self.path / "catalog.json", "catalog", max_bytes=MAX_JSON)
        self.catalog_sha256 = hashlib.sha256(raw).hexdigest()
        if catalog_sha256 is not None and catalog_sha256 != self.catalog_sha256:
            raise _ManifestChanged
        self.sites, self.scalar_names, self.disclosures = parse_catalog(
            parse_json_object(raw, self.path / "catalog.json", "catalog")
        )
        known = {s.segment_id for s in self.segments}
        self._cutoff = {s.segment_id: np.iinfo(np.int64).max for s in self.segments}
        parents = {s.segment_id: s.parent_segment for s in self.segments}
        for s in self.segments:  # a resume supersedes every ancestor's steps from its step on
            ancestor, seen = s.parent_segment, {s.segment_id}
            while s.resumed_at_step is not None and ancestor in self._cutoff:
                if ancestor in seen:
                    raise Refusal("history_json_invalid", "manifest segments form a cycle.", [])
                seen.add(ancestor)
                self._cutoff[ancestor] = min(self._cutoff[ancestor], s.resumed_at_step)
                ancestor = parents[ancestor]
        self._known_segments = known
        self._dtypes = {
            "steps": STEP_DTYPE,
            "observations": observation_dtype(SPINE_WIDTH),
            "histograms": histogram_dtype(self.descriptor.width),
            "scalars": SCALAR_DTYPE,
        }

    def _check_segments(self) -> None:
        known = self._known_segments
        for row in self.commits:
            if row["segment"] not in known:
                raise Refusal(
                    "history_json_invalid",
                    f"index row names segment {row['segment']!r} absent from the manifest.",
                    ["restore manifest.json from a copy"],
                )

    @property
    def unknown_tables(self) -> set[str]:
        """Tables named in the index that this version does not read (newer row kinds)."""
        return {f["table"] for r in self.commits for f in r["files"]} - set(TABLES)

    # -- evals.log (rows of stepscope.runlog; decoded there: history never imports the layer) ---
    def eval_rows(self) -> list[dict[str, Any]]:
        """The rows of ``evals.log`` in file order, each checked but not interpreted.

        Every row's sha256, the seal of ended segments and each row's position ``n`` are checked
        (``history_artifact_corrupt`` / ``history_index_incomplete``); a torn final line is
        ignored. :func:`stepscope.runlog.read_eval_log` decodes them into evaluation records, and
        :func:`stepscope.open_run` gives the joint view (``.evals()``, ``.clocks()``).
        """
        for _attempt in range(3):
            try:
                return self._eval_rows()
            except _SegmentMoved:  # a resume started since this view was read: read it again
                self.refresh()
        return self._eval_rows(final=True)

    def _eval_rows(self, final: bool = False) -> list[dict[str, Any]]:
        seal = self.sealed.get(EVAL_LOG)
        got = read_log(self.path / EVAL_LOG, missing_ok=True, what="evaluation log", seal=seal)
        segments = [s.segment_id for s in self.segments]
        # past the seal, only the open (last, unsealed) segment may have appended
        open_segment = segments[-1] if f"index/{segments[-1]}.log" not in self.sealed else None
        for i, (row, at) in enumerate(zip(got.rows, got.row_offsets)):
            if row.get("n") != i:
                raise Refusal(
                    "history_index_incomplete",
                    f"{EVAL_LOG} row {i + 1} (byte {at}) says it is row {row.get('n')!r}: "
                    "rows before it were lost, duplicated or reordered.",
                    ["restore evals.log from a copy"],
                )
            if seal is not None and at >= seal["bytes"] and row.get("segment") != open_segment:
                seg = row.get("segment")
                if not final and _is_segment_log(self.path, seg):
                    raise _SegmentMoved  # a newer segment's row: this view predates its start
                raise Refusal(
                    "history_artifact_corrupt",
                    f"{EVAL_LOG} row at byte {at} was appended after its segment was sealed.",
                    ["restore evals.log from a copy"],
                )
        return list(got.rows)

    def verify(self) -> VerifyReport:
        """Recompute the sha256 of every committed chunk (including superseded segments).

        Each failure names the step range it leaves unaccounted for; chunks of commits that the
        index does not list (a shortened log) are failures too.
        """
        listing, failures = None, []
        try:
            listing = list_chunks(self.path / "chunks")
        except Refusal as exc:
            failures.append(("chunks", exc.code, exc.message))
        # a live writer's commits since the open, read *after* the listing: its next commit's
        # chunks (written before their row) are then never mistaken for a shortened log
        try:
            self.refresh()
        except Refusal as exc:
            failures.append(("index.json", exc.code, exc.message))
        report = verify_files(self.path / "chunks", self.commits, self._rows, listing or [])
        report.failures[:0] = failures
        report.failures.extend(self.inconsistencies)
        try:
            self.eval_rows()  # evals.log: every row's sha256, its seal, its position
        except Refusal as exc:
            report.failures.append((EVAL_LOG, exc.code, exc.message))
        return report

    def sizes(self) -> dict[str, int]:
        """Committed bytes per table."""
        out: dict[str, int] = {}
        for r in self.commits:
            for f in r["files"]:
                out[f["table"]] = out.get(f["table"], 0) + f["bytes"]
        return out


def _is_segment_log(path: Path, segment: Any) -> bool:
    """Whether ``segment`` names a segment whose log exists (a writer started it)."""
    return (
        isinstance(segment, str)
        and re.fullmatch(r"[A-Za-z0-9_]{1,64}", segment) is not None
        and os.path.lexists(path / "index" / f"{segment}.log")
    )


class _SegmentMoved(Exception):
    """``evals.log`` holds a row of a segment started after this view was read."""


class _ManifestChanged(Exception):
    """manifest/catalog do not match index.json (a segment start in progress, or damage)."""


def _before_new_segment(raw: bytes, manifest_sha256: str) -> dict[str, Any]:
    """The manifest ``index.json`` names, when ``man`` is it plus one new segment's record.

    A resume writes the manifest with its new segment first, then ``index.json``; a kill (or a
    read) between the two sees a manifest one segment ahead of the index. That segment has no
    log and no row yet: the committed run is the manifest without it, and its bytes (rewritten
    the way the writer writes them) must match the sha256 that ``index.json`` holds. Anything
    else is damage (or a writer mid-replace: the caller reads again).
    """
    try:
        man = parse_json_object(raw, Path("manifest.json"), "manifest")
    except Refusal:
        raise _ManifestChanged from None
    segs = man.get("segments")
    if isinstance(segs, list) and len(segs) >= 2:
        older = {**man, "segments": segs[:-1]}
        try:
            if hashlib.sha256(json_file_bytes(older)).hexdigest() == manifest_sha256:
                return older
        except (TypeError, ValueError):
            pass
    raise _ManifestChanged


def _steps_chunk(log: str, seq: int) -> str:
    """The steps chunk of commit ``seq`` of the segment whose log is ``log`` (every commit has one)."""
    return f"{log[: -len('.log')]}-{seq:07d}-steps.npy"


def _incomplete(what: str) -> Refusal:
    return Refusal(
        "history_index_incomplete",
        f"{what}.",
        ["restore the index from a copy", "run `stepscope verify` to list every gap"],
    )


def _read_index(path: Path) -> dict[str, Any]:
    """``index.json``, checked against its own sha256, with a valid ``sealed`` map."""
    index = read_json(path / "index.json", "index")
    claimed = index.pop("sha256", None)
    if claimed != json_sha256(index):
        raise Refusal(
            "history_artifact_corrupt",
            f"{path / 'index.json'} fails its sha256 (edited, damaged or from an older writer).",
            ["restore index.json from a copy"],
        )
    logs, sealed = index.get("logs"), index.get("sealed")
    if (
        index.get("format") != FORMAT
        or not isinstance(logs, list)
        or not isinstance(index.get("manifest_sha256"), str)
        or not isinstance(sealed, dict)
    ):
        raise Refusal("history_json_invalid", "index.json lacks format/logs/manifest/seals.", [])
    for key, seal in sealed.items():
        if (
            not isinstance(seal, dict)
            or set(seal) != {"rows", "bytes", "sha256"}
            or not isinstance(seal["sha256"], str)
            or not all(
                isinstance(seal[k], int)
                and not isinstance(seal[k], bool)
                and 0 <= seal[k] <= MAX_DECLARED
                for k in ("rows", "bytes")
            )
        ):
            raise Refusal("history_json_invalid", f"index.json seal of {key!r} is malformed.", [])
    return index


def _log_name(entry: Any) -> str:
    if not isinstance(entry, str) or not entry.startswith("index/"):
        raise Refusal(
            "history_chunk_name_invalid",
            f"index.json names log {entry!r} outside index/.",
            ["restore index.json from a copy"],
        )
    return check_name(entry[len("index/") :], "index.json")
