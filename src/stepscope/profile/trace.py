"""Profiler events in one normalised shape, and the chrome-trace reader.

Both sources of profiler events -- the in-memory Kineto results of a live profiler
(:mod:`stepscope.profile.compat`) and a saved chrome trace (this module) -- are turned into the
same :class:`TraceEvent` records, so the join (:mod:`stepscope.profile.kineto`) has one input.

Chrome traces store ``ts``/``dur`` in microseconds, often with fractional digits (nanosecond
traces). They are parsed as :class:`decimal.Decimal` and converted to integer nanoseconds exactly:
a float64 of a Unix-epoch microsecond timestamp only resolves 0.25 us.

Example
-------
>>> from stepscope.profile.trace import classify_category, TraceEventKind
>>> classify_category("cuda_runtime"), classify_category("Kernel"), classify_category("cpu_op")
(<TraceEventKind.RUNTIME: 'runtime'>, <TraceEventKind.KERNEL: 'kernel'>, <TraceEventKind.CPU_OP: 'cpu_op'>)
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any

from stepscope.errors import Refusal

#: Largest trace file (bytes, after decompression) the reader accepts.
MAX_TRACE_BYTES = 2 * 1024**3


class TraceEventKind(str, Enum):
    """The role a trace event plays in the join (not :class:`stepscope.events.EventKind`, which
    tags observer events)."""

    CPU_OP = "cpu_op"  # an op or annotation on a host thread: a candidate owner
    RUNTIME = "runtime"  # a runtime/driver call on a host thread (e.g. cudaLaunchKernel)
    KERNEL = "kernel"  # device work: a kernel
    MEMCPY = "memcpy"  # device work: a copy
    MEMSET = "memset"  # device work: a fill
    OTHER = "other"  # everything else (syncs, device-side annotations, metadata)


#: Kinds whose durations make up device time.
DEVICE_KINDS = frozenset({TraceEventKind.KERNEL, TraceEventKind.MEMCPY, TraceEventKind.MEMSET})

# Category spellings across profiler versions (lower-cased): 2021 traces used "Operator",
# "Runtime", "Kernel", "Memcpy", "Memset"; later ones cpu_op, cuda_runtime, kernel, gpu_memcpy.
# ROCm traces put HIP runtime calls in "cuda_runtime".
_CATEGORY_KINDS: dict[str, TraceEventKind] = {
    "cpu_op": TraceEventKind.CPU_OP,
    "operator": TraceEventKind.CPU_OP,
    "user_annotation": TraceEventKind.CPU_OP,
    "python_function": TraceEventKind.CPU_OP,
    "cuda_runtime": TraceEventKind.RUNTIME,
    "cuda_driver": TraceEventKind.RUNTIME,
    "runtime": TraceEventKind.RUNTIME,
    "privateuse1_runtime": TraceEventKind.RUNTIME,
    "privateuse1_driver": TraceEventKind.RUNTIME,
    "xpu_runtime": TraceEventKind.RUNTIME,
    "mtia_runtime": TraceEventKind.RUNTIME,
    "kernel": TraceEventKind.KERNEL,
    "concurrent_kernel": TraceEventKind.KERNEL,
    "gpu_memcpy": TraceEventKind.MEMCPY,
    "memcpy": TraceEventKind.MEMCPY,
    "gpu_memset": TraceEventKind.MEMSET,
    "memset": TraceEventKind.MEMSET,
}


def classify_category(category: str) -> TraceEventKind:
    """Map a profiler category (chrome ``cat`` or Kineto ``activity_type``) to its kind."""
    return _CATEGORY_KINDS.get(category.lower(), TraceEventKind.OTHER)


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One complete (``ph == "X"``) profiler event in integer nanoseconds.

    ``thread`` identifies the host thread (``(pid, tid)``) for host events and the device queue
    (``(device, stream)``) for device events. ``correlation`` is the runtime correlation id of
    runtime and device events (``None`` when absent); ``external_id`` is the profiler's
    External id (an op's identity on host events; only a cross-check on device events).
    """

    index: int
    kind: TraceEventKind
    category: str
    name: str
    start_ns: int
    dur_ns: int
    thread: tuple[Any, Any]
    correlation: int | None
    external_id: int | None

    @property
    def end_ns(self) -> int:
        """End of the event in ns (``start_ns + dur_ns``)."""
        return self.start_ns + self.dur_ns


