"""Trackers: subscribers that send events to TensorBoard, Weights & Biases and JSONL files.

Optional dependencies are imported only when a tracker is constructed (``require_extra``).
"""

from stepscope.events.trackers.base import Tracker, TrackerCounts
from stepscope.events.trackers.jsonl import JsonlTracker, read_jsonl
from stepscope.events.trackers.tensorboard import EXPONENT_VIEW_SUFFIX, TensorBoardTracker
from stepscope.events.trackers.wandb import WandbLogWarning, WandbTracker

__all__ = [
    "EXPONENT_VIEW_SUFFIX",
    "JsonlTracker",
    "TensorBoardTracker",
    "Tracker",
    "TrackerCounts",
    "WandbLogWarning",
    "WandbTracker",
    "read_jsonl",
]
