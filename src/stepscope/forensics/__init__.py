"""Spike forensics: every-step layer scalars in RAM, triggers, and the window before a spike.

* :class:`FlightRecorder` — the settings (``WatchSettings(flight_recorder=...)``), see
  :mod:`stepscope.forensics.recorder`;
* the triggers (:mod:`stepscope.forensics.detector`): :class:`LossSpike`, :class:`NonFinite`,
  :class:`GradNormSpike`, :class:`UpdateRatioSpike`, :class:`Predicate`;
* attribution (:mod:`stepscope.forensics.attribution`): :class:`Spike`, :class:`Mover`,
  :func:`read_spikes` (``stepscope.open_run(path).spikes()``);
* the channels (:mod:`stepscope.forensics.channels`) and files
  (:mod:`stepscope.forensics.archive`).

The live parts (:mod:`~stepscope.forensics.reading`, the hooks; :mod:`~stepscope.forensics.flight`,
the per-step loop) import torch and are used by the collector; everything re-exported here reads
runs with numpy only.
"""

from stepscope.forensics.attribution import Mover, Spike, first_movers, read_spikes
from stepscope.forensics.channels import RECORDER_STREAMS, Channel
from stepscope.forensics.detector import (
    Crossing,
    GradNormSpike,
    LossSpike,
    NonFinite,
    Predicate,
    StepReading,
    Trigger,
    UpdateRatioSpike,
    default_triggers,
)
from stepscope.forensics.recorder import FlightRecorder

__all__ = [
    "RECORDER_STREAMS",
    "Channel",
    "Crossing",
    "FlightRecorder",
    "GradNormSpike",
    "LossSpike",
    "Mover",
    "NonFinite",
    "Predicate",
    "Spike",
    "StepReading",
    "Trigger",
    "UpdateRatioSpike",
    "default_triggers",
    "first_movers",
    "read_spikes",
]
