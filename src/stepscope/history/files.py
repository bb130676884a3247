"""Crash-safe file primitives: atomic replace, the checksummed append-only index log, safe JSON.

Durability order used everywhere: write a temporary file in the target directory, ``fsync`` it,
``os.replace`` it onto its name, ``fsync`` the directory. The index log is append-only; each line
is ``<sha256 of payload> <json payload>\\n`` and becomes committed when its newline is durable.
A final line without its newline is a torn tail (a kill mid-append) and is ignored; a complete
line whose checksum fails is corruption and refuses ``history_artifact_corrupt``.

Example
-------
>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> append_log_row(d / "x.log", {"seq": 0})
>>> read_log(d / "x.log").rows
[{'seq': 0}]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.errors import Refusal

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, new files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes, durable: bool) -> None:
    """Write every byte (``os.write`` may write less), fsync when durable, close ``fd``."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(
    path: Path, data: bytes, *, durable: bool = True, sync_dir: bool = True
) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new content.

    ``sync_dir=False`` leaves the directory fsync to the caller (one per batch of renames).
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    _write_all(fd, data, durable)
    os.replace(tmp, path)
    if durable and sync_dir:
        fsync_dir(path.parent)


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    """Atomically write ``obj`` as indented JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=1) + "\n").encode(), durable=durable)


def read_json(path: Path, what: str) -> dict[str, Any]:
    """Read a JSON object or refuse with a specific code (missing, malformed, not an object)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise Refusal(
            "history_artifact_missing",
            f"{what} {path} does not exist.",
            ["pass the directory of a stepscope history artifact", "check the path"],
        ) from None
    except OSError as exc:
        raise Refusal("history_artifact_missing", f"{what} {path} unreadable: {exc}.", []) from None
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise Refusal(
            "history_json_invalid",
            f"{what} {path} is not valid JSON ({type(exc).__name__}: {str(exc)[:120]}).",
            ["the file was truncated or edited; restore it from a copy", "re-run stepscope merge"],
        ) from None
    if not isinstance(obj, dict):
        raise Refusal(
            "history_json_invalid", f"{what} {path} holds {type(obj).__name__}, not an object.", []
        )
    return obj


def check_name(name: Any, what: str) -> str:
    """Return ``name`` if it is a plain file name (no separators, no ``..``), else refuse."""
    if (
        not isinstance(name, str)
        or not _SAFE_NAME.match(name)
        or ".." in name
        or "/" in name
        or "\\" in name
    ):
        raise Refusal(
            "history_chunk_name_invalid",
            f"{what} names {name!r}, which is not a plain file name inside the artifact.",
            ["the index was tampered with; restore it from a copy", "do not open untrusted runs"],
        )
    return name


def encode_log_row(row: dict[str, Any]) -> bytes:
    """One index-log line: ``<sha256 hex> <compact json>\\n``."""
    payload = json.dumps(row, separators=(",", ":"), sort_keys=True).encode()
    return hashlib.sha256(payload).hexdigest().encode() + b" " + payload + b"\n"


def append_log_row(path: Path, row: dict[str, Any], *, durable: bool = True) -> None:
    """Append one checksummed row with a single ``write`` and make it durable."""
    line = encode_log_row(row)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _write_all(fd, line, durable)


@dataclass(frozen=True)
class LogRead:
    """Rows of an index log from ``offset`` on; ``torn_tail_bytes`` were ignored."""

    rows: list[dict[str, Any]]
    next_offset: int
    torn_tail_bytes: int


def read_log(path: Path, offset: int = 0) -> LogRead:
    """Read the committed rows of an index log, verifying every row's checksum.

    A missing log reads as empty (a segment that never committed).
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return LogRead([], offset, 0)
    end = data.rfind(b"\n") + 1
    rows: list[dict[str, Any]] = []
    pos = 0
    for line in data[:end].split(b"\n")[:-1]:
        digest, _, payload = line.partition(b" ")
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise Refusal(
                "history_artifact_corrupt",
                f"index log {path.name} row at byte {offset + pos} fails its sha256.",
                ["restore the index log from a copy", "run `stepscope verify` to list all damage"],
            )
        try:
            row = json.loads(payload)
        except (ValueError, RecursionError):
            raise Refusal(
                "history_json_invalid", f"index log {path.name} row unreadable.", []
            ) from None
        if not isinstance(row, dict):
            raise Refusal("history_json_invalid", f"index log {path.name} row not an object.", [])
        rows.append(row)
        pos += len(line) + 1
    return LogRead(rows, offset + end, len(data) - end)


def sha256_file(path: Path) -> tuple[str, bytes]:
    """``(hex digest, bytes)`` of a file (one read; the bytes are reused to decode)."""
    data = path.read_bytes()
    return hashlib.sha256(data).hexdigest(), data
