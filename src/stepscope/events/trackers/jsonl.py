"""JSONL tracker: one JSON object per event, one line each, with all three training axes.

Each line is :meth:`ObserverEvent.to_dict` — ``kind``, ``name``, ``optimizer_step``,
``examples_seen``, ``epoch`` (``null`` when unknown), the site/stream/phase, the value or reason,
and for histograms the sparse exact counts with their descriptor and spine. Non-finite floats are
written as the strings ``"nan"``, ``"inf"``, ``"-inf"`` (JSON has no such numbers).
:func:`read_jsonl` reads a file back into events.

Example
-------
>>> import tempfile, os
>>> from stepscope.events import Axes, ScalarEvent
>>> path = os.path.join(tempfile.mkdtemp(), "events.jsonl")
>>> with JsonlTracker(path) as t:
...     t.on_events([ScalarEvent("loss", Axes(1, examples_seen=64), 0.5)])
>>> [(e.name, e.examples_seen, e.value) for e in read_jsonl(path)]
[('loss', 64, 0.5)]
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from stepscope.errors import Refusal
from stepscope.events.bus import Subscriber
from stepscope.events.event import ObserverEvent

__all__ = ["JsonlTracker", "read_jsonl"]


class JsonlTracker(Subscriber):
    """Append every event as one JSON line.

    Parameters
    ----------
    path
        The output file (parent directories are created).
    mode
        ``"w"`` (default: start a new file) or ``"a"`` (append).
    fsync
        ``os.fsync`` after each published batch (durable, slower).
    """

    def __init__(self, path: str | os.PathLike[str], mode: str = "w", fsync: bool = False) -> None:
        if mode not in ("w", "a"):
            raise Refusal("settings_invalid", f"JSONL mode {mode!r} is not 'w' or 'a'.", [])
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, mode, encoding="utf-8")  # closed in close()
        self.fsync = fsync
        self.lines = 0

    def on_events(self, events: Sequence[ObserverEvent]) -> None:
        """Write one line per event and flush."""
        text = "".join(
            json.dumps(e.to_dict(), separators=(",", ":"), allow_nan=False) + "\n" for e in events
        )
        self._fh.write(text)
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self.lines += len(events)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> JsonlTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_jsonl(path: str | os.PathLike[str]) -> list[ObserverEvent]:
    """Events of a JSONL file written by :class:`JsonlTracker` (a torn last line is ignored)."""
    out = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # a torn final line of a killed writer
                break
            raise Refusal(
                "event_invalid", f"{path}:{i + 1} is not JSON.", ["check the file"]
            ) from None
        out.append(ObserverEvent.from_dict(d))
    return out
