"""Versioned run directories: ``<root>/<name>/version_<N>``, the way Lightning and TensorBoard do it.

Running the same script twice must never collide with, or refuse because of, the first run. A
collector that is given no exact ``output_dir`` claims the next *version* directory of its parent
folder: ``N`` is one more than the highest ``version_<n>`` already there, and the directory is
claimed with :func:`os.mkdir`, which fails for every process but one, so two processes starting
at the same moment never share a version (the loser takes the next number).

Readers take the folder a user naturally has: :func:`pick_run` turns a folder of versions into
its newest version (the highest ``N``), and refuses ``run_ambiguous``, listing the runs, when a
folder holds several runs that are not versions of one name.

Example
-------
>>> import tempfile, pathlib
>>> parent = pathlib.Path(tempfile.mkdtemp()) / "mlp"
>>> [claim_version(parent).name for _ in range(3)]
['version_0', 'version_1', 'version_2']
>>> for v in ("version_0", "version_2"):  # two of them hold a run
...     _ = (parent / v / "manifest.json").write_text("{}")
>>> pick_run(parent).name
'version_2'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from stepscope.errors import Refusal
from stepscope.history.discover import find_runs, is_run_dir

__all__ = [
    "ENV_ROOT",
    "VERSION_PREFIX",
    "claim_version",
    "default_root",
    "newest_version",
    "pick_run",
    "version_number",
]

#: The environment variable that moves the default root (``./runs``) elsewhere (tests use it).
ENV_ROOT = "STEPSCOPE_DIR"
#: Version directories are named ``version_<N>`` (``N`` = 0, 1, ...), as Lightning names them.
VERSION_PREFIX = "version_"
_VERSION = re.compile(rf"{VERSION_PREFIX}(\d+)")


def default_root() -> Path:
    """Where runs go when nothing says otherwise: ``$STEPSCOPE_DIR``, else ``./runs``."""
    return Path(os.environ.get(ENV_ROOT) or "runs")


def version_number(path: str | os.PathLike[str]) -> int | None:
    """``N`` of a ``version_<N>`` directory name (``None`` for any other name).

    >>> version_number("runs/mlp/version_12"), version_number("runs/mlp")
    (12, None)
    """
    m = _VERSION.fullmatch(Path(path).name)
    return int(m.group(1)) if m else None


def _versions(parent: Path) -> list[tuple[int, Path]]:
    if not parent.is_dir():
        return []
    found = ((version_number(p), p) for p in parent.iterdir() if p.is_dir() and not p.is_symlink())
    return sorted((n, p) for n, p in found if n is not None)


def claim_version(parent: str | os.PathLike[str], slot: str | None = None) -> Path:
    """Create and return the next free ``parent/version_<N>`` (atomically, with ``os.mkdir``).

    Parameters
    ----------
    parent
        The folder of versions (created if absent). A folder that itself holds a run refuses
        ``history_run_exists``: versions inside a run directory would be hidden from readers.
    slot
        For one process of several (a rank's ``rank003``): the version is the first whose
        ``slot`` subdirectory is free, and the returned path is that subdirectory, so the ranks
        of one job, started together, agree on the version without communicating.

    Returns
    -------
    Path
        The new, empty directory (``parent/version_<N>`` or ``parent/version_<N>/<slot>``).
    """
    parent = Path(parent)
    if is_run_dir(parent):
        raise Refusal(
            "history_run_exists",
            f"{parent} is itself a run directory; new versions cannot go inside it.",
            [
                f"continue it: ss.WatchSettings(output_dir={str(parent)!r}, resume=True)",
                f"or version under another name: ss.WatchSettings(root_dir="
                f"{str(parent.parent)!r}, name={parent.name + '_v2'!r})",
            ],
        )
    parent.mkdir(parents=True, exist_ok=True)
    if slot is not None:
        n = 0
        while True:
            version = parent / f"{VERSION_PREFIX}{n}"
            version.mkdir(exist_ok=True)
            try:
                if not is_run_dir(version):  # a single-process run's version holds no slots
                    os.mkdir(version / slot)
                    return version / slot
            except FileExistsError:
                pass
            n += 1
    existing = _versions(parent)
    n = existing[-1][0] + 1 if existing else 0
    while True:
        version = parent / f"{VERSION_PREFIX}{n}"
        try:
            os.mkdir(version)
            return version
        except FileExistsError:  # another process claimed it first: take the next one
            n += 1


def newest_version(parent: str | os.PathLike[str]) -> Path | None:
    """The highest-numbered ``version_<N>`` of ``parent`` that holds a run (``None``: none)."""
    runs = [p for _, p in _versions(Path(parent)) if find_runs(p)]
    return runs[-1] if runs else None


def pick_run(path: str | os.PathLike[str]) -> Path:
    """The run a reader opens for ``path``: the rule behind :func:`stepscope.open_run`.

    * a run directory: itself;
    * a folder whose runs are all its own ``version_<N>`` directories: the newest (highest ``N``);
    * a folder holding exactly one run (at any depth): that run;
    * no run at all: ``path`` unchanged (the reader then refuses ``history_artifact_missing``);
    * several other runs: refuses ``run_ambiguous``, listing them
      (:func:`stepscope.history.find_runs` lists them all).
    """
    root = Path(path)
    if is_run_dir(root):
        return root
    runs = find_runs(root)
    if not runs:
        return root
    if len(runs) == 1:
        return runs[0]
    if all(p.parent == root and version_number(p) is not None for p in runs):
        return max(runs, key=lambda p: version_number(p) or 0)
    shown = [str(p) for p in runs[:8]] + ([f"... {len(runs) - 8} more"] if len(runs) > 8 else [])
    raise Refusal(
        "run_ambiguous",
        f"{root} holds {len(runs)} runs, not versions of one name: " + ", ".join(shown) + ".",
        [
            f"open one of them: ss.open_run({str(runs[-1])!r})",
            "list them all with stepscope.history.find_runs(folder) or `stepscope show FOLDER`",
        ],
    )
