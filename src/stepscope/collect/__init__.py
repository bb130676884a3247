"""Module-tier collection: the ``HistoryCollector`` and its settings."""

from stepscope.collect.collector import DEFAULT_STREAMS, HistoryCollector, StepTransaction
from stepscope.collect.plan import Plan, PlanRow
from stepscope.collect.settings import (
    ALL_STREAMS,
    DEFAULT_CADENCE,
    Cadence,
    StreamName,
    WatchSettings,
)

__all__ = [
    "ALL_STREAMS",
    "DEFAULT_CADENCE",
    "DEFAULT_STREAMS",
    "Cadence",
    "HistoryCollector",
    "Plan",
    "PlanRow",
    "StepTransaction",
    "StreamName",
    "WatchSettings",
]
