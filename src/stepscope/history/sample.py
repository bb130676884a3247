"""A tiny recorded run to try a reader, an export or a report on, without training anything.

Example
-------
>>> import stepscope as ss
>>> from stepscope.history.sample import sample_run
>>> ss.open_run(sample_run()).scalars("loss").values.tolist()
[1.0, 0.5, 0.3333333333333333]
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from stepscope.history.artifact import HistoryWriter

__all__ = ["sample_run"]


def sample_run(directory: str | Path | None = None, steps: int = 3) -> str:
    """Write a run of ``steps`` training-loss scalars (``1 / (step + 1)``) and return its path.

    Parameters
    ----------
    directory
        Where to write it (must not hold a run yet); default: a new temporary folder's ``a``.
    steps
        How many steps (one ``loss`` scalar each).
    """
    run = str(directory) if directory is not None else tempfile.mkdtemp() + "/a"
    with HistoryWriter(run) as w:
        for step in range(steps):
            w.write_scalar("loss", step, 1.0 / (step + 1))
    return run
