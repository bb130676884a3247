"""Spying on a process's file operations: which thread made each one, on which paths."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

#: the ``os`` functions the history's writers use to touch files
FILE_OPS = ("open", "write", "pwrite", "fsync", "replace", "ftruncate", "pread", "mkdir", "unlink")


def spy_file_ops(monkeypatch: pytest.MonkeyPatch, calls: list[Any]) -> None:
    """Append ``(op, thread name, paths)`` to ``calls`` at every call of :data:`FILE_OPS`
    (``paths``: the call's str/path arguments joined; ``monkeypatch.undo()`` ends it)."""
    for name in FILE_OPS:
        real = getattr(os, name)

        def spy(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            paths = " ".join(str(x) for x in a if isinstance(x, (str, os.PathLike)))
            calls.append((_name, threading.current_thread().name, paths))
            return _real(*a, **k)

        monkeypatch.setattr(os, name, spy)
