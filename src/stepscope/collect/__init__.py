"""Module-tier collection: the ``HistoryCollector`` and its settings."""

from stepscope.collect.cadence import (
    DEFAULT_CADENCE,
    AutoCadence,
    Cadence,
    CadenceChoice,
    choose_stream_cadences,
)
from stepscope.collect.collector import DEFAULT_STREAMS, HistoryCollector
from stepscope.collect.misuse import MisuseWarning
from stepscope.collect.plan import Plan, PlanRow
from stepscope.collect.settings import ALL_STREAMS, WatchSettings
from stepscope.collect.step import StepTransaction

__all__ = [
    "ALL_STREAMS",
    "DEFAULT_CADENCE",
    "DEFAULT_STREAMS",
    "AutoCadence",
    "Cadence",
    "CadenceChoice",
    "HistoryCollector",
    "MisuseWarning",
    "Plan",
    "PlanRow",
    "StepTransaction",
    "WatchSettings",
    "choose_stream_cadences",
]
