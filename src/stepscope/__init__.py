"""stepscope: see inside PyTorch training, step by step.

Names are re-exported lazily so that ``import stepscope`` stays fast and an area's optional
dependencies are only imported when that area is used. Type checkers see the same names through
the ``TYPE_CHECKING`` imports below (so ``ss.HistoryCollector`` has its real type and
``ss.NoSuchThing`` is an error); a test keeps the two lists equal.

Example
-------
>>> import stepscope as ss
>>> import torch
>>> s = ss.stats.RunningStats()
>>> s.update(torch.tensor([1.0, -2.0, 0.0]))
>>> (s.total, s.zero, s.negative, s.sum)
(3, 1, 1, -1.0)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stepscope.errors import Refusal

if TYPE_CHECKING:  # what the lazy table below resolves to, spelled out for type checkers
    # ``name as name``: an explicit re-export (ruff and mypy read it so)
    from stepscope import curvature as curvature
    from stepscope import history as history
    from stepscope import profile as profile
    from stepscope import stats as stats
    from stepscope.collect import AutoCadence as AutoCadence
    from stepscope.collect import Cadence as Cadence
    from stepscope.collect import HistoryCollector as HistoryCollector
    from stepscope.collect import MisuseWarning as MisuseWarning
    from stepscope.collect import WatchSettings as WatchSettings
    from stepscope.curvature import analyze_curvature as analyze_curvature
    from stepscope.events import EventBus as EventBus
    from stepscope.events import ObserverEvent as ObserverEvent
    from stepscope.forensics import FlightRecorder as FlightRecorder
    from stepscope.probe import DenseProbe as DenseProbe
    from stepscope.profile import draw as draw
    from stepscope.profile import kernel_profile as kernel_profile
    from stepscope.profile import region as region
    from stepscope.profile import session as session
    from stepscope.run import open_run as open_run
    from stepscope.runlog import RunLog as RunLog

from stepscope._version import __version__ as __version__

# public name -> "module:attribute" (attribute empty for a sub-module)
_EXPORTS: dict[str, str] = {
    "stats": "stepscope.stats:",
    "history": "stepscope.history:",
    "curvature": "stepscope.curvature:",
    "profile": "stepscope.profile:",
    # the one reader entry point: a Run (history + run log + flight recorder)
    "open_run": "stepscope.run:open_run",
    "HistoryCollector": "stepscope.collect:HistoryCollector",
    "WatchSettings": "stepscope.collect:WatchSettings",
    "MisuseWarning": "stepscope.collect:MisuseWarning",
    "Cadence": "stepscope.collect:Cadence",
    "AutoCadence": "stepscope.collect:AutoCadence",
    "EventBus": "stepscope.events:EventBus",
    "ObserverEvent": "stepscope.events:ObserverEvent",
    "RunLog": "stepscope.runlog:RunLog",
    "region": "stepscope.profile:region",
    "session": "stepscope.profile:session",
    "kernel_profile": "stepscope.profile:kernel_profile",
    "draw": "stepscope.profile:draw",
    "DenseProbe": "stepscope.probe:DenseProbe",
    "analyze_curvature": "stepscope.curvature:analyze_curvature",
    "FlightRecorder": "stepscope.forensics:FlightRecorder",
}

__all__ = ["Refusal", "__version__", *_EXPORTS]


if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name is an error there

    def __getattr__(name: str) -> Any:
        target = _EXPORTS.get(name)
        if target is None:
            raise AttributeError(f"module 'stepscope' has no attribute {name!r}")
        module_name, _, attr = target.partition(":")
        module = importlib.import_module(module_name)
        value = getattr(module, attr) if attr else module
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(__all__)
