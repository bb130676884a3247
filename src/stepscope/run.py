"""The joint view of one run directory: the history artifact plus the run log's rows.

``history`` reads what the collector and the artifact writer committed; ``runlog`` adds user
scalars' axes, evaluations and clocks on top of it. ``history`` never imports ``runlog`` (a lower
layer never imports a higher one, see ``docs/architecture.md``), so the view that needs both
lives here, at the top: :func:`open_run` returns a :class:`Run`, which is a
:class:`~stepscope.history.HistoryReader` (``.series()``, ``.scalars()``, ``.steps``, ...) with
the run log's ``.evals()``, ``.clocks()`` and ``.view()``, and a :meth:`Run.verify` that also
decodes every evaluation. ``stepscope.open_history`` is this same function (it returned a
reader with ``evals()``/``clocks()`` before the layers were separated); the plain reader of the
history layer is :func:`stepscope.history.open_history`.

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

import os

from stepscope.errors import Refusal
from stepscope.history.reader import EVAL_LOG, HistoryReader
from stepscope.history.verify import VerifyReport
from stepscope.runlog.evals import EvalRecord
from stepscope.runlog.sink import read_eval_log, read_summary
from stepscope.runlog.view import Clocks, RunView

__all__ = ["Run", "open_run"]


class Run(HistoryReader):
    """A :class:`~stepscope.history.HistoryReader` with the run log's rows (see :func:`open_run`)."""

    def view(self) -> RunView:
        """The run-log view: scalars with their ``examples_seen``/``epoch`` axes, branches, ..."""
        return RunView(self)

    def evals(self, split: str | None = None, *, endpoints_only: bool = False) -> list[EvalRecord]:
        """Evaluation records of ``split`` (all splits when None), by step.

        ``endpoints_only`` keeps the declared endpoints (official-test values belong only there).
        """
        return self.view().evals(split, endpoints_only=endpoints_only)

    def clocks(self) -> Clocks:
        """Cumulative training/telemetry/elapsed seconds per step and the measured overhead.

        A :class:`stepscope.runlog.Clocks` (``.overhead_fraction``, ``.per_step()``).
        """
        return self.view().clocks()

    def verify(self) -> VerifyReport:
        """:meth:`HistoryReader.verify`, and every evaluation row decoded (its values checked)."""
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
        The run directory (``WatchSettings(output_dir=...)``, ``RunLog(path)`` or
        :class:`~stepscope.history.ArtifactWriter`), also while its writer still appends.

    Returns
    -------
    Run
        A :class:`~stepscope.history.HistoryReader` with ``.evals()``, ``.clocks()``, ``.view()``.
    """
    return Run(path)
