"""Finding run directories under a folder, the way ``tensorboard --logdir`` finds event files.

A *run directory* is a directory that holds a ``manifest.json`` (written first when a run is
created, see :class:`~stepscope.history.HistoryWriter`). Every command and reader that takes a
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
from collections.abc import Iterable
from pathlib import Path

from stepscope.errors import Refusal

__all__ = ["MANIFEST", "find_runs", "is_run_dir", "runs_at"]

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


def runs_at(paths: Iterable[str | os.PathLike[str]], command: str = "show") -> list[Path]:
    """The runs that command-line arguments name: each a run directory or a folder of runs.

    Each path goes through :func:`find_runs`; the runs of all paths are kept in order, each once.
    A directory that holds a ``manifest.json`` of any kind (a damaged run, a linked manifest) is
    passed through as it is, so that the reader names what is wrong with it.

    Parameters
    ----------
    paths
        What the user typed.
    command
        The sub-command, for the remedy's spelling.

    Raises
    ------
    Refusal
        ``history_artifact_missing`` when a path does not exist or holds no run at or below it.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> (root / "demo" / "a").mkdir(parents=True)
    >>> _ = (root / "demo" / "a" / "manifest.json").write_text("{}")
    >>> [p.name for p in runs_at([root / "demo", root / "demo" / "a"])]
    ['a']
    >>> runs_at([root / "nothing"])
    Traceback (most recent call last):
    ...
    stepscope.errors.RefusalStorageError: [history_artifact_missing] ...
    """
    found: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        runs = find_runs(path)
        if not runs and os.path.lexists(path / MANIFEST):
            runs = [path]
        if not runs:
            what = (
                "does not exist"
                if not os.path.lexists(path)
                else (f"holds no stepscope run (no {MANIFEST} in it or in any folder below it)")
            )
            raise Refusal(
                "history_artifact_missing",
                f"{os.fspath(path)!r} {what}.",
                [
                    f"pass a run directory (the output_dir of a run) or a folder of runs: "
                    f"`stepscope {command} runs` searches runs/ like `tensorboard --logdir`",
                    f"`stepscope demo` writes runs/demo/<variant>-seed<N>; then "
                    f"`stepscope {command} runs/demo`",
                ],
            )
        found.update(dict.fromkeys(runs))
    return list(found)
