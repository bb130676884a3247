"""Run log: user scalars, evaluation rows, clocks and branch activity in the run's history."""

from stepscope.runlog.clocks import ClockKind, ClockRow, StepClock
from stepscope.runlog.evals import EVAL_LOG, EvalRecord, check_count
from stepscope.runlog.masks import withhold_inactive
from stepscope.runlog.names import (
    CLOCK_ELAPSED,
    CLOCK_NAMES,
    CLOCK_TELEMETRY,
    CLOCK_TRAINING,
    BranchField,
    Split,
    branch_scalar,
)
from stepscope.runlog.pending import BranchActivity, Drained, PendingStep
from stepscope.runlog.runlog import (
    RunLog,
    clock_scalars,
    make_eval,
    write_clock_rows,
    write_eval,
)
from stepscope.runlog.sink import (
    ArtifactRows,
    MemoryRows,
    close_artifact,
    read_eval_log,
    read_summary,
    write_summary,
)
from stepscope.runlog.view import BranchSeries, Clocks, RunView, ScalarSeries

__all__ = [
    "CLOCK_ELAPSED",
    "CLOCK_NAMES",
    "CLOCK_TELEMETRY",
    "CLOCK_TRAINING",
    "EVAL_LOG",
    "ArtifactRows",
    "BranchActivity",
    "BranchField",
    "BranchSeries",
    "ClockKind",
    "ClockRow",
    "Clocks",
    "Drained",
    "EvalRecord",
    "MemoryRows",
    "PendingStep",
    "RunLog",
    "RunView",
    "ScalarSeries",
    "Split",
    "StepClock",
    "branch_scalar",
    "check_count",
    "clock_scalars",
    "close_artifact",
    "make_eval",
    "read_eval_log",
    "read_summary",
    "withhold_inactive",
    "write_clock_rows",
    "write_eval",
    "write_summary",
]
