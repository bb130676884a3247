"""The one reader of a run directory: the history artifact plus the run log's rows.

``history`` reads what the collector and the history writer committed; ``runlog`` adds user
scalars' axes, evaluations and clocks on top of it. ``history`` never imports ``runlog`` (a lower
layer never imports a higher one, see ``docs/architecture.md``), so the view that needs both
lives here, above them: :func:`open_run` (``stepscope.open_run``) returns a :class:`Run`, the
history layer's reader (``.series()``, ``.histograms()``, ``.scalars()``, ``.steps``,
``.sites``, ...) with the run log's ``.evals()``, ``.clocks()`` and ``.view()``, the flight
recorder's ``.spikes()``, the data-frame exports and a :meth:`Run.verify` that also decodes
every evaluation. It is the only reader users need; the report reads runs as ``Run`` too.

Example
-------
>>> import tempfile
>>> import stepscope as ss
>>> path = tempfile.mkdtemp() + "/run"
>>> with ss.RunLog(path) as log:
...     for step in range(3):
...         with log.step(examples=32):
...             log.log("loss", 1.0 / (step + 1))
...     _ = log.log_eval("validation", {"ce": 0.5})  # after 3 steps
>>> run = open_run(path)
>>> run.scalars("loss").values.tolist(), [e.optimizer_step for e in run.evals("validation")]
([1.0, 0.5, 0.3333333333333333], [3])
>>> run.verify().ok
True
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from stepscope.errors import Refusal
from stepscope.forensics.attribution import Spike, read_spikes
from stepscope.history import frames
from stepscope.history.commits import EVAL_LOG
from stepscope.history.reader import HistoryReader
from stepscope.history.verify import VerifyReport
from stepscope.history.versions import pick_run
from stepscope.runlog.evals import EvalRecord
from stepscope.runlog.sink import read_eval_log, read_summary
from stepscope.runlog.view import Clocks, RunView

__all__ = ["Run", "open_run"]

log = logging.getLogger("stepscope")


class Run(HistoryReader):
    """One run directory, read (see :func:`open_run`, the way to get one).

    The history layer's reader (``.run``, ``.segments``, ``.sites``, ``.steps``, ``.series()``,
    ``.histograms()``, ``.scalars()``, ``.observations()``, ``.refresh()``) with the run log's
    ``.evals()``, ``.clocks()``, ``.view()`` and the flight recorder's ``.spikes()``.
    """

    def view(self) -> RunView:
        """The run-log view: scalars with their ``examples_seen``/``epoch`` axes, branches, ..."""
        return RunView(self)

    def evals(self, split: str | None = None, *, endpoints_only: bool = False) -> list[EvalRecord]:
        """Evaluation records of ``split`` (all splits when None), by step.

        ``endpoints_only`` keeps the declared endpoints (official-test values belong only there).
        """
        return self.view().evals(split, endpoints_only=endpoints_only)

    def spikes(self) -> list[Spike]:
        """The flight recorder's triggers, each with the layers that left their own trailing
        range first (``[]``: no recorder, or nothing fired; see ``docs/forensics.md``)."""
        return read_spikes(self.path)

    def clocks(self) -> Clocks:
        """Cumulative training/telemetry/elapsed seconds per step and the measured overhead.

        A :class:`stepscope.runlog.Clocks` (``.overhead_fraction``, ``.per_step()``).
        """
        return self.view().clocks()

    def to_pandas(self, wide: bool = False) -> Any:
        """The observations as a ``pandas.DataFrame``, names not codes (extra ``pandas``).

        Tidy (one row per step, site, stream, phase, micro-batch and spine field: columns
        ``step, optimizer_step, examples_seen, epoch, micro_batch, site, module_type, stream,
        phase, field, value, presence``) or ``wide=True`` (one column per spine field); see
        :mod:`stepscope.history.frames`.
        """
        return frames.to_pandas(self, wide)

    def to_polars(self, wide: bool = False) -> Any:
        """:meth:`to_pandas` as a ``polars.DataFrame`` (extra ``polars``)."""
        return frames.to_polars(self, wide)

    def to_arrow(self, wide: bool = False) -> Any:
        """:meth:`to_pandas` as a ``pyarrow.Table`` (extra ``arrow``)."""
        return frames.to_arrow(self, wide)

    def verify(self) -> VerifyReport:
        """Every chunk's sha256 and consistency, and every evaluation row decoded and checked."""
        report = super().verify()
        if not any(name == EVAL_LOG for name, _, _ in report.failures):
            try:
                read_eval_log(self)
            except Refusal as exc:
                report.failures.append((EVAL_LOG, exc.code, exc.message))
        try:
            read_summary(self.path)  # runlog.json: its own sha256
        except Refusal as exc:
            report.failures.append(("runlog.json", exc.code, exc.message))
        return report


def open_run(path: str | os.PathLike[str]) -> Run:
    """Open a run directory for reading: the history artifact and its run log together.

    Parameters
    ----------
    path
        The run directory (``collector.run_dir``, ``WatchSettings(output_dir=...)``,
        ``RunLog(path)`` or :class:`~stepscope.history.HistoryWriter`), also while its writer
        still appends; or the folder a user naturally has: a folder of versions
        (``runs/mlp``, holding ``version_0``, ``version_1``, ...) opens the newest (highest
        ``N``), a folder holding exactly one run opens it, and a folder holding several other
        runs refuses ``run_ambiguous`` listing them (:func:`stepscope.history.pick_run`).

    Returns
    -------
    Run
        ``.series()``, ``.scalars()``, ``.steps``, ``.evals()``, ``.clocks()``, ``.spikes()``,
        ``.to_pandas()``, ``.verify()``, ...
    """
    chosen = pick_run(path)
    if Path(chosen) != Path(path):
        log.info("%s holds runs; opening %s", path, chosen)
    return Run(chosen)
