"""``RunLog``: loss, learning rate, evaluations, clocks and branch activity without a collector.

A run log writes the same rows a :class:`~stepscope.HistoryCollector` writes for its user
scalars — step blocks with ``optimizer_step``/``examples_seen``/``epoch``, ``scalars`` rows, the
``evals`` table, the reserved ``clock/*`` and ``branch/*`` scalars — into a history artifact
(``output_dir``) or RAM. Read them back with :func:`stepscope.open_run` (``.scalars()``,
``.evals()``, ``.clocks()``) or :meth:`RunLog.view`.

Example
-------
>>> import torch
>>> from stepscope.runlog import RunLog
>>> model = torch.nn.Linear(3, 1)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with RunLog() as rl:
...     for step in range(4):
...         with rl.step(examples=8, epoch=step // 2):
...             loss = model(torch.randn(8, 3)).pow(2).mean()
...             opt.zero_grad(); loss.backward(); opt.step()
...             rl.log("loss", loss)             # stays on its device until the boundary
...             rl.log("lr", opt.param_groups[0]["lr"])
...     _ = rl.log_eval("validation", {"ce": 0.7}, sample_count=64, endpoint=True)
...     v = rl.view()
>>> v.scalar("lr").epoch.tolist(), v.evals("validation")[0].optimizer_step
([0, 0, 1, 1], 4)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.history import (
    CloseReport,
    HistoryWriter,
    RunRecord,
    StepBlockRecord,
    StepProvenance,
    StepTruth,
)
from stepscope.history.reader import HistoryReader
from stepscope.runlog.clocks import ClockRow, StepClock
from stepscope.runlog.names import CLOCK_ELAPSED, CLOCK_TELEMETRY, CLOCK_TRAINING
from stepscope.runlog.pending import PendingStep
from stepscope.runlog.sink import DiskSink, MemorySink, StepSink, write_summary
from stepscope.runlog.userlog import UserLog
from stepscope.runlog.view import RunView

_UNKNOWN_TRUTH = StepTruth()  # frozen: one shared record


def clock_scalars(row: ClockRow) -> dict[str, float]:
    """The reserved cumulative ``clock/*`` scalars of one resolved step."""
    return {
        CLOCK_TRAINING: row.training_total,
        CLOCK_TELEMETRY: row.telemetry_total,
        CLOCK_ELAPSED: row.elapsed_seconds,
    }


def write_clock_rows(sink: Any, rows: list[ClockRow]) -> None:
    """The ``clock/*`` scalars of steps resolved after their block was written (CUDA, close)."""
    for r in rows:
        for name, value in clock_scalars(r).items():
            sink.write_scalar(name, r.step, value)


class RunLog(UserLog):
    """Per-step user scalars, evaluations, clocks and branch activity for any training loop.

    Parameters
    ----------
    output_dir
        Artifact directory (crash-safe, see :class:`~stepscope.history.HistoryWriter`);
        ``None`` keeps everything in RAM (:meth:`view` reads it).
    run_id
        Run identity of a new artifact.
    device
        Device of the training tensors: ``cuda`` times the training clock with CUDA events.
    commit_steps, durable
        Artifact commit interval and fsync (see :class:`~stepscope.history.HistoryWriter`).
    timer, event_factory
        Injectable clocks (tests).

    Notes
    -----
    Steps are 0-based; a scalar logged inside step ``k`` is measured with the parameters after
    ``k`` optimizer updates, and an evaluation logged between steps ``k-1`` and ``k`` is tagged
    ``optimizer_step=k`` (so the evaluation at initialization is step 0).
    """

    def __init__(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        *,
        run_id: str | None = None,
        device: torch.device | str | None = None,
        commit_steps: int = 32,
        durable: bool = True,
        timer: Callable[[], float] = time.perf_counter,
        event_factory: Callable[[], Any] | None = None,
    ) -> None:
        self._timer = timer
        self.clock = StepClock(device, timer, event_factory)
        self.path = Path(output_dir) if output_dir is not None else None
        self.sink: StepSink
        if self.path is not None:
            run = RunRecord.new(
                run_id=run_id,
                device=str(device or "cpu"),
                extra={"writer": "stepscope.RunLog", "training_clock": self.clock.kind.value},
            )
            writer = HistoryWriter(self.path, run, commit_steps=commit_steps, durable=durable)
            self.sink = DiskSink(writer)
            write_summary(self.path, self.clock.summary(closed=False))
        else:
            self.sink = MemorySink()
        self._pending = PendingStep()
        self._step = 0
        self._examples_seen: int | None = 0
        self._telemetry = 0.0  # ours, attributed to the current step so far
        self._window_from = 0.0
        self._closed = False
        self.close_report: CloseReport | None = None  # set by close(): what was not committed
        self.clock.begin(0)

    # -- state ----------------------------------------------------------------------------
    @property
    def optimizer_step(self) -> int:
        """The step being recorded (= optimizer steps completed so far)."""
        return self._step

    @property
    def examples_seen(self) -> int | None:
        """Examples consumed by completed steps (``None`` once a step did not declare them)."""
        return self._examples_seen

    def _check_open(self) -> None:
        if self._closed:
            raise Refusal("runlog_closed", "this RunLog is closed.", ["create a new RunLog"])

    # -- logging (UserLog: log, log_mask, log_eval) ---------------------------------------
    def _charge(self, seconds: float) -> None:
        self._telemetry += seconds

    def _eval_coordinate(self) -> tuple[int, int | None]:
        return self._step, self._examples_seen

    @property
    def _log_sink(self) -> Any:
        return self.sink

    # -- steps ----------------------------------------------------------------------------
    @contextmanager
    def step(self, examples: int | None = None, epoch: int | None = None) -> Iterator[RunLog]:
        """One training step; its window (the training clock) is the ``with`` body.

        An exception escaping the body drops the step's pending rows, closes the log (committed
        rows are kept) and propagates.
        """
        self._check_open()
        self.clock.begin(self._step)
        self._window_from = self._telemetry
        try:
            yield self
        except BaseException:
            self._pending.clear()
            self.close()
            raise
        self.end_step(examples=examples, epoch=epoch)

    def end_step(self, examples: int | None = None, epoch: int | None = None) -> StepBlockRecord:
        """End the current step (for loops that cannot use :meth:`step`); returns its block.

        Without :meth:`step`, the window runs from the previous ``end_step`` (or construction).
        """
        self._check_open()
        step = self._step
        self.clock.end(step)
        t0 = self._timer()
        in_window = self._telemetry - self._window_from
        drained = self._pending.drain(step)
        if examples is None or self._examples_seen is None:
            self._examples_seen = None
        else:
            self._examples_seen += int(examples)
        block = StepBlockRecord(
            optimizer_step=step,
            examples_seen=self._examples_seen,
            epoch=epoch,
            provenance=StepProvenance.EXPLICIT,
            truth=_UNKNOWN_TRUTH,  # a run log does not see the optimizer: all unknown
            wall_time=time.time(),
        )
        t_split = self._timer()
        telemetry = self._telemetry + (t_split - t0)
        rows = self.clock.finish(step, in_window, telemetry)
        scalars = drained.scalars
        own = [r for r in rows if r.step == step]  # host clock: in the block's own scalars
        if own:
            scalars = {**scalars, **clock_scalars(own[0])}
        self.sink.write_step(block, scalars=scalars)
        for name, at, value in drained.dated:
            self.sink.write_scalar(name, at, value)
        write_clock_rows(self.sink, [r for r in rows if r.step != step])  # CUDA: resolved late
        self._step = step + 1
        self._telemetry = self._timer() - t_split  # the write itself: the next step's telemetry
        self._window_from = self._telemetry
        self.clock.begin(self._step)
        return block

    # -- lifecycle ------------------------------------------------------------------------
    def view(self) -> RunView:
        """Everything written so far (an artifact is committed first)."""
        return view_of(self.sink, self.clock, self._closed)

    def close(self) -> None:
        """Write rows logged after the last step (no block), resolve clocks, commit, close."""
        if self._closed:
            return
        self._closed = True
        leftover = self._pending.drain(self._step)
        for name, value in leftover.scalars.items():
            self.sink.write_scalar(name, self._step, value)
        for name, at, value in leftover.dated:
            self.sink.write_scalar(name, at, value)
        write_clock_rows(self.sink, self.clock.resolve(block=True))
        self.close_report = self.sink.close(self.clock.summary(closed=True))

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def view_of(sink: Any, clock: StepClock, closed: bool) -> RunView:
    """A :class:`RunView` of the rows in ``sink`` (RAM rows, or an artifact committed first).

    Shared by :meth:`RunLog.view` and :meth:`stepscope.HistoryCollector.run_view`.
    """
    if isinstance(sink, MemorySink):
        sink.summary_data = clock.summary(closed=closed)
        return RunView(sink)
    if not closed:
        sink.writer.commit()
    return RunView(HistoryReader(sink.path))
