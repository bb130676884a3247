"""Read ``stepscope.history.v1`` artifacts: live, finished, or left behind by a killed writer.

The reader sees exactly the committed chunks: the index logs are read first (a torn final line is
ignored), then the catalog and manifest (written before any index row that needs them). Every chunk
is checked against its sha256 when it is decoded; filters by stream, step range and site skip
unrelated chunks without reading them. Missing is never zero: series carry a presence array.

The reader stays a reader of the history layer: it checks ``evals.log`` rows
(:meth:`HistoryReader.eval_rows`) but does not decode them. Evaluations and clocks are the run
log's (a higher layer): read them with :func:`stepscope.open_run` (``stepscope.open_history`` is
the same function), whose :class:`~stepscope.run.Run` is this reader plus ``.evals()``,
``.clocks()`` and ``.view()``. (``HistoryReader.evals()``/``.clocks()`` were removed from this
class when the layers were separated.)

Example
-------
>>> import tempfile, numpy as np
>>> from stepscope.history import ArtifactWriter, ObservationBatch, StepBlockRecord
>>> from stepscope.stats import SPINE_FIELDS, SPINE_WIDTH
>>> path = tempfile.mkdtemp() + "/run"
>>> with ArtifactWriter(path) as w:
...     fc1 = w.register_site("fc1", "torch.nn.Linear", "f32[8,4]")
...     for step in range(3):
...         spine = np.zeros((1, SPINE_WIDTH)); spine[0, :2] = 4  # total, finite
...         spine[0, SPINE_FIELDS.index("mean")] = step / 4
...         _ = w.write_step(StepBlockRecord(step), [ObservationBatch.observed("activation", "forward", [fc1], spine)])
>>> h = open_history(path)
>>> s = h.series("fc1", "activation", "mean")
>>> s.steps[s.valid].tolist(), s.values[s.valid].tolist()
([0, 1, 2], [0.0, 0.25, 0.5])
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.codec import parse_enum
from stepscope.errors import Refusal
from stepscope.history.batch import OBSERVED, code_of, member_of
from stepscope.history.files import (
    MAX_DECLARED,
    check_dir,
    check_name,
    json_sha256,
    parse_json_object,
    read_json,
    read_log,
    read_regular,
    sha256_file,
)
from stepscope.history.layout import (
    SCALAR_DTYPE,
    STEP_DTYPE,
    TABLES,
    decode_steps,
    histogram_dtype,
    npy_load,
    observation_dtype,
    parse_catalog,
)
from stepscope.history.schema import (
    FORMAT,
    SCHEMA_VERSION,
    Phase,
    Presence,
    RunRecord,
    SiteRecord,
    StepBlockRecord,
    Stream,
)
from stepscope.history.verify import VerifyReport, check_codes, validate_commit, verify_files


@dataclass(frozen=True)
class Series:
    """A step-indexed series. ``values`` is NaN wherever ``valid`` is False (never 0).

    ``presence`` holds :class:`Presence` storage codes (see :meth:`presence_names`);
    ``valid`` is ``presence == observed`` and a defined value (e.g. ``min`` of an all-NaN tensor
    is not defined).
    """

    field: str
    steps: np.ndarray
    values: np.ndarray
    presence: np.ndarray
    valid: np.ndarray
    site_ids: np.ndarray

    @property
    def valid_count(self) -> int:
        """Number of steps holding a defined value."""
        return int(self.valid.sum())

    def presence_names(self) -> np.ndarray:
        """``presence`` as strings (``"observed"``, ``"not_scheduled"``, ...)."""
        names = np.array(["invalid", *(p.value for p in Presence)])
        return names[self.presence]


@dataclass(frozen=True)
class HistogramSeries:
    """Histogram rows of one site/stream, only at the steps where one was taken."""

    steps: np.ndarray
    site_ids: np.ndarray
    counts: np.ndarray
    descriptor: Any

    def histogram(self, i: int) -> Any:
        """Row ``i`` as a ``stepscope.stats.Histogram``."""
        from stepscope.stats import Histogram

        return Histogram.from_vector(self.counts[i], self.descriptor)


class HistoryReader:
    """A read view of one artifact directory (see :func:`open_history`)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
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
        self._cache: dict[tuple, np.ndarray] = {}
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
        last = self.commits[-1].get("catalog_sha256") if self.commits else None
        #: False when the catalog could not be matched to a checksum: a killed (unsealed) run
        #: whose catalog is newer than its last commit (or was edited). Disclosed by ``verify``.
        self.catalog_confirmed = "catalog_sha256" in index or last == self.catalog_sha256
        self._steps: np.ndarray | None = None
        return len(self.commits) - before

    def _read_log_rows(self, name: str, seal: dict[str, int] | None) -> int:
        """Append the new rows of one log; returns its torn-tail bytes."""
        path = self.path / "index" / name
        offset = self._offsets.get(name, 0)
        got = read_log(path, offset, seal=seal)
        seq0 = self._rows.get(name, 0)
        n = seq0 + len(got.rows)
        if seal is None and (self.path / "chunks" / _steps_chunk(name, n + 1)).exists():
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

    def _load_meta(self, manifest_sha256: str, catalog_sha256: Any) -> None:
        from stepscope.stats import SPINE_WIDTH, HistogramDescriptor

        raw = read_regular(self.path / "manifest.json", "manifest", max_bytes=MAX_JSON)
        if hashlib.sha256(raw).hexdigest() != manifest_sha256:
            raise _ManifestChanged
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

    def _selected(
        self, table: str, stream: str | None, steps: tuple[int, int] | None, sites: Any
    ) -> list[tuple[dict, dict]]:
        out = []
        for row in self.commits:
            if row["step_lo"] >= self._cutoff[row["segment"]]:
                continue
            if steps is not None and (row["step_hi"] < steps[0] or row["step_lo"] > steps[1]):
                continue
            for f in row["files"]:
                if f["table"] != table or (stream is not None and f["stream"] != stream):
                    continue
                if sites is not None and "site_lo" in f:
                    if not ((sites >= f["site_lo"]) & (sites <= f["site_hi"])).any():
                        continue
                out.append((row, f))
        return out

    def _load(self, f: dict[str, Any]) -> np.ndarray:
        name = f["name"]
        key = (name, f["sha256"], f["table"], f.get("counts_dtype"))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        path = self.path / "chunks" / name
        digest, data = sha256_file(path, "committed chunk", max_bytes=f["bytes"])
        if digest != f["sha256"]:
            raise Refusal(
                "history_artifact_corrupt",
                f"committed chunk {name} fails its sha256 (expected {f['sha256'][:12]}…, "
                f"found {digest[:12]}…).",
                [
                    "restore the chunk from a copy or backup",
                    "run `stepscope verify` for all damage",
                ],
            )
        if f["table"] == "histograms":  # stored with the narrowest exact count dtype
            stored = histogram_dtype(self.descriptor.width, f.get("counts_dtype", "<i8"))
            array = npy_load(data, name, stored)
            if stored != self._dtypes["histograms"]:
                array = array.astype(self._dtypes["histograms"])
        else:
            array = npy_load(data, name, self._dtypes[f["table"]])
        if len(array) != f["rows"]:
            raise Refusal("history_artifact_corrupt", f"chunk {name} row count differs.", [])
        check_codes(array, f["table"], name, self.sites, self.scalar_names, self.disclosures)
        self._cache[key] = array
        return array

    def table(
        self,
        table: str,
        stream: Stream | str | None = None,
        steps: tuple[int, int] | None = None,
        site_ids: np.ndarray | None = None,
    ) -> np.ndarray:
        """Committed rows of one table as a structured array (the low-level access path)."""
        if table not in TABLES:
            raise Refusal("history_series_unknown", f"unknown table {table!r}; one of {TABLES}.")
        steps = check_steps(steps)
        sv = (
            None if stream is None else parse_enum(Stream, stream, "stream", "stream_unknown").value
        )
        parts = []
        for row, f in self._selected(table, sv, steps, site_ids):
            arr = self._load(f)
            cutoff = self._cutoff[row["segment"]]
            if steps is None and site_ids is None and row["step_hi"] < cutoff:
                parts.append(arr)  # the whole chunk is in view: no mask to build
                continue
            mask = arr["step"] < cutoff
            if steps is not None:
                mask &= (arr["step"] >= steps[0]) & (arr["step"] <= steps[1])
            if site_ids is not None and "site" in arr.dtype.names:
                mask &= np.isin(arr["site"], site_ids)
            parts.append(arr if mask.all() else arr[mask])
        if not parts:
            return np.empty(0, self._dtypes[table])
        return np.concatenate(parts)

    # -- user-facing views -------------------------------------------------------------------
    @property
    def steps(self) -> np.ndarray:
        """Committed optimizer steps (int64, increasing)."""
        if self._steps is None:
            self._steps = np.sort(self.table("steps")["step"])
        return self._steps

    def step_blocks(self, steps: tuple[int, int] | None = None) -> list[StepBlockRecord]:
        """Committed step blocks as records."""
        rows = self.table("steps", steps=steps)
        return decode_steps(rows[np.argsort(rows["step"], kind="stable")])

    def site_ids(self, site: int | str | SiteRecord) -> np.ndarray:
        """Series ids of a site: an id, a record, or a name (all series ever bound to it)."""
        if isinstance(site, SiteRecord):
            site = site.site_id
        if isinstance(site, (int, np.integer)) and 0 <= site < len(self.sites):
            return np.array([site], dtype=np.int32)
        ids = [s.site_id for s in self.sites if s.name == site]
        if not ids:
            raise Refusal(
                "history_series_unknown",
                f"no site {site!r} in {self.path}.",
                ["list the sites with `stepscope show RUN` or reader.sites"],
            )
        return np.array(ids, dtype=np.int32)

    def _cells(self, table: str, site: Any, stream: Any, phase: Any, steps: Any, micro: Any):
        ids = self.site_ids(site)
        if micro is not None and (
            isinstance(micro, bool) or not isinstance(micro, (int, np.integer)) or micro < 0
        ):
            raise Refusal("history_query_invalid", f"micro_batch {micro!r} is not an int >= 0.")
        rows = self.table(table, stream, steps, ids)
        rows = rows[rows["micro_batch"] == (-1 if micro is None else micro)]
        if phase is not None:
            rows = rows[
                rows["phase"]
                == code_of(parse_enum(Phase, phase, "phase", "history_series_unknown"))
            ]
        elif len(np.unique(rows["phase"])) > 1:
            names = sorted(member_of(Phase, c).value for c in np.unique(rows["phase"]))
            raise Refusal(
                "history_series_unknown",
                f"{stream} of {site!r} was observed in phases {names}.",
                [f"pass phase= one of {names}"],
            )
        return rows[np.lexsort((rows["site"], rows["step"]))]

    def series(
        self,
        site: int | str | SiteRecord,
        stream: Stream | str,
        field: str,
        *,
        phase: Phase | str | None = None,
        steps: tuple[int, int] | None = None,
        micro_batch: int | None = None,
    ) -> Series:
        """One spine field of one site and stream over steps (inclusive ``steps`` range).

        ``micro_batch=None`` selects whole-step cells; an int selects that micro-batch's cells.
        """
        from stepscope.stats import SPINE_FIELDS

        if field not in SPINE_FIELDS:
            raise Refusal(
                "history_series_unknown", f"unknown field {field!r}.", [f"one of {SPINE_FIELDS}"]
            )
        rows = self._cells("observations", site, stream, phase, steps, micro_batch)
        values = rows["spine"][:, SPINE_FIELDS.index(field)].copy()
        valid = (rows["presence"] == OBSERVED) & ~np.isnan(values)
        values[~valid] = np.nan
        return Series(
            field, rows["step"].copy(), values, rows["presence"].copy(), valid, rows["site"].copy()
        )

    def histograms(
        self,
        site: int | str | SiteRecord,
        stream: Stream | str,
        *,
        phase: Phase | str | None = None,
        steps: tuple[int, int] | None = None,
        micro_batch: int | None = None,
    ) -> HistogramSeries:
        """The histogram rows of one site and stream (only steps where one was taken)."""
        rows = self._cells("histograms", site, stream, phase, steps, micro_batch)
        return HistogramSeries(
            rows["step"].copy(), rows["site"].copy(), rows["counts"].copy(), self.descriptor
        )

    def scalars(self, name: str, steps: tuple[int, int] | None = None) -> Series:
        """A user scalar series (rows exist only where it was logged)."""
        if name not in self.scalar_names:
            raise Refusal(
                "history_series_unknown", f"no scalar {name!r}.", [f"one of {self.scalar_names}"]
            )
        rows = self.table("scalars", steps=steps)
        rows = rows[rows["name"] == self.scalar_names.index(name)]
        rows = rows[np.argsort(rows["step"], kind="stable")]
        n = len(rows)
        return Series(
            name,
            rows["step"].copy(),
            rows["value"].copy(),
            np.full(n, OBSERVED, np.uint8),
            np.ones(n, bool),
            np.full(n, -1, np.int32),
        )

    # -- evals.log (rows of stepscope.runlog; decoded there: history never imports the layer) ---
    def eval_rows(self) -> list[dict[str, Any]]:
        """The rows of ``evals.log`` in file order, each checked but not interpreted.

        Every row's sha256, the seal of ended segments and each row's position ``n`` are checked
        (``history_artifact_corrupt`` / ``history_index_incomplete``); a torn final line is
        ignored. :func:`stepscope.runlog.read_eval_log` decodes them into evaluation records, and
        :func:`stepscope.open_run` gives the joint view (``.evals()``, ``.clocks()``).
        """
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
                raise Refusal(
                    "history_artifact_corrupt",
                    f"{EVAL_LOG} row at byte {at} was appended after its segment was sealed.",
                    ["restore evals.log from a copy"],
                )
        return list(got.rows)

    def observations(
        self,
        site: int | str | SiteRecord | None = None,
        stream: Stream | str | None = None,
        steps: tuple[int, int] | None = None,
    ) -> list:
        """Decoded :class:`ObservationRecord` objects (convenient, not the fast path)."""
        from stepscope.history.decode import records_from_rows

        ids = None if site is None else self.site_ids(site)
        obs = self.table("observations", stream, steps, ids)
        hist = self.table("histograms", stream, steps, ids)
        return records_from_rows(obs, hist, self.disclosures, self.descriptor)

    def verify(self) -> VerifyReport:
        """Recompute the sha256 of every committed chunk (including superseded segments).

        Each failure names the step range it leaves unaccounted for; chunks of commits that the
        index does not list (a shortened log) are failures too.
        """
        report = verify_files(self.path / "chunks", self.commits, self._rows)
        try:
            self.eval_rows()  # evals.log: every row's sha256, its seal, its position
        except Refusal as exc:
            report.failures.append((EVAL_LOG, exc.code, exc.message))
        return report

    def clear_cache(self) -> None:
        """Forget decoded chunks (they are re-read and re-verified on next use)."""
        self._cache.clear()

    def sizes(self) -> dict[str, int]:
        """Committed bytes per table."""
        out: dict[str, int] = {}
        for r in self.commits:
            for f in r["files"]:
                out[f["table"]] = out.get(f["table"], 0) + f["bytes"]
        return out


