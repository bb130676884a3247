"""Read run-log rows back with their axes: scalars, evaluations, clocks, branch activity.

Every view carries the three axes explicitly. A scalar row holds its ``optimizer_step``; its
``examples_seen`` and ``epoch`` come from the step block of that step. Where the block is absent
or the count was not declared, the axis is *masked* (``numpy.ma``), never zero.

Example
-------
>>> from stepscope.runlog import RunLog
>>> rl = RunLog()                       # RAM only
>>> for step in range(3):
...     with rl.step(examples=32, epoch=0):
...         rl.log("loss", 1.0 / (step + 1))
>>> s = rl.view().scalar("loss")
>>> s.steps.tolist(), s.values.tolist(), s.examples_seen.tolist()
([0, 1, 2], [1.0, 0.5, 0.3333333333333333], [32, 64, 96])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.runlog.evals import EvalRecord
from stepscope.runlog.names import (
    CLOCK_ELAPSED,
    CLOCK_TELEMETRY,
    CLOCK_TRAINING,
    BranchField,
    branch_scalar,
    parse_branch_scalar,
)
from stepscope.runlog.sink import read_eval_log, read_summary


@dataclass(frozen=True)
class ScalarSeries:
    """One scalar over steps, with masked ``examples_seen`` / ``epoch`` where unknown."""

    name: str
    steps: np.ndarray
    values: np.ndarray
    examples_seen: np.ma.MaskedArray
    epoch: np.ma.MaskedArray


@dataclass(frozen=True)
class Clocks:
    """Cumulative clocks (seconds) at the end of each step, and the run's measured overhead.

    ``training_seconds``, ``telemetry_seconds`` and ``elapsed_seconds`` are cumulative at each
    of ``steps`` (per-step values: :meth:`per_step`). ``training_clock`` says how training time
    was measured (``host_perf_counter`` or ``cuda_event``; ``None`` without ``runlog.json``).
    """

    steps: np.ndarray
    training_seconds: np.ndarray
    telemetry_seconds: np.ndarray
    elapsed_seconds: np.ndarray
    training_clock: str | None

    @property
    def overhead_fraction(self) -> float | None:
        """Telemetry / training over the run (``None`` without training time)."""
        if not len(self.steps) or self.training_seconds[-1] <= 0:
            return None
        return float(self.telemetry_seconds[-1] / self.training_seconds[-1])

    def per_step(self) -> tuple[np.ndarray, np.ndarray]:
        """``(training, telemetry)`` seconds of each step (differences of the cumulative rows)."""
        return np.diff(self.training_seconds, prepend=0.0), np.diff(
            self.telemetry_seconds, prepend=0.0
        )


@dataclass(frozen=True)
class BranchSeries:
    """Activity of one branch at the steps where its mask was logged."""

    name: str
    steps: np.ndarray
    active_fraction: np.ndarray
    active_units: np.ma.MaskedArray  # exact counts; masked where only a fraction was logged
    total_units: np.ma.MaskedArray
    nominal_skipped_macs: np.ma.MaskedArray  # masked where no per-unit MAC count was declared


class RunView:
    """Run-log views over a run's artifact or its in-RAM rows (scalars with axes, branches).

    Not constructed by users: :meth:`stepscope.run.Run.view` (a run on disk),
    :meth:`stepscope.runlog.RunLog.view` and :meth:`stepscope.HistoryCollector.run_view` (rows
    written so far, also of a RAM-only run, which has no :class:`~stepscope.run.Run`) return one.

    Parameters
    ----------
    source
        An object with ``step_blocks()``, ``scalar_rows()`` and ``table_rows(table, dtype)``
        (:class:`~stepscope.runlog.sink.MemorySink`), or a ``HistoryReader``.
    """

    def __init__(self, source: Any) -> None:
        if hasattr(source, "scalar_rows"):
            self._blocks = source.step_blocks()
            self._scalars, self._names = source.scalar_rows()
            self._evals = source.eval_records()
            self.summary = source.summary()
        else:  # a HistoryReader
            self._blocks = source.step_blocks()
            self._scalars, self._names = source.table("scalars"), list(source.scalar_names)
            self._evals = read_eval_log(source)
            self.summary = read_summary(source.path)
        order = np.argsort(self._scalars["step"], kind="stable")
        self._scalars = self._scalars[order]
        self._block_steps = np.array([b.optimizer_step for b in self._blocks], np.int64)
        self._block_seen = np.array(
            [-1 if b.examples_seen is None else b.examples_seen for b in self._blocks], np.int64
        )
        self._block_epoch = np.array(
            [-1 if b.epoch is None else b.epoch for b in self._blocks], np.int64
        )

    # -- scalars --------------------------------------------------------------------------
    @property
    def scalar_names(self) -> list[str]:
        """Every scalar name, reserved ``clock/*`` and ``branch/*`` names included."""
        return list(self._names)

    def _rows(self, name: str) -> np.ndarray:
        if name not in self._names:
            raise Refusal(
                "history_series_unknown",
                f"no scalar {name!r} in this run.",
                [f"one of {sorted(self._names)}"],
            )
        return self._scalars[self._scalars["name"] == self._names.index(name)]

    def _axis(self, steps: np.ndarray, column: np.ndarray) -> np.ma.MaskedArray:
        pos = np.searchsorted(self._block_steps, steps)
        pos = np.minimum(pos, max(len(self._block_steps) - 1, 0))
        found = (self._block_steps[pos] == steps) if len(self._block_steps) else np.zeros(0, bool)
        values = np.where(found, column[pos] if len(column) else -1, -1)
        return np.ma.masked_array(values, mask=values < 0)

    def scalar(self, name: str) -> ScalarSeries:
        """A scalar's rows in step order with their ``examples_seen`` and ``epoch`` axes."""
        rows = self._rows(name)
        steps = rows["step"].copy()
        return ScalarSeries(
            name,
            steps,
            rows["value"].copy(),
            self._axis(steps, self._block_seen),
            self._axis(steps, self._block_epoch),
        )

    # -- evaluations ----------------------------------------------------------------------
    def evals(self, split: str | None = None, *, endpoints_only: bool = False) -> list[EvalRecord]:
        """Evaluations (of one split) in step order; ``endpoints_only`` keeps declared endpoints."""
        recs = [
            r
            for r in self._evals
            if (split is None or r.split == split) and (r.endpoint or not endpoints_only)
        ]
        return sorted(recs, key=lambda r: r.optimizer_step)  # stable: logging order within a step

    def eval_splits(self) -> list[str]:
        """Split names that have at least one evaluation."""
        return sorted({r.split for r in self._evals})

    # -- clocks ---------------------------------------------------------------------------
    def clocks(self) -> Clocks:
        """The cumulative ``clock/*`` rows (steps where all three were written)."""
        if CLOCK_TRAINING not in self._names:
            empty = np.empty(0)
            return Clocks(np.empty(0, np.int64), empty, empty, empty, self._clock_kind())
        parts = [self._rows(n) for n in (CLOCK_TRAINING, CLOCK_TELEMETRY, CLOCK_ELAPSED)]
        steps = np.intersect1d(np.intersect1d(parts[0]["step"], parts[1]["step"]), parts[2]["step"])

        def at(rows: np.ndarray) -> np.ndarray:
            last = {int(s): float(v) for s, v in zip(rows["step"], rows["value"])}
            return np.array([last[int(s)] for s in steps], np.float64)

        training, telemetry, elapsed = (at(p) for p in parts)
        return Clocks(steps, training, telemetry, elapsed, self._clock_kind())

    def _clock_kind(self) -> str | None:
        return None if self.summary is None else self.summary.get("training_clock")

    # -- branch activity ------------------------------------------------------------------
    def branches(self) -> list[str]:
        """Branch names with logged activity."""
        found = {parse_branch_scalar(n) for n in self._names}
        return sorted({p[0] for p in found if p is not None})

    def branch(self, name: str) -> BranchSeries:
        """One branch's activity (fraction, exact unit counts, nominal skipped MACs)."""
        frac = self._rows(branch_scalar(name, BranchField.ACTIVE_FRACTION))
        steps = frac["step"].copy()

        def field(f: BranchField) -> np.ndarray:
            n = branch_scalar(name, f)
            if n not in self._names:
                return np.full(len(steps), np.nan)
            rows = self._rows(n)
            by = {int(s): float(v) for s, v in zip(rows["step"], rows["value"])}
            return np.array([by.get(int(s), np.nan) for s in steps])

        def counts(f: BranchField) -> np.ma.MaskedArray:
            values = field(f)  # a fraction logged by hand has no counts: masked, not garbage
            known = ~np.isnan(values)
            return np.ma.masked_array(np.where(known, values, -1).astype(np.int64), mask=~known)

        return BranchSeries(
            name,
            steps,
            frac["value"].copy(),
            counts(BranchField.ACTIVE_UNITS),
            counts(BranchField.TOTAL_UNITS),
            np.ma.masked_invalid(field(BranchField.NOMINAL_SKIPPED_MACS)),
        )
