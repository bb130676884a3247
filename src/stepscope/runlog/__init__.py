"""Run log: user scalars, evaluation rows, clocks and branch activity in the run's history.

Names are imported on first use (PEP 562): reading a run's evaluations and ``runlog.json``
(``stepscope verify``, ``stepscope show``) loads no torch; writing (``RunLog``, clocks) does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepscope.history.commits import EVAL_LOG
    from stepscope.runlog.clocks import ClockKind, ClockRow, StepClock
    from stepscope.runlog.evals import EvalRecord, check_count
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
    from stepscope.runlog.runlog import RunLog, clock_scalars, write_clock_rows
    from stepscope.runlog.sink import (
        DiskSink,
        MemorySink,
        StepSink,
        read_eval_log,
        read_summary,
        write_summary,
    )
    from stepscope.runlog.userlog import make_eval, write_eval
    from stepscope.runlog.view import BranchSeries, Clocks, ScalarSeries

#: public name -> the module that defines it
_WHERE: dict[str, str] = {
    "ClockKind": "stepscope.runlog.clocks",
    "ClockRow": "stepscope.runlog.clocks",
    "StepClock": "stepscope.runlog.clocks",
    "EVAL_LOG": "stepscope.history.commits",
    "EvalRecord": "stepscope.runlog.evals",
    "check_count": "stepscope.runlog.evals",
    "withhold_inactive": "stepscope.runlog.masks",
    "CLOCK_ELAPSED": "stepscope.runlog.names",
    "CLOCK_NAMES": "stepscope.runlog.names",
    "CLOCK_TELEMETRY": "stepscope.runlog.names",
    "CLOCK_TRAINING": "stepscope.runlog.names",
    "BranchField": "stepscope.runlog.names",
    "Split": "stepscope.runlog.names",
    "branch_scalar": "stepscope.runlog.names",
    "BranchActivity": "stepscope.runlog.pending",
    "Drained": "stepscope.runlog.pending",
    "PendingStep": "stepscope.runlog.pending",
    "RunLog": "stepscope.runlog.runlog",
    "clock_scalars": "stepscope.runlog.runlog",
    "make_eval": "stepscope.runlog.userlog",
    "write_clock_rows": "stepscope.runlog.runlog",
    "write_eval": "stepscope.runlog.userlog",
    "DiskSink": "stepscope.runlog.sink",
    "MemorySink": "stepscope.runlog.sink",
    "StepSink": "stepscope.runlog.sink",
    "read_eval_log": "stepscope.runlog.sink",
    "read_summary": "stepscope.runlog.sink",
    "write_summary": "stepscope.runlog.sink",
    "BranchSeries": "stepscope.runlog.view",
    "Clocks": "stepscope.runlog.view",
    "ScalarSeries": "stepscope.runlog.view",
}


__all__ = [
    "CLOCK_ELAPSED",
    "CLOCK_NAMES",
    "CLOCK_TELEMETRY",
    "CLOCK_TRAINING",
    "EVAL_LOG",
    "BranchActivity",
    "BranchField",
    "BranchSeries",
    "ClockKind",
    "ClockRow",
    "Clocks",
    "DiskSink",
    "Drained",
    "EvalRecord",
    "MemorySink",
    "PendingStep",
    "RunLog",
    "ScalarSeries",
    "Split",
    "StepClock",
    "StepSink",
    "branch_scalar",
    "check_count",
    "clock_scalars",
    "make_eval",
    "read_eval_log",
    "read_summary",
    "withhold_inactive",
    "write_clock_rows",
    "write_eval",
    "write_summary",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stepscope.runlog' has no attribute {name!r}")
