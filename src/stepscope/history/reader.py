"""Read ``stepscope.history.v1`` artifacts: live, finished, or left behind by a killed writer.

The reader sees exactly the committed chunks: the index logs are read first (a torn final line is
ignored), then the catalog and manifest (written before any index row that needs them). Every chunk
is checked against its sha256 when it is decoded; filters by stream, step range and site skip
unrelated chunks without reading them. Missing is never zero: series carry a presence array.
Reading the index logs, seals, manifest and catalog is :mod:`stepscope.history.commits`
(``CommittedArtifact``, which :class:`HistoryReader` extends); this module holds the views over
the committed chunks.

:class:`HistoryReader` is the history layer's reader, internal to stepscope (it is in no
``__all__``): users open a run with :func:`stepscope.open_run`, whose
:class:`~stepscope.run.Run` is this reader plus the run log's ``.evals()``, ``.clocks()``,
``.view()`` and the flight recorder's ``.spikes()``. Lower layers (the exporters, the probe's
axes, the collector's store) read with this class, because ``run`` sits above them. It checks
``evals.log`` rows (:meth:`HistoryReader.eval_rows`) but does not decode them (the run log does).

Example
-------
>>> import tempfile, numpy as np
>>> from stepscope.history import HistoryWriter, ObservationBatch, StepBlockRecord
>>> from stepscope.stats import SPINE_FIELDS, SPINE_WIDTH
>>> path = tempfile.mkdtemp() + "/run"
>>> with HistoryWriter(path) as w:
...     fc1 = w.register_site("fc1", "torch.nn.Linear", "f32[8,4]")
...     for step in range(3):
...         spine = np.zeros((1, SPINE_WIDTH)); spine[0, :2] = 4  # total, finite
...         spine[0, SPINE_FIELDS.index("mean")] = step / 4
...         _ = w.write_step(StepBlockRecord(step), [ObservationBatch.observed("activation", "forward", [fc1], spine)])
>>> h = HistoryReader(path)
>>> s = h.series("fc1", "activation", "mean")
>>> s.steps[s.valid].tolist(), s.values[s.valid].tolist()
([0, 1, 2], [0.0, 0.25, 0.5])
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from stepscope.codec import parse_enum
from stepscope.errors import Refusal
from stepscope.history.batch import OBSERVED, code_of, member_of
from stepscope.history.commits import CommittedArtifact
from stepscope.history.decode import records_from_rows
from stepscope.history.files import sha256_file
from stepscope.history.frames import series_label, site_int_refusal
from stepscope.history.layout import (
    TABLES,
    concat_rows,
    decode_steps,
    histogram_dtype,
    npy_load,
)
from stepscope.history.schema import ObservationRecord, SiteRecord, StepBlockRecord
from stepscope.history.series import HistogramSeries, Series, check_steps
from stepscope.history.verify import VerifyReport, check_chunk, check_codes
from stepscope.history.vocab import Phase, Stream
from stepscope.stats.layout import FIELD_INDEX, SPINE_FIELDS

__all__: list[str] = []  # internal: users read runs with stepscope.open_run


class HistoryReader(CommittedArtifact):
    """A read view of one artifact directory (internal: users call :func:`stepscope.open_run`).

    The committed state (index rows, seals, segments, manifest, catalog, :meth:`refresh`,
    :meth:`eval_rows`, :meth:`verify`) is :class:`~stepscope.history.commits.CommittedArtifact`'s;
    this class adds the views over the committed chunks, each checked against its sha256 when
    it is decoded.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._cache: dict[tuple, np.ndarray] = {}
        self._steps: np.ndarray | None = None
        super().__init__(path)

    def refresh(self) -> int:
        """Pick up commits a live writer made since the last read; returns how many."""
        added = super().refresh()
        self._steps = None
        return added

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

    def _load(self, f: dict[str, Any], row: dict[str, Any], cache: bool = True) -> np.ndarray:
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
        check_chunk(array, row, f)
        if cache:
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
        if self.inconsistencies:  # checksums hold, but the index contradicts itself
            _name, code, message = self.inconsistencies[0]
            raise Refusal(code, message, ["run `stepscope verify` to list every inconsistency"])
        sv = (
            None if stream is None else parse_enum(Stream, stream, "stream", "stream_unknown").value
        )
        parts = []
        for row, f in self._selected(table, sv, steps, site_ids):
            arr = self._load(f, row)
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
        return concat_rows(parts)

    # -- user-facing views -------------------------------------------------------------------
    @property
    def steps(self) -> np.ndarray:
        """Committed optimizer steps (int64, increasing)."""
        if self._steps is None:
            steps = np.sort(self.table("steps")["step"])
            if len(steps) > 1 and not np.all(np.diff(steps) > 0):
                twice = np.unique(steps[1:][np.diff(steps) == 0])[:5].tolist()
                raise Refusal(
                    "history_artifact_inconsistent",
                    f"{self.path} holds steps {twice} in more than one commit.",
                    ["restore the artifact from a copy", "run `stepscope verify`"],
                )
            self._steps = steps
        return self._steps

    def step_blocks(self, steps: tuple[int, int] | None = None) -> list[StepBlockRecord]:
        """Committed step blocks as records."""
        rows = self.table("steps", steps=steps)
        return decode_steps(rows[np.argsort(rows["step"], kind="stable")])

    def site_ids(self, site: int | str | SiteRecord) -> np.ndarray:
        """Site ids of a site: an id, a record, or a name (every site record of that name)."""
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
        if stream is None:  # table(stream=None) is every stream: a series is one stream's
            raise Refusal(
                "stream_unknown",
                "a series needs its stream; None would mix every stream's rows.",
                ["pass stream= one of " + ", ".join(s.value for s in Stream)],
            )
        if isinstance(site, (int, np.integer)):  # series(1, ...) meant the site named "1"
            raise site_int_refusal(site, self.sites)
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
        site: str | SiteRecord,
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
        if field not in SPINE_FIELDS:
            raise Refusal(
                "history_series_unknown", f"unknown field {field!r}.", [f"one of {SPINE_FIELDS}"]
            )
        rows = self._cells("observations", site, stream, phase, steps, micro_batch)
        values = rows["spine"][:, FIELD_INDEX[field]].copy()
        valid = (rows["presence"] == OBSERVED) & ~np.isnan(values)
        values[~valid] = np.nan
        return Series(
            field, rows["step"].copy(), values, rows["presence"].copy(), valid, rows["site"].copy(),
            **series_label(self, site, stream),
        )  # fmt: skip

    def histograms(
        self,
        site: str | SiteRecord,
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
            stream="scalar",
        )

    def observations(
        self,
        site: int | str | SiteRecord | None = None,
        stream: Stream | str | None = None,
        steps: tuple[int, int] | None = None,
    ) -> list[ObservationRecord]:
        """Decoded :class:`ObservationRecord` objects (convenient, not the fast path)."""
        ids = None if site is None else self.site_ids(site)
        obs = self.table("observations", stream, steps, ids)
        hist = self.table("histograms", stream, steps, ids)
        return records_from_rows(obs, hist, self.disclosures, self.descriptor)

    def verify(self) -> VerifyReport:
        """Every chunk's sha256 (see :meth:`CommittedArtifact.verify`), and its consistency.

        Each chunk whose bytes match is decoded and checked against its index entry (steps
        within the commit's range, its stream and sites, its row count and codes); each failure
        is listed, and steps held by more than one commit are one more. A live run is verified
        as of the commits read (:meth:`refresh` picks up newer ones): a commit in progress is
        never damage.
        """
        report = super().verify()
        broken = {name for name, _, _ in report.failures}
        for row in self.commits:
            for f in row["files"]:
                if f["name"] in broken or f["table"] not in TABLES:
                    continue
                try:
                    self._load(f, row, cache=False)  # one chunk at a time in RAM
                except Refusal as exc:
                    report.failures.append((f["name"], exc.code, exc.message))
        if not report.failures:
            try:
                self._steps = None
                _ = self.steps
            except Refusal as exc:
                report.failures.append(("steps", exc.code, exc.message))
        return report

    def clear_cache(self) -> None:
        """Forget decoded chunks (they are re-read and re-verified on next use)."""
        self._cache.clear()
