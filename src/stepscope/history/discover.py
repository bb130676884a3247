"""Finding run directories under a folder, the way ``tensorboard --logdir`` finds event files.

A *run directory* is a directory that holds a ``manifest.json`` (written first when a run is
created, see :class:`~stepscope.history.ArtifactWriter`). Every command and reader that takes a
run also takes a folder of runs: :func:`find_runs` is the one rule for what that folder holds.

Example
-------
>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> for name in ("b/version_1", "a", "b/version_0"):
...     (root / name).mkdir(parents=True)
...     _ = (root / name / "manifest.json").write_text("{}")
>>> [str(p.relative_to(root)) for p in find_runs(root)]
['a', 'b/version_0', 'b/version_1']
>>> find_runs(root / "a") == [root / "a"]
True
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["MANIFEST", "find_runs", "is_run_dir"]

#: The file whose presence makes a directory a run directory.
MANIFEST = "manifest.json"


def is_run_dir(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a directory holding a ``manifest.json`` (not a link to one)."""
    manifest = Path(path) / MANIFEST
    return Path(path).is_dir() and manifest.is_file() and not manifest.is_symlink()


def find_runs(path: str | os.PathLike[str]) -> list[Path]:
    """Run directories at or under ``path``, sorted by path.

    Parameters
    ----------
    path
        A run directory (then the result is ``[path]``) or a folder searched recursively. A run
        directory's own subfolders (``chunks/``) are not searched; symbolic links to folders are
        not followed.

    Returns
    -------
    list of Path
        Empty when ``path`` holds no run (or does not exist); callers refuse with their own code.
    """
    root = Path(path)
    if is_run_dir(root):
        return [root]
    if not root.is_dir():
        return []
    found: list[Path] = []
    for current, dirs, _files in os.walk(root, followlinks=False):
        here = Path(current)
        if here != root and is_run_dir(here):
            found.append(here)
            dirs[:] = []
            continue
        dirs.sort()
    return sorted(found)
