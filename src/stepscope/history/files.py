"""Crash-safe file primitives: atomic replace, the checksummed append-only index log, safe reads.

Durability order used everywhere: write a temporary file in the target directory, ``fsync`` it,
``os.replace`` it onto its name, ``fsync`` the directory. The index log is append-only; each line
is ``<sha256 of payload> <json payload>\\n`` and becomes committed when its newline is durable.
A final line without its newline is a torn tail (a kill or a full disk mid-append): the reader
ignores it and discloses its size, and the next append first truncates it away, so a torn tail
never sits in front of a later row. A complete line whose checksum fails is corruption and
refuses ``history_artifact_corrupt`` with its byte offset.

Every read goes through :func:`read_regular`: it never follows a symbolic link, never blocks on a
FIFO or device (it refuses anything but a regular file, ``history_file_kind_invalid``) and refuses
a file larger than the size its index declares before reading it.

Example
-------
>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> append_log_row(d / "x.log", {"seq": 0})
>>> read_log(d / "x.log").rows
[{'seq': 0}]
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.errors import Refusal

_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
#: The largest JSON file (manifest, catalog, index, summary) a reader accepts, in bytes.
MAX_JSON_BYTES = 64 << 20
#: The largest size or count an index may declare (larger cannot be a real file or row count).
MAX_DECLARED = 1 << 62


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
            n = os.write(fd, view)
            if n <= 0:  # a write that makes no progress is a full disk, never a spin
                raise OSError(errno.ENOSPC, "no progress writing the file")
            view = view[n:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(
    path: Path, data: bytes, *, durable: bool = True, sync_dir: bool = True
) -> None:
    """Write ``data`` to ``path`` so that readers see either the old or the new content.

    ``sync_dir=False`` leaves the directory fsync to the caller (one per batch of renames).
    A failed write (a full or read-only disk) removes its temporary file and re-raises.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _NOFOLLOW, 0o644)
        _write_all(fd, data, durable)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable and sync_dir:
        fsync_dir(path.parent)


def json_file_bytes(obj: Any) -> bytes:
    """The bytes :func:`atomic_write_json` writes for ``obj`` (indented, standard JSON).

    Deterministic: parsing a file and passing the object back gives the same bytes, so a
    reader can recompute the sha256 of an edited copy (e.g. a manifest less its last segment).
    """
    return (json.dumps(obj, indent=1, allow_nan=False) + "\n").encode()


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    """Atomically write ``obj`` as indented, standard JSON (a bare NaN or infinity raises
    ``ValueError``: spell it with :func:`stepscope.codec.json_float`)."""
    atomic_write_bytes(path, json_file_bytes(obj), durable=durable)


def _kind_refusal(path: Path, what: str, kind: str) -> Refusal:
    return Refusal(
        "history_file_kind_invalid",
        f"{what} {path} is {kind}, not a regular file inside the artifact.",
        ["replace it with the regular file from a copy", "do not open untrusted runs"],
    )


