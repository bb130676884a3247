"""The one version-compatibility module between stepscope and ``torch.profiler``/Kineto.

Everything that depends on private or version-specific profiler surfaces lives here and is
feature-detected, never version-sniffed:

* :func:`extract_events` reads a stopped profiler's events in memory
  (``prof.profiler.kineto_results.events()``, a list of ``_KinetoEvent``). When that surface is
  missing it falls back to a bounded chrome-trace export into a temporary directory (deleted
  afterwards) and says so in the returned disclosures.
* :func:`record_function` opens a ``torch.profiler.record_function`` bracket.
* :func:`default_activities` picks the profiler activities the build can record.

Example
-------
>>> import torch
>>> from stepscope.profile.compat import default_activities
>>> torch.profiler.ProfilerActivity.CPU in default_activities()
True
"""

from __future__ import annotations

import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.profile.trace import (
    DEVICE_KINDS,
    LoadedTrace,
    TraceEvent,
    TraceEventKind,
    classify_category,
    read_chrome_trace,
)

#: Bound on the decompressed size of the fallback chrome trace (bytes).
FALLBACK_MAX_BYTES = 512 * 1024**2

SOURCE_IN_MEMORY = "in_memory_kineto"
SOURCE_FALLBACK = "chrome_trace_fallback"


def default_activities() -> list[Any]:
    """CPU plus every device activity this build can record (CUDA/ROCm, XPU)."""
    activity = torch.profiler.ProfilerActivity
    out = [activity.CPU]
    if torch.cuda.is_available():
        out.append(activity.CUDA)  # ROCm builds report HIP work through the CUDA activity
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and hasattr(activity, "XPU") and xpu.is_available():
        out.append(activity.XPU)
    return out


def requests_device(activities: Any) -> bool:
    """Whether an activity list asks for any device activity."""
    return any(a != torch.profiler.ProfilerActivity.CPU for a in activities or ())


def record_function(label: str) -> AbstractContextManager:
    """A ``torch.profiler.record_function`` bracket named ``label`` (not yet entered)."""
    return torch.profiler.record_function(label)


def _kineto_events(prof: Any) -> list[Any]:
    """The in-memory ``_KinetoEvent`` list, or raise ``AttributeError`` if this torch lacks it."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None or not hasattr(results, "events"):
        raise AttributeError("prof.profiler.kineto_results.events is not available")
    return list(results.events())


def _nonzero(value: Any) -> int | None:
    value = int(value)
    return value if value != 0 else None


def _convert(index: int, e: Any) -> TraceEvent:
    category = str(e.activity_type()) if hasattr(e, "activity_type") else ""
    kind = classify_category(category)
    name = e.name()
    if kind is TraceEventKind.OTHER and str(e.device_type()).endswith("CUDA"):
        kind = (
            TraceEventKind.MEMCPY
            if name.startswith("Memcpy")
            else TraceEventKind.MEMSET
            if name.startswith("Memset")
            else kind
        )
    # Device events: (device, stream). Host events: the system thread id, which Kineto's own
    # chrome export writes as tid for ops and runtime calls alike. The pid slot is not used:
    # events of one live profiler all come from this process.
    thread: tuple[Any, int]
    if kind in DEVICE_KINDS:
        thread = (int(e.device_index()), int(e.device_resource_id()))
    else:
        thread = ("host", int(e.device_resource_id()))
    if kind is TraceEventKind.CPU_OP:
        ext = e.external_id() if hasattr(e, "external_id") else e.correlation_id()
        correlation, external = None, _nonzero(ext)
    else:
        correlation, external = _nonzero(e.correlation_id()), _nonzero(e.linked_correlation_id())
    return TraceEvent(
        index=index,
        kind=kind,
        category=category,
        name=name,
        start_ns=int(e.start_ns()),
        dur_ns=max(int(e.duration_ns()), 0),
        thread=thread,
        correlation=correlation,
        external_id=external,
    )


def extract_events(
    prof: Any,
    device_requested: bool,
    force_fallback: bool = False,
    max_bytes: int = FALLBACK_MAX_BYTES,
) -> LoadedTrace:
    """Events of a *stopped* ``torch.profiler.profile``, in memory when possible.

    Parameters
    ----------
    prof
        A profiler that has been started and stopped.
    device_requested
        Whether device activity was recorded (distinguishes "empty" from "unavailable").
    force_fallback
        Use the chrome-trace path even when in-memory events exist (tests, debugging).
    max_bytes
        Bound on the fallback trace size; a larger trace refuses ``trace_invalid``.

    Returns
    -------
    LoadedTrace
        Events plus ``source`` (``in_memory_kineto`` or ``chrome_trace_fallback``) and
        disclosures naming the path taken.
    """
    inner = getattr(prof, "profiler", None)
    if inner is not None and hasattr(inner, "kineto_results") and inner.kineto_results is None:
        raise Refusal(
            "profiler_session_inactive",
            "the profiler is still running: its events can be read once it has stopped.",
            ["call from_profiler(prof) after the `with torch.profiler.profile(...)` block"],
        )
    reason = "forced by the caller"
    if not force_fallback:
        try:
            raw = _kineto_events(prof)
            events = tuple(_convert(i, e) for i, e in enumerate(raw))
        except (AttributeError, TypeError) as exc:  # a torch without this private surface
            reason = f"in-memory Kineto events unavailable ({exc})"
        else:
            has_device = any(
                e.kind in DEVICE_KINDS or e.kind is TraceEventKind.RUNTIME for e in events
            )
            return LoadedTrace(events, device_requested or has_device, SOURCE_IN_MEMORY)
    with tempfile.TemporaryDirectory(prefix="stepscope-trace-") as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        loaded = read_chrome_trace(path, max_bytes=max_bytes)
    disclosure = (
        f"events were read from a temporary chrome trace (bounded to {max_bytes} bytes, "
        f"deleted after reading): {reason}"
    )
    return LoadedTrace(
        loaded.events,
        device_requested or loaded.device_capable,
        SOURCE_FALLBACK,
        (*loaded.disclosures, disclosure),
    )
