"""The rows an :class:`~stepscope.history.HistoryWriter` holds between commits, and their chunks.

:class:`PendingRows` collects encoded step blocks, observation and histogram rows and scalar
rows; at a commit :meth:`PendingRows.tables` names the tables that become chunk files, and
:func:`write_chunk` writes one (temporary file, fsync, rename) and returns its index entry.
While commits fail on the disk, :meth:`PendingRows.drop_oldest_payloads` bounds what stays in
RAM: the oldest steps' cells become ``budget_dropped`` rows disclosed ``disk_fault``. A step the
background writer had no room for keeps its cells the same way, disclosed ``writer_behind``
(:meth:`PendingRows.add_dropped`); both go through :func:`drop_payloads`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.batch import ObservationBatch, code_of
from stepscope.history.files import atomic_write_bytes
from stepscope.history.layout import (
    SCALAR_DTYPE,
    concat_rows,
    encode_steps,
    narrow_histograms,
    npy_bytes,
)
from stepscope.history.schema import StepBlockRecord
from stepscope.history.vocab import Presence


@dataclass(frozen=True)
class CloseReport:
    """What :meth:`HistoryWriter.close` left on disk.

    ``uncommitted_steps`` steps were written but could not be committed (the disk kept failing);
    ``dropped_steps`` steps had their payload dropped (disclosed ``disk_fault`` rows, if later
    committed); ``behind_steps`` steps arrived while the background writer's queue was full
    (their cells disclosed ``writer_behind``, their blocks and scalars kept); ``faults`` are the
    ``history_disk_fault`` refusals, oldest first.

    >>> CloseReport(committed_step=9, uncommitted_steps=0, dropped_steps=0, faults=()).ok
    True
    >>> CloseReport(9, 0, 0, (), behind_steps=2).ok
    False
    """

    committed_step: int | None
    uncommitted_steps: int
    dropped_steps: int
    faults: tuple[Refusal, ...]
    behind_steps: int = 0

    @property
    def ok(self) -> bool:
        """Everything written was committed and nothing was dropped."""
        return not (self.uncommitted_steps or self.dropped_steps or self.behind_steps)


def check_commit_policy(steps: Any, seconds: Any, pending: Any, queued: Any = None) -> None:
    """Refuse a commit policy that is not ``commit_steps >= 1``, ``commit_seconds > 0`` (finite)
    or ``None``, and ``max_pending_steps`` / ``max_queued_steps`` ``>= 1`` or ``None``."""
    named = (("commit_steps", steps), ("max_pending_steps", pending), ("max_queued_steps", queued))
    for name, v in named:
        if v is None and name != "commit_steps":
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise Refusal(
                "settings_invalid",
                f"{name} must be an int, not {type(v).__name__}.",
                [f"pass {name}= a plain int >= 1, e.g. {name}=32"],
            )
        if v < 1:
            raise Refusal("settings_invalid", f"{name} must be >= 1, not {v}.")
    if seconds is not None:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise Refusal(
                "settings_invalid",
                f"commit_seconds must be a number or None, not {type(seconds).__name__}.",
                ["pass commit_seconds= a finite number > 0, e.g. 10.0, or None"],
            )
        if not (seconds > 0 and seconds != float("inf")):
            raise Refusal(
                "settings_invalid", f"commit_seconds must be finite and > 0, not {seconds}."
            )


def check_unique(batches: Sequence[ObservationBatch]) -> None:
    """Refuse ``stat_payload_invalid`` when a (site, stream, phase, micro_batch) cell repeats.

    Checked on the batches themselves (no encoding: the background writer encodes later).
    """
    if len(batches) < 2:
        return
    # one int64 key per cell: site | micro_batch | stream | phase (cheaper than a record sort)
    keys = np.concatenate(
        [
            (b.site_ids.astype(np.int64) << 32)
            | (((-1 if b.micro_batch is None else int(b.micro_batch)) + 1) << 16)
            | (code_of(b.stream) << 8)
            | code_of(b.phase)
            for b in batches
        ]
    )
    if len(np.unique(keys)) != len(keys):
        raise Refusal(
            "stat_payload_invalid",
            "a (site, stream, phase, micro_batch) cell appears twice in one step.",
            ["send each cell once per step"],
        )


DROPPED = code_of(Presence.BUDGET_DROPPED)


def drop_payloads(obs: np.ndarray, sel: np.ndarray, disclosure: int) -> None:
    """Turn the observation rows ``sel`` into ``budget_dropped`` rows disclosed ``disclosure``
    (spine NaN, no reduction dtype; their key and ``scale_grad`` are kept), in place.

    >>> from stepscope.history.layout import observation_dtype
    >>> rows = np.zeros(3, observation_dtype(15))
    >>> drop_payloads(rows, np.array([False, True, True]), disclosure=4)
    >>> (rows["presence"] == DROPPED).tolist(), rows["disclosure"].tolist()
    ([False, True, True], [0, 4, 4])
    >>> bool(np.isnan(rows["spine"][1:]).all())
    True
    """
    obs["presence"][sel] = DROPPED
    obs["spine"][sel] = np.nan
    obs["disclosure"][sel] = disclosure
    obs["rdtype"][sel] = 0


@dataclass
class PendingRows:
    """Encoded rows written since the last commit, grouped by table and stream."""

    steps: list[StepBlockRecord] = field(default_factory=list)
    obs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    hist: dict[str, list[np.ndarray]] = field(default_factory=dict)
    scalars: list[tuple[int, int, float]] = field(default_factory=list)
    dropped_seen: set[int] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.steps or self.scalars)

    def add(self, stream: str, obs: np.ndarray, hist: np.ndarray | None) -> None:
        """Keep one encoded batch of ``stream`` (observation rows, histogram rows or None)."""
        self.obs.setdefault(stream, []).append(obs)
        if hist is not None:
            self.hist.setdefault(stream, []).append(hist)

    def add_dropped(self, stream: str, obs: np.ndarray, step: int, disclosure: int) -> None:
        """Keep one encoded batch of ``step`` as ``budget_dropped`` rows with ``disclosure``
        (a step counted elsewhere: :meth:`drop_oldest_payloads` does not count it again).

        >>> from stepscope.history.layout import observation_dtype
        >>> p = PendingRows()
        >>> p.add_dropped("activation", np.zeros(2, observation_dtype(15)), step=7, disclosure=0)
        >>> p.obs["activation"][0]["presence"].tolist() == [DROPPED] * 2, p.dropped_seen
        (True, {7})
        """
        drop_payloads(obs, np.ones(len(obs), bool), disclosure)
        self.add(stream, obs, None)
        self.dropped_seen.add(step)

    def step_range(self) -> tuple[int, int]:
        """The lowest and highest step of every pending step block and scalar row."""
        steps = [b.optimizer_step for b in self.steps] + [s[0] for s in self.scalars]
        return min(steps), max(steps)

    def tables(self) -> list[tuple[str, str | None, np.ndarray]]:
        """``(table, stream, rows)`` of each chunk a commit writes, step blocks first."""
        out: list[tuple[str, str | None, np.ndarray]] = [("steps", None, encode_steps(self.steps))]
        for stream, parts in self.obs.items():
            out.append(("observations", stream, concat_rows(parts)))
        for stream, parts in self.hist.items():
            out.append(("histograms", stream, concat_rows(parts)))  # narrowed on write
        if self.scalars:
            out.append(("scalars", None, np.array(self.scalars, dtype=SCALAR_DTYPE)))
        return out

    def drop_oldest_payloads(self, max_pending_steps: int, disclosure: int) -> int:
        """Keep at most ``max_pending_steps`` steps' payloads; older cells become
        ``budget_dropped`` rows with ``disclosure``. Returns the steps newly dropped."""
        excess = len(self.steps) - max_pending_steps
        if excess <= 0:
            return 0
        last_dropped = self.steps[excess - 1].optimizer_step
        for parts in self.obs.values():
            for arr in parts:
                if not len(arr) or arr["step"][0] > last_dropped:
                    continue
                sel = (arr["step"] <= last_dropped) & (arr["presence"] != DROPPED)
                drop_payloads(arr, sel, disclosure)
        for stream, parts in self.hist.items():
            self.hist[stream] = [a[a["step"] > last_dropped] for a in parts]
        newly = sum(1 for b in self.steps[:excess] if b.optimizer_step not in self.dropped_seen)
        self.dropped_seen.update(b.optimizer_step for b in self.steps[:excess])
        return newly


def write_chunk(
    chunks: Path, prefix: str, table: str, stream: str | None, arr: np.ndarray, durable: bool
) -> dict[str, Any]:
    """Write one chunk file under ``chunks`` and return its index entry (name, rows, sha256)."""
    name = f"{prefix}-{table}" + (f"-{stream}" if stream else "") + ".npy"
    counts_dtype = None
    if table == "histograms":
        arr, counts_dtype = narrow_histograms(arr)
    data = npy_bytes(arr)
    # temp + fsync + rename; the chunks/ directory is fsynced once per commit by the caller
    atomic_write_bytes(chunks / name, data, durable=durable, sync_dir=False)
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
