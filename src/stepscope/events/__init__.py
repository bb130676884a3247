"""Events, checks and trackers: one scan of the tensors, many consumers.

The collector writes each step's rows to the artifact and hands them to :func:`events_from_step`;
the resulting :class:`ObserverEvent` s (one frozen class per kind: :class:`ScalarEvent`,
:class:`HistogramEvent`, :class:`VerdictEvent`, :class:`UnavailableEvent`, on shared :class:`Axes`
and :class:`Subject` value objects) go out on an :class:`EventBus` to checks
(:class:`NonFiniteCheck`, :class:`ZeroFractionCheck`, :class:`GradientNormCheck`,
:class:`UpdateRatioCheck`) and trackers (:class:`TensorBoardTracker`, :class:`WandbTracker`,
:class:`JsonlTracker`). :func:`export_run` replays a finished artifact through the same path;
:class:`LiveStream` sends a collector's steps to the trackers from a background thread while it
trains (``WatchSettings(tensorboard=..., wandb=...)``). The trackers that draw share one layout of
readable tags, :class:`TagLayout` (``act/<site>/rms``, ``grad/<site>/norm``, ...).
"""

from stepscope.events.bus import (
    MAX_CONSECUTIVE_FAILURES,
    CheckFailed,
    EventBus,
    Subscriber,
    SubscriberFailureWarning,
    SubscriberLike,
    SubscriberStatus,
)
from stepscope.events.checks import (
    Check,
    CheckAction,
    CheckWarning,
    Finding,
    GradientNormCheck,
    NonFiniteCheck,
    UpdateRatioCheck,
    ZeroFractionCheck,
)
from stepscope.events.convert import SpineScalar, event_prefix, events_from_step, spine_scalars
from stepscope.events.coordinates import NO_SUBJECT, Axes, Axis, GradientStage, Subject
from stepscope.events.event import (
    EventKind,
    EventSource,
    HistogramEvent,
    ObserverEvent,
    ScalarEvent,
    UnavailableEvent,
    VerdictEvent,
)
from stepscope.events.export import ExportReport, export_run, replay, step_events
from stepscope.events.live import LiveCounts, LiveStream, LiveStreamWarning
from stepscope.events.payload import HistogramPayload, Verdict
from stepscope.events.tags import Detail, TagLayout, run_name
from stepscope.events.trackers import (
    JsonlTracker,
    TensorBoardTracker,
    Tracker,
    TrackerCounts,
    WandbLogWarning,
    WandbTracker,
    read_jsonl,
)
from stepscope.events.views import (
    exponent_view,
    exponent_view_raw,
    log2_abs_view_raw,
    nonfinite_counts,
    nonfinite_raw,
    np_histogram,
    tensorboard_raw,
    value_np_histogram,
)

__all__ = [
    "MAX_CONSECUTIVE_FAILURES",
    "NO_SUBJECT",
    "Axes",
    "Axis",
    "Check",
    "CheckAction",
    "CheckFailed",
    "CheckWarning",
    "Detail",
    "EventBus",
    "EventKind",
    "EventSource",
    "ExportReport",
    "Finding",
    "GradientNormCheck",
    "GradientStage",
    "HistogramEvent",
    "HistogramPayload",
    "JsonlTracker",
    "LiveCounts",
    "LiveStream",
    "LiveStreamWarning",
    "NonFiniteCheck",
    "ObserverEvent",
    "ScalarEvent",
    "SpineScalar",
    "Subject",
    "Subscriber",
    "SubscriberFailureWarning",
    "SubscriberLike",
    "SubscriberStatus",
    "TagLayout",
    "TensorBoardTracker",
    "Tracker",
    "TrackerCounts",
    "UnavailableEvent",
    "UpdateRatioCheck",
    "Verdict",
    "VerdictEvent",
    "WandbLogWarning",
    "WandbTracker",
    "ZeroFractionCheck",
    "event_prefix",
    "events_from_step",
    "exponent_view",
    "exponent_view_raw",
    "export_run",
    "log2_abs_view_raw",
    "nonfinite_counts",
    "nonfinite_raw",
    "np_histogram",
    "read_jsonl",
    "replay",
    "run_name",
    "spine_scalars",
    "step_events",
    "tensorboard_raw",
    "value_np_histogram",
]
