"""Profiling: spans, user regions, the one profiler session door and the Kineto device-time join.

Example
-------
>>> import torch, stepscope as ss
>>> with ss.session() as s:
...     with ss.region("forward"):
...         _ = torch.nn.Linear(4, 2)(torch.randn(3, 4))
>>> s.result.hot_path(by="cpu_time", top=1)[0].calls >= 1
True
"""

from stepscope.profile.accounting import JoinResult, JoinStatus
from stepscope.profile.capture import from_profiler, kernel_profile, load_trace
from stepscope.profile.draw import CallNode, call_tree, draw
from stepscope.profile.kineto import join_events
from stepscope.profile.region import region
from stepscope.profile.results import Availability, HotPathRow, ProfileResult
from stepscope.profile.session import active_session, session
from stepscope.profile.spans import Altitude, OwnerClass, Span, SpanRegistry
from stepscope.profile.trace import TraceEvent, TraceEventKind

__all__ = [
    "Altitude",
    "Availability",
    "CallNode",
    "HotPathRow",
    "JoinResult",
    "JoinStatus",
    "OwnerClass",
    "ProfileResult",
    "Span",
    "SpanRegistry",
    "TraceEvent",
    "TraceEventKind",
    "active_session",
    "call_tree",
    "draw",
    "from_profiler",
    "join_events",
    "kernel_profile",
    "load_trace",
    "region",
    "session",
]