def _open_regular(path: Path, what: str, flags: int) -> int:
    """Open ``path`` without following a link or blocking; refuse anything but a regular file."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK)
    except FileNotFoundError:
        raise Refusal(
            "history_artifact_missing",
            f"{what} {path} does not exist.",
            ["pass the directory of a stepscope history artifact", "restore it from a copy"],
        ) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK):
            raise _kind_refusal(path, what, "a symbolic link") from None
        if exc.errno == errno.EISDIR:
            raise _kind_refusal(path, what, "a directory") from None
        if exc.errno == errno.ENOTDIR:
            raise _kind_refusal(path, what, "under a non-directory") from None
        if flags & os.O_ACCMODE != os.O_RDONLY:
            raise  # a write that the disk refuses (EROFS, ENOSPC, EIO) is a disk fault
        raise Refusal(
            "history_artifact_missing", f"{what} {path} unreadable: {exc.strerror}.", []
        ) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a FIFO, socket or device"
        raise _kind_refusal(path, what, kind)
    if flags & os.O_ACCMODE == os.O_RDONLY and _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def read_regular(path: Path, what: str, *, max_bytes: int | None = None, offset: int = 0) -> bytes:
    """Read a regular file from ``offset`` on; refuse links, non-files and oversize files.

    ``max_bytes`` bounds the whole file: a larger one refuses ``history_artifact_corrupt``
    before anything is read (an index declares each chunk's size).
    """
    fd = _open_regular(path, what, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise Refusal(
                "history_artifact_corrupt",
                f"{what} {path} holds {size} bytes, more than the {max_bytes} declared.",
                ["restore it from a copy", "run `stepscope verify` to list all damage"],
            )
        parts, pos = [], offset
        while pos < size:  # never more than the size seen by fstat, even if the file grows
            got = os.pread(fd, min(size - pos, 1 << 24), pos)
            if not got:
                break
            parts.append(got)
            pos += len(got)
        return b"".join(parts)
    except Refusal:  # a RefusalStorageError is an OSError too: keep its own code
        raise
    except OSError as exc:
        raise Refusal("history_artifact_missing", f"{what} {path}: {exc.strerror}.", []) from None
    finally:
        os.close(fd)


def check_dir(path: Path, what: str) -> Path:
    """Return ``path`` if it is a real directory (not a link to one), else refuse with a code."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        raise Refusal(
            "history_artifact_missing",
            f"{what} {path} does not exist.",
            ["restore the directory from a copy", "run `stepscope verify` to list all damage"],
        ) from None
    if stat.S_ISLNK(mode):
        raise _kind_refusal(path, what, "a symbolic link")
    if not stat.S_ISDIR(mode):
        raise _kind_refusal(path, what, "not a directory")
    return path


def read_json(path: Path, what: str, max_bytes: int = MAX_JSON_BYTES) -> dict[str, Any]:
    """Read a JSON object or refuse with a specific code (missing, malformed, not an object)."""
    return parse_json_object(read_regular(path, what, max_bytes=max_bytes), path, what)


def parse_json_object(raw: bytes, path: Path, what: str) -> dict[str, Any]:
    """Parse the bytes of a JSON object file, refusing ``history_json_invalid`` otherwise."""
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


def json_sha256(obj: Any) -> str:
    """sha256 of the canonical (sorted, compact) JSON of ``obj``."""
    payload = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    return hashlib.sha256(payload).hexdigest()


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


def _end_of_last_line(fd: int, size: int) -> int:
    """Offset just past the last newline of the file (0 when it holds none)."""
    pos = size
    while pos > 0:
        start = max(0, pos - 65536)
        block = os.pread(fd, pos - start, start)
        cut = block.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        pos = start
    return 0


def append_log_row(path: Path, row: dict[str, Any], *, durable: bool = True) -> None:
    """Append one checksummed row after the last complete line and make it durable.

    A torn tail left by an earlier failed or killed append is truncated first; if this append
    fails (a full or read-only disk), the file is truncated back to where it began (best effort:
    a tail that cannot be removed stays a torn tail, ignored by readers and removed next time).
    The failure is re-raised as the ``OSError``.
    """
    line = encode_log_row(row)
    fd = _open_regular(path, "index log", os.O_RDWR | os.O_CREAT)
    try:
        end = _end_of_last_line(fd, os.fstat(fd).st_size)
        if end != os.fstat(fd).st_size:
            os.ftruncate(fd, end)
        try:
            view, pos = memoryview(line), end
            while view:
                n = os.pwrite(fd, view, pos)
                if n <= 0:  # a write that makes no progress is a full disk, never a spin
                    raise OSError(errno.ENOSPC, "no progress writing the log")
                view, pos = view[n:], pos + n
            if durable:
                os.fsync(fd)
        except OSError:
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
            raise
    finally:
        os.close(fd)