MAX_JSON = 64 << 20
#: The run log's evaluation lines beside the index (written by :mod:`stepscope.runlog`).
EVAL_LOG = "evals.log"


class _ManifestChanged(Exception):
    """manifest/catalog do not match index.json (a segment start in progress, or damage)."""


def check_steps(steps: Any) -> tuple[int, int] | None:
    """An inclusive ``(first, last)`` step range of ints, or None; else ``history_query_invalid``.

    >>> check_steps([2, 5])
    (2, 5)
    """
    if steps is None:
        return None
    if (
        not isinstance(steps, (tuple, list))
        or len(steps) != 2
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in steps)
        or steps[0] > steps[1]
    ):
        raise Refusal(
            "history_query_invalid",
            f"steps={steps!r} is not an inclusive (first, last) pair of ints.",
            ["pass steps=(first, last) with first <= last, or None for all steps"],
        )
    return int(steps[0]), int(steps[1])


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


def open_history(path: str | os.PathLike[str]) -> HistoryReader:
    """Open a history artifact for reading (also while its writer is still appending).

    Parameters
    ----------
    path
        The run directory written by :class:`~stepscope.history.ArtifactWriter`.

    Returns
    -------
    HistoryReader
        ``.run``, ``.segments``, ``.sites``, ``.steps``, ``.series()``, ``.histograms()``,
        ``.scalars()``, ``.observations()``, ``.verify()``, ``.refresh()``. Evaluations and
        clocks: :func:`stepscope.open_run`.
    """
    return HistoryReader(path)