@dataclass(frozen=True)
class LoadedTrace:
    """Events of one trace plus what the trace says about device capture."""

    events: tuple[TraceEvent, ...]
    device_capable: bool  # the trace names devices or runtime calls (empty vs unavailable)
    source: str
    disclosures: tuple[str, ...] = ()


def _us_to_ns(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise TypeError(what)
    if isinstance(value, int):
        return value * 1000
    if isinstance(value, Decimal):
        return int((value * 1000).to_integral_value())
    if isinstance(value, float):
        return round(value * 1000)
    raise TypeError(what)


def _optional_int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def events_from_chrome(payload: Any, source: str) -> LoadedTrace:
    """Normalise a parsed chrome-trace payload (dict with ``traceEvents``, or a bare list)."""
    if isinstance(payload, dict):
        raw = payload.get("traceEvents")
        device_props = payload.get("deviceProperties") or []
    else:
        raw, device_props = payload, []
    if not isinstance(raw, list):
        raise Refusal(
            "trace_invalid",
            f"{source} has no 'traceEvents' list; it is not a chrome trace.",
            ["pass a file written by torch.profiler (prof.export_chrome_trace or a trace handler)"],
        )
    events: list[TraceEvent] = []
    skipped = 0
    for record in raw:
        if not isinstance(record, dict) or record.get("ph") != "X":
            continue
        category = str(record.get("cat", ""))
        raw_args = record.get("args")
        args: dict[str, Any] = raw_args if isinstance(raw_args, dict) else {}
        try:
            start = _us_to_ns(record["ts"], "ts")
            dur = _us_to_ns(record.get("dur", 0), "dur")
        except (KeyError, TypeError):
            skipped += 1
            continue
        kind = classify_category(category)
        if kind in DEVICE_KINDS:
            thread = (args.get("device", record.get("pid")), args.get("stream", record.get("tid")))
        else:
            thread = (record.get("pid"), record.get("tid"))
        ext = args.get("External id", args.get("external id"))
        events.append(
            TraceEvent(
                index=len(events),
                kind=kind,
                category=category,
                name=str(record.get("name", "")),
                start_ns=start,
                dur_ns=max(dur, 0),
                thread=thread,
                correlation=_optional_int(args.get("correlation")),
                external_id=_optional_int(ext),
            )
        )
    has_runtime = any(e.kind is TraceEventKind.RUNTIME for e in events)
    disclosures = (f"{skipped} complete events without a numeric ts/dur were skipped",) * (
        skipped > 0
    )
    return LoadedTrace(tuple(events), bool(device_props) or has_runtime, source, disclosures)


def read_chrome_trace(path: str | os.PathLike[str], max_bytes: int = MAX_TRACE_BYTES) -> LoadedTrace:
    """Read a plain or gzipped chrome trace from ``path`` into :class:`TraceEvent` records.

    Refuses ``trace_invalid`` when the file is missing, larger than ``max_bytes`` once
    decompressed, not JSON, or not a chrome trace.
    """
    path = Path(path)
    try:
        with path.open("rb") as handle:
            magic = handle.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as handle:
            data = handle.read(max_bytes + 1)
    except (OSError, EOFError) as exc:
        raise Refusal(
            "trace_invalid",
            f"cannot read trace {str(path)!r}: {exc}.",
            ["check the path", "re-export the trace with prof.export_chrome_trace(path)"],
        ) from exc
    if len(data) > max_bytes:
        raise Refusal(
            "trace_invalid",
            f"trace {str(path)!r} is larger than the {max_bytes}-byte bound.",
            ["profile a shorter window (torch.profiler.schedule)", "raise max_bytes"],
        )
    try:
        payload = json.loads(data, parse_float=Decimal)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Refusal(
            "trace_invalid",
            f"trace {str(path)!r} is not valid JSON: {exc}.",
            ["the file may be truncated; re-export it"],
        ) from exc
    return events_from_chrome(payload, source=f"chrome_trace:{path.name}")
