"""The three ways to get a :class:`~stepscope.profile.results.ProfileResult`.

* :func:`kernel_profile` -- run a model once under an owned session, save nothing to disk.
* :func:`from_profiler` -- join a caller-owned ``torch.profiler.profile`` after it stopped.
* :func:`load_trace` -- join a saved chrome trace (plain or gzipped, CUDA or ROCm).

Example
-------
>>> import torch, stepscope as ss
>>> result = ss.kernel_profile(torch.nn.Linear(4, 2), torch.randn(3, 4))
>>> "aten::addmm" in {row.key for row in result.hot_path(by="cpu_time", top=3)}
True
"""

from __future__ import annotations

import gzip
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.profile import compat
from stepscope.profile.kineto import join_events
from stepscope.profile.results import ProfileResult, availability_of
from stepscope.profile.session import session
from stepscope.profile.trace import MAX_TRACE_BYTES, read_chrome_trace
from stepscope.transfer import INTERNAL_PREFIX


def _synchronize(args: tuple[Any, ...]) -> None:
    devices = {a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "cuda"}
    if devices:
        with compat.record_function(INTERNAL_PREFIX + "synchronize"):
            for device in devices:
                torch.cuda.synchronize(device)


def kernel_profile(
    model: Any,
    x: Any,
    *,
    warmup: int = 0,
    altitudes: tuple[str, ...] = (),
    force_fallback: bool = False,
) -> ProfileResult:
    """Profile one call ``model(x)`` and join its device time to its ops.

    Parameters
    ----------
    model
        Any callable (usually an ``nn.Module``); its output is discarded.
    x
        The input, or a tuple of positional inputs.
    warmup
        Calls made before the profiled one, outside the session (lazy init, autotuning).
    altitudes
        Span altitudes to capture as well (see :class:`stepscope.session`).
    force_fallback
        Read events through the disclosed chrome-trace fallback instead of in memory.

    Returns
    -------
    ProfileResult
        Device-time views refuse ``device_time_unavailable`` when nothing was joined (e.g. a
        CPU-only build); CPU-time views always work.

    Examples
    --------
    >>> import torch, stepscope as ss
    >>> r = ss.kernel_profile(torch.nn.Linear(4, 2), torch.randn(3, 4))
    >>> r.availability.value  # on a CPU-only build
    'unavailable'
    """
    if not isinstance(warmup, int) or warmup < 0:
        raise Refusal("profile_view_invalid", f"warmup={warmup!r} must be an int >= 0.", [])
    args = x if isinstance(x, tuple) else (x,)
    for _ in range(warmup):
        model(*args)
    _synchronize(args)
    with session(altitudes=altitudes, force_fallback=force_fallback) as active:
        model(*args)
        _synchronize(args)
    return active.result  # a normal exit always sets it (refuses otherwise)


def from_profiler(prof: Any, *, force_fallback: bool = False) -> ProfileResult:
    """Join the events of a stopped, caller-owned ``torch.profiler.profile``.

    Examples
    --------
    >>> import torch, stepscope as ss
    >>> with torch.profiler.profile() as prof:  # the caller's own profiler
    ...     with ss.session(profiler=prof):
    ...         _ = torch.ones(2) + 1
    >>> rows = ss.profile.from_profiler(prof).hot_path(by="cpu_time", top=20)
    >>> "aten::add" in [row.key for row in rows]  # which op ranks first depends on timing
    True
    """
    if getattr(prof, "profiler", None) is None:
        raise Refusal(
            "profiler_session_inactive",
            "the profiler has no recorded events (never started).",
            ["pass a torch.profiler.profile after its `with` block has ended"],
        )
    requested = compat.requests_device(getattr(prof, "activities", ()))
    loaded = compat.extract_events(prof, requested, force_fallback)
    join = join_events(loaded.events)
    return ProfileResult(
        join=join,
        availability=availability_of(join, loaded.device_capable),
        source=loaded.source,
        disclosures=loaded.disclosures,
        exporter=lambda path: prof.export_chrome_trace(str(path)),
    )


def load_trace(path: str | os.PathLike[str], *, max_bytes: int = MAX_TRACE_BYTES) -> ProfileResult:
    """Join a saved chrome trace (plain or gzipped JSON) from any torch profiler version.

    Device events join to their launch by correlation id, then to the innermost op enclosing
    the launch on its thread; the External id is only a cross-check. A trace without device
    events gives availability ``unavailable`` (or ``empty`` when it names devices).

    Examples
    --------
    >>> import tempfile, torch, stepscope as ss
    >>> path = tempfile.mkdtemp() + "/trace.json"
    >>> with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
    ...     _ = torch.nn.Linear(4, 2)(torch.randn(3, 4))
    >>> prof.export_chrome_trace(path)
    >>> r = ss.profile.load_trace(path)
    >>> r.availability.value  # a CPU-only trace: no device events to join
    'unavailable'
    >>> "aten::addmm" in {row.key for row in r.hot_path(by="cpu_time", top=5)}
    True
    """
    source = Path(path)
    loaded = read_chrome_trace(source, max_bytes=max_bytes)
    join = join_events(loaded.events)

    def copy_trace(target: Path) -> None:
        target = Path(target)
        if target.resolve() == source.resolve():
            return
        with source.open("rb") as handle:
            gzipped = handle.read(2) == b"\x1f\x8b"
        if gzipped and target.suffix != ".gz":
            with gzip.open(source, "rb") as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
        else:
            shutil.copyfile(source, target)

    return ProfileResult(
        join=join,
        availability=availability_of(join, loaded.device_capable),
        source=loaded.source,
        disclosures=loaded.disclosures,
        exporter=copy_trace,
    )
