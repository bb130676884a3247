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

from stepscope.errors import Refusal
from stepscope.history.files import check_name
from stepscope.history.layout import COUNT_DTYPES

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def _bad(log: str, what: str) -> Refusal:
    return Refusal(
        "history_json_invalid",
        f"index log {log}: {what}.",
        ["restore the index log from a copy", "run `stepscope verify`"],
    )


def _int(row: dict[str, Any], key: str, log: str) -> int:
    v = row.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise _bad(log, f"field {key!r} is {v!r}, not a non-negative int")
    return v


def validate_commit(row: Any, log: str) -> dict[str, Any]:
    """Check the shape of one index row; file names must be plain names (no ``/``, no ``..``)."""
    if not isinstance(row, dict):
        raise _bad(log, "a row is not an object")
    for key in ("seq", "step_lo", "step_hi", "n_steps"):
        _int(row, key, log)
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
        if not isinstance(f.get("table"), str) or not isinstance(
            f.get("stream"), (str, type(None))
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


@dataclass(frozen=True)
class VerifyReport:
    """Outcome of recomputing every committed chunk's sha256.

    ``failures`` lists ``(chunk name, code, message)``; ``ok`` is True only when it is empty.
    """

    checked_files: int
    checked_bytes: int
    failures: list[tuple[str, str, str]] = field(default_factory=list)
    #: files in ``chunks/`` that no committed row names (left by a killed writer; harmless)
    orphans: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every committed chunk exists and matches its sha256."""
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


def verify_files(chunk_dir: Path, files: list[dict[str, Any]]) -> VerifyReport:
    """Recompute the sha256 of each indexed chunk file under ``chunk_dir``."""
    failures: list[tuple[str, str, str]] = []
    nbytes = 0
    for f in files:
        path = chunk_dir / f["name"]
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            failures.append((f["name"], "history_artifact_missing", "file is missing"))
            continue
        nbytes += len(data)
        digest = hashlib.sha256(data).hexdigest()
        if digest != f["sha256"]:
            failures.append(
                (f["name"], "history_artifact_corrupt", f"sha256 {digest[:12]}… != indexed")
            )
    named = {f["name"] for f in files}
    orphans = sorted(p.name for p in chunk_dir.iterdir() if p.name not in named)
    return VerifyReport(len(files), nbytes, failures, orphans)
