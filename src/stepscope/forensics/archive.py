"""The flight recorder's files in an artifact directory, written crash-safely and read back.

``<run>/forensics/`` holds

``channels.json``
    The window's columns (:class:`~stepscope.forensics.channels.Channel` s), the recorder's
    settings, rank and world size. Written once, when the collector opens.
``ring.npy``
    The whole RAM window, rewritten (temporary file, fsync, rename) after every artifact commit:
    after a crash or ``kill -9`` it holds what the window held at the last commit.
``window-<step>.npy``
    The window saved when a trigger fired at ``<step>`` (rows up to and including it).
``triggers.log``
    One checksummed row per trigger (append-only, a torn tail ignored): step, rank, what
    crossed, the window file and its sha256, the dense cadence that followed and its reason.
    A window becomes part of the run only when its row is appended, after the file is durable.

Window arrays are float64 ``(steps, 1 + 2 * channels)``: the step, the channel values, then
their presence (1.0 observed, 0.0 not). No pickle (``allow_pickle=False``).
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.forensics.channels import Channel
from stepscope.history.files import (
    append_log_row,
    atomic_write_bytes,
    atomic_write_json,
    read_json,
    read_log,
    sha256_file,
)

__all__ = [
    "FORENSICS_DIR",
    "FORMAT",
    "ForensicsFiles",
    "WindowRows",
    "decode_window",
    "encode_window",
]

FORENSICS_DIR = "forensics"
FORMAT = "stepscope.forensics.v1"


@dataclass(frozen=True)
class WindowRows:
    """Rows of a window: ``steps`` (int64), ``values`` (float64) and ``present`` (bool)."""

    steps: np.ndarray
    values: np.ndarray
    present: np.ndarray


def encode_window(steps: np.ndarray, values: np.ndarray, present: np.ndarray) -> bytes:
    """The ``.npy`` bytes of a window (see the module docstring for the layout)."""
    table = np.concatenate(
        [steps.astype(np.float64)[:, None], values, present.astype(np.float64)], axis=1
    )
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(table), allow_pickle=False)
    return buf.getvalue()


def decode_window(data: bytes, width: int, where: str) -> WindowRows:
    """Inverse of :func:`encode_window`; refuses ``history_artifact_corrupt`` for another shape."""
    try:
        table = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise Refusal(
            "history_artifact_corrupt", f"{where} is not a readable .npy ({e})."
        ) from None
    if table.dtype != np.float64 or table.ndim != 2 or table.shape[1] != 1 + 2 * width:
        raise Refusal(
            "history_artifact_corrupt",
            f"{where} holds a {table.dtype} array of shape {table.shape}, not (n, {1 + 2 * width}).",
            ["restore the run from a copy"],
        )
    return WindowRows(
        table[:, 0].astype(np.int64),
        table[:, 1 : 1 + width].copy(),
        table[:, 1 + width :] > 0.5,
    )


class ForensicsFiles:
    """The ``forensics/`` folder of one artifact directory (one rank's segment)."""

    def __init__(self, run_dir: str | os.PathLike[str], durable: bool = True) -> None:
        self.dir = Path(run_dir) / FORENSICS_DIR
        self.durable = durable

    # ------------------------------------------------------------------ writing
    def open(
        self, channels: Sequence[Channel], recorder: dict[str, Any], rank: int, world: int
    ) -> None:
        """Create the folder and write ``channels.json``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(
            self.dir / "channels.json",
            {
                "format": FORMAT,
                "channels": [c.to_dict() for c in channels],
                "recorder": recorder,
                "rank": rank,
                "world_size": world,
            },
            durable=self.durable,
        )

    def write_ring(self, steps: np.ndarray, values: np.ndarray, present: np.ndarray) -> None:
        """Replace ``ring.npy`` with the window's rows."""
        atomic_write_bytes(
            self.dir / "ring.npy", encode_window(steps, values, present), durable=self.durable
        )

    def write_trigger(
        self, row: dict[str, Any], steps: np.ndarray, values: np.ndarray, present: np.ndarray
    ) -> dict[str, Any]:
        """Write the trigger's window file, then append its row (returned, with the file)."""
        row, data = self.trigger_row(row, steps, values, present)
        self.write_trigger_file(row, data)
        return row

    def trigger_row(
        self, row: dict[str, Any], steps: np.ndarray, values: np.ndarray, present: np.ndarray
    ) -> tuple[dict[str, Any], bytes]:
        """The trigger's row (with its window file's name and sha256) and that file's bytes."""
        name = f"window-{int(row['step']):09d}-r{int(row['rank'])}.npy"
        data = encode_window(steps, values, present)
        return {**row, "window_file": name, "window_sha256": hashlib.sha256(data).hexdigest()}, data

    def write_trigger_file(self, row: dict[str, Any], data: bytes) -> None:
        """Write a :meth:`trigger_row`'s window file, then append the row (the window is part
        of the run only once its row is appended, after the file is durable)."""
        atomic_write_bytes(self.dir / row["window_file"], data, durable=self.durable)
        append_log_row(self.dir / "triggers.log", row, durable=self.durable)

    # ------------------------------------------------------------------ reading
    def exists(self) -> bool:
        return (self.dir / "channels.json").is_file()

    def channels(self) -> tuple[list[Channel], dict[str, Any]]:
        """The columns and the whole ``channels.json``."""
        meta = read_json(self.dir / "channels.json", "forensics channels")
        if meta.get("format") != FORMAT or not isinstance(meta.get("channels"), list):
            raise Refusal(
                "history_json_invalid",
                f"{self.dir / 'channels.json'} is not a {FORMAT} channel list.",
                ["restore the run from a copy"],
            )
        try:
            return [Channel.from_dict(c) for c in meta["channels"]], meta
        except (KeyError, TypeError):
            raise Refusal("history_json_invalid", "forensics channels.json is damaged.") from None

    def triggers(self) -> list[dict[str, Any]]:
        """The committed trigger rows (checksummed; a torn tail ignored)."""
        return read_log(self.dir / "triggers.log", missing_ok=True, what="trigger log").rows

    def window(self, row: dict[str, Any], width: int) -> WindowRows:
        """The window a trigger row names, checked against its sha256."""
        name = str(row.get("window_file", ""))
        if not name or "/" in name or "\\" in name or name.startswith("."):
            raise Refusal("history_json_invalid", f"trigger row names window {name!r}.")
        digest, data = sha256_file(self.dir / name, "forensics window")
        if digest != row.get("window_sha256"):
            raise Refusal(
                "history_artifact_corrupt",
                f"{self.dir / name} fails the sha256 its trigger row recorded.",
                ["restore the run from a copy"],
            )
        return decode_window(data, width, str(self.dir / name))

    def ring(self, width: int) -> WindowRows | None:
        """The window as written at the last commit (``None``: none written yet)."""
        path = self.dir / "ring.npy"
        if not path.is_file():
            return None
        _, data = sha256_file(path, "forensics ring")
        return decode_window(data, width, str(path))