@dataclass(frozen=True)
class LogRead:
    """Rows of an index log from ``offset`` on; ``torn_tail_bytes`` were ignored.

    ``row_offsets`` holds the byte offset of each row (to locate damage).
    """

    rows: list[dict[str, Any]]
    next_offset: int
    torn_tail_bytes: int
    row_offsets: tuple[int, ...] = ()


def log_extent(path: Path) -> dict[str, Any]:
    """The seal of a log: its complete rows, their bytes and their sha256 (a missing log: 0)."""
    try:
        data = read_regular(path, "log")
    except Refusal as exc:
        if exc.code == "history_artifact_missing" and not os.path.lexists(path):
            data = b""
        else:
            raise
    end = data.rfind(b"\n") + 1
    return {
        "rows": data[:end].count(b"\n"),
        "bytes": end,
        "sha256": hashlib.sha256(data[:end]).hexdigest(),
    }


def _check_seal(path: Path, data: bytes, seal: dict[str, Any], what: str) -> None:
    end = data.rfind(b"\n") + 1
    rows = data[:end].count(b"\n")
    if end < seal["bytes"] or data[: seal["bytes"]].count(b"\n") != seal["rows"]:
        raise Refusal(
            "history_index_incomplete",
            f"{what} {path.name} holds {rows} rows ({end} bytes); its seal "
            f"says {seal['rows']} rows ({seal['bytes']} bytes): rows were lost.",
            ["restore the log from a copy", "run `stepscope verify` to list every gap"],
        )
    if hashlib.sha256(data[: seal["bytes"]]).hexdigest() != seal["sha256"]:
        raise Refusal(
            "history_artifact_corrupt",
            f"{what} {path.name} no longer matches the sha256 sealed when its segment ended.",
            ["restore the log from a copy", "run `stepscope verify` to list all damage"],
        )


def read_log(
    path: Path,
    offset: int = 0,
    *,
    missing_ok: bool = False,
    what: str = "index log",
    seal: dict[str, Any] | None = None,
) -> LogRead:
    """Read the committed rows of an index log, verifying every row's checksum.

    A missing log refuses ``history_artifact_missing`` unless ``missing_ok`` (then it reads as
    empty). ``seal`` (from :func:`log_extent`, read with ``offset=0``) must match the log's start:
    a shorter log refuses ``history_index_incomplete``, a changed one ``history_artifact_corrupt``.
    """
    try:
        data = read_regular(path, what, offset=offset)
    except Refusal as exc:
        if missing_ok and exc.code == "history_artifact_missing" and not os.path.lexists(path):
            data = b""
            if seal is None or seal["bytes"] == 0:
                return LogRead([], offset, 0)
        else:
            raise
    if seal is not None and offset == 0:
        _check_seal(path, data, seal, what)
    end = data.rfind(b"\n") + 1
    rows: list[dict[str, Any]] = []
    offsets: list[int] = []
    pos = 0
    for line in data[:end].split(b"\n")[:-1]:
        digest, _, payload = line.partition(b" ")
        where = f"{what} {path.name} row {len(rows) + 1} at byte {offset + pos}"
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise Refusal(
                "history_artifact_corrupt",
                f"{where} fails its sha256.",
                ["restore the log from a copy", "run `stepscope verify` to list all damage"],
            )
        try:
            row = json.loads(payload)
        except (ValueError, RecursionError):
            raise Refusal("history_json_invalid", f"{where} is unreadable.", []) from None
        if not isinstance(row, dict):
            raise Refusal("history_json_invalid", f"{where} is not an object.", [])
        rows.append(row)
        offsets.append(offset + pos)
        pos += len(line) + 1
    return LogRead(rows, offset + end, len(data) - end, tuple(offsets))


def sha256_file(path: Path, what: str = "chunk", max_bytes: int | None = None) -> tuple[str, bytes]:
    """``(hex digest, bytes)`` of a regular file (one bounded read; the bytes are reused)."""
    data = read_regular(path, what, max_bytes=max_bytes)
    return hashlib.sha256(data).hexdigest(), data
