"""What to watch stays flat on the collector; the plumbing knobs ride :class:`WatchSettings`.

How often each stream is taken (``Cadence``) is :mod:`stepscope.collect.cadence`'s.

Example
-------
>>> s = WatchSettings(output_dir="runs/a", histogram_descriptor=None)
>>> s.ram_policy
<RingPolicy.REFUSE: 'refuse'>
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stepscope.codec import parse_enum
from stepscope.defaults import DEFAULT_SEED
from stepscope.errors import Refusal
from stepscope.forensics.recorder import FlightRecorder
from stepscope.history.ring import RingPolicy
from stepscope.history.vocab import Stream
from stepscope.stats import HistogramDescriptor

#: The five things a collector can watch (the values of :class:`~stepscope.history.Stream`).
ALL_STREAMS: tuple[str, ...] = tuple(s.value for s in Stream)


def _non_finite(value: Any, where: str = "") -> str | None:
    """The key path of the first NaN/inf float inside ``value`` (nested mappings and lists)."""
    if isinstance(value, float) and not math.isfinite(value):
        return where
    items = (
        value.items()
        if isinstance(value, Mapping)
        else (enumerate(value) if isinstance(value, (list, tuple)) else ())
    )
    for k, v in items:
        found = _non_finite(v, f"{where}[{k!r}]")
        if found is not None:
            return found
    return None


def _check_types(s: Any) -> None:
    """Plain ``TypeError`` for a field of the wrong type (never a silent coercion)."""
    ints = ("ram_capacity", "update_sample_size", "update_seed", "commit_steps")
    checks: list[tuple[str, tuple[type, ...], str]] = [(f, (int,), "an int") for f in ints]
    bools = ("resume", "durable", "in_memory", "background_writer")
    checks += [(f, (bool,), "a bool") for f in bools]
    checks += [(f, (str,), "a str") for f in ("ram_policy", "kernel_backend")]
    checks += [("extra", (Mapping,), "a mapping"), ("output_keys", (Mapping,), "a mapping")]
    for name, kinds, what in checks:
        v = getattr(s, name)
        if not isinstance(v, kinds) or (kinds == (int,) and isinstance(v, bool)):
            raise TypeError(f"WatchSettings.{name} must be {what}, not {type(v).__name__}")
    optional: list[tuple[str, tuple[type, ...], str]] = [
        ("output_dir", (str, os.PathLike), "a str or path"),
        ("run_id", (str,), "a str"),
        ("root_dir", (str, os.PathLike), "a str or path"),
        ("name", (str,), "a str"),
        ("commit_seconds", (int, float), "a number"),
        ("histogram_descriptor", (HistogramDescriptor,), "a HistogramDescriptor"),
        ("flight_recorder", (FlightRecorder,), "a stepscope.FlightRecorder"),
    ]
    for name, kinds, what in optional:
        v = getattr(s, name)
        if v is not None and (not isinstance(v, kinds) or isinstance(v, bool)):
            raise TypeError(f"WatchSettings.{name} must be {what} or None, not {type(v).__name__}")


def _check_live(tensorboard: Any, wandb: Any) -> None:
    """``tensorboard``: a directory or a tracker; ``wandb``: a bool or a tracker (else TypeError)."""

    def tracker(v: Any) -> bool:
        return callable(getattr(v, "on_events", None))

    if not (
        tensorboard is None or isinstance(tensorboard, (str, os.PathLike)) or tracker(tensorboard)
    ):
        raise TypeError(
            "WatchSettings.tensorboard must be a log directory or a TensorBoardTracker, "
            f"not {type(tensorboard).__name__}"
        )
    if not (isinstance(wandb, bool) or tracker(wandb)):
        raise TypeError(
            f"WatchSettings.wandb must be a bool or a WandbTracker, not {type(wandb).__name__}"
        )


def check_streams(streams: Iterable[str]) -> list[str]:
    """``streams`` without repeats, in order; refuses ``stream_unknown`` for any other name."""
    out = list(dict.fromkeys(streams))
    unknown = [s for s in out if s not in ALL_STREAMS]
    if unknown or not out:
        raise Refusal(
            "stream_unknown", f"unknown streams {unknown or out}", [f"choose from {ALL_STREAMS}"]
        )
    return out


@dataclass(frozen=True)
class WatchSettings:
    """Plumbing knobs of a :class:`~stepscope.HistoryCollector` (frozen).

    Parameters
    ----------
    output_dir
        Exactly this artifact directory (tests, and ``resume=True``). A second run into it
        refuses ``history_run_exists``, naming ``WatchSettings(output_dir=..., resume=True)``.
        ``None`` (default): a new version directory, ``<root_dir>/<name>/version_<N>``, claimed
        atomically (see :mod:`stepscope.history.versions`), so re-running a script never
        collides; ``collector.run_dir`` says where it went.
    root_dir
        The folder of runs for versioned runs (default ``$STEPSCOPE_DIR``, else ``./runs``).
    name
        The run's name under ``root_dir`` (``runs/<name>/version_<N>``; default: none,
        ``runs/version_<N>``).
    in_memory
        Keep steps in a RAM ring only, nothing on disk: ``ram_capacity`` steps, and then
        ``ram_policy`` (``"refuse"`` stops with ``ring_capacity_exhausted``).
    run_id
        Run identity written in the run record (default: a fresh id).
    resume
        Append a new segment to an existing artifact in ``output_dir``. Needs the explicit
        ``step()`` transaction (``optimizer=`` refuses ``step_transaction_required``). The model
        must have the artifact's architecture and the settings its histogram descriptor (else
        ``resume_fingerprint_mismatch`` / ``resume_descriptor_mismatch``, naming both values).
        Steps continue at ``resume_step`` (default: one past the last committed step) and
        ``examples_seen`` from the artifact's block just before it; the new segment records its
        own fingerprint, cadences and settings, with its parent segment and resume step.
    resume_step
        The step of the checkpoint you restored (its first step to run again); steps of the
        artifact from there on are superseded by the new segment.
    resume_examples_seen
        ``examples_seen`` at ``resume_step`` (default: the artifact's value at the step before;
        ``None`` there, e.g. when the checkpoint lies beyond the committed steps, keeps it
        unknown).
    ram_capacity, ram_policy
        Ring of recent step blocks; ``in_memory=True`` policy (a :class:`~stepscope.history.ring.RingPolicy`
        or its value, stored as the enum) ``refuse`` (default), ``drop_oldest`` or ``coarsen``.
        With disk on the ring is an LRU cache.
    histogram_descriptor
        The histogram grid (default ``HistogramDescriptor()``).
    update_sample_size
        Elements per parameter in the update channel: a seeded subvector of
        ``min(numel, update_sample_size)`` distinct indices (exact when it covers the parameter).
    update_seed
        Seed of the private generator that draws the update indices (never the global RNG).
    commit_steps, commit_seconds
        Artifact group commit: the pending steps are committed (chunks written, fsynced, one
        index line appended) once ``commit_seconds`` (10) have passed since the last commit or
        ``commit_steps`` (1024) steps are pending, whichever comes first. A ``kill -9`` loses
        exactly the steps not yet committed: at most ``commit_seconds`` of training (and at most
        ``commit_steps`` steps). A commit costs a few fsyncs (~10-50 ms on a shared disk); by
        time, that is <= 0.5% of any training, where every 32 steps it was 1-25% of a 3-70 ms
        step (README, "Collector overhead").
    event_bus
        A :class:`~stepscope.EventBus` to publish each step's events on (optional).
    kernel_backend
        ``"auto"``, ``"c"`` or ``"torch"`` (see :func:`stepscope.stats.backend_info`).
    durable
        ``fsync`` artifact files (turn off only for throwaway benchmarks).
    background_writer
        Encode and commit the artifact on a background thread (``stepscope-writer``), so no
        file is written or fsynced on the training thread (default ``True``; ``False``: the
        commit runs inside the step, as before). The durability window is the same: a
        ``kill -9`` loses at most the ``commit_steps`` steps / ``commit_seconds`` seconds not
        yet committed, plus the steps still queued for the thread. When the disk falls so far
        behind that 256 steps (or ``ram_capacity`` or ``commit_steps``, if larger) wait, a new
        step is not waited for: its block and scalars are kept, its cells recorded
        ``budget_dropped`` disclosed ``writer_behind`` (``collector.close_report.behind_steps``).
        Interpreter exit flushes (``atexit``); see ``docs/history.md``, "Background writer".
        With a ``flight_recorder`` the commits stay on the training thread (the recorder saves
        its window at each commit it sees there).
    extra
        JSON-safe fields copied into the run record.
    output_keys
        ``{site glob: path}``: which tensor of a structured module output is the site's
        activation (a dotted path of keys, attributes, indices, e.g. ``"logits"``); sites not
        named use the first tensor depth-first (see :mod:`stepscope.collect.staging`).
    live_merge
        Under a ``torch.distributed`` group of more than one rank, gather every logged step's
        rows to rank 0 in one collective and publish the merged rows there (see
        :mod:`stepscope.collect.distributed`); ``False``: no communication at all.
    tensorboard
        Stream every written step to TensorBoard while training runs: a log directory (the run
        goes to ``DIR/<run name>``, the output directory's name) or a
        :class:`~stepscope.events.TensorBoardTracker`. From a background thread that never
        blocks the step (see :mod:`stepscope.events.live`; rank 0 only).
    wandb
        ``True``: stream to a W&B run named after the run (``WANDB_MODE``, ``WANDB_PROJECT``
        honoured); or a :class:`~stepscope.events.WandbTracker`.
    flight_recorder
        A :class:`~stepscope.forensics.FlightRecorder`: every-step per-site scalars in a RAM
        window, triggers that save it to the artifact and make the cadence dense for a while
        (spike forensics, ``docs/forensics.md``). ``None`` (default): off.

    Raises
    ------
    TypeError
        A field of the wrong type (e.g. ``commit_steps="3"``, ``output_dir=123``): never coerced.
    Refusal
        ``settings_invalid`` for a value out of range (``commit_seconds=nan``, ``ram_capacity=0``).
    """

    output_dir: str | os.PathLike[str] | None = None
    run_id: str | None = None
    resume: bool = False
    ram_capacity: int = 256
    ram_policy: RingPolicy | str = RingPolicy.REFUSE
    histogram_descriptor: HistogramDescriptor | None = None
    update_sample_size: int = 4096
    update_seed: int = DEFAULT_SEED
    commit_steps: int = 1024
    commit_seconds: float | None = 10.0
    event_bus: Any = None
    kernel_backend: str = "auto"
    durable: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)
    output_keys: Mapping[str, str] = field(default_factory=dict)
    resume_step: int | None = None
    resume_examples_seen: int | None = None
    live_merge: bool = True
    tensorboard: Any = None
    wandb: Any = False
    flight_recorder: FlightRecorder | None = None
    root_dir: str | os.PathLike[str] | None = None
    name: str | None = None
    in_memory: bool = False
    background_writer: bool = True

    def __post_init__(self) -> None:
        _check_types(self)
        _check_live(self.tensorboard, self.wandb)
        problems = []
        if self.commit_steps < 1:
            problems.append(f"commit_steps must be >= 1, not {self.commit_steps}")
        if self.commit_seconds is not None and not 0 < self.commit_seconds < math.inf:
            problems.append(f"commit_seconds must be finite and > 0, not {self.commit_seconds}")
        if self.update_seed < 0:
            problems.append("update_seed must be >= 0")
        if self.run_id is not None and not self.run_id.strip():
            problems.append("run_id must be a non-empty string or None")
        if self.ram_capacity < 1:
            problems.append("ram_capacity must be >= 1")
        policy = parse_enum(RingPolicy, self.ram_policy, "ram_policy", "settings_invalid")
        object.__setattr__(self, "ram_policy", policy)
        if self.update_sample_size < 1:
            problems.append("update_sample_size must be >= 1")
        if self.kernel_backend not in ("auto", "c", "torch"):
            problems.append(f"kernel_backend {self.kernel_backend!r} not in auto/c/torch")
        if self.resume and not self.output_dir:
            problems.append(
                "resume needs the run's exact directory: "
                "WatchSettings(output_dir='runs/<name>/version_<N>', resume=True)"
            )
        if self.in_memory and (self.output_dir or self.root_dir or self.name):
            problems.append("in_memory=True writes nothing to disk: drop output_dir/root_dir/name")
        if self.output_dir and (self.root_dir or self.name):
            problems.append(
                "output_dir is the exact directory; root_dir/name choose a versioned one: "
                "pass one or the other"
            )
        if self.name is not None and (
            not self.name.strip() or ".." in Path(self.name).parts or Path(self.name).is_absolute()
        ):
            problems.append(f"name {self.name!r} must be a relative folder name (no '..')")
        if self.event_bus is not None and not (
            callable(getattr(self.event_bus, "publish", None)) and hasattr(self.event_bus, "active")
        ):
            problems.append(
                f"event_bus must be a stepscope.EventBus or None, not "
                f"{type(self.event_bus).__name__} (event_bus=ss.EventBus())"
            )
        bad = _non_finite(self.extra)
        if bad is not None:
            problems.append(f"extra{bad} is not finite: the run record holds JSON numbers only")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.output_keys.items()):
            problems.append("output_keys must map site globs to dotted paths (str -> str)")
        if (self.resume_step is not None or self.resume_examples_seen is not None) and not (
            self.resume
        ):
            problems.append("resume_step/resume_examples_seen need resume=True")
        for name in ("resume_step", "resume_examples_seen"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                problems.append(f"{name} must be an int >= 0")
        if problems:
            raise Refusal("settings_invalid", "invalid WatchSettings: " + "; ".join(problems) + ".")

    def check_spelling(self, implicit: bool) -> None:
        """Refuse ``step_transaction_required`` for a resume with the implicit ``optimizer=``
        spelling (a resumed run records explicit steps only)."""
        if self.resume and implicit:
            raise Refusal(
                "step_transaction_required",
                "a resumed run records only explicit steps (its step and examples_seen "
                "continue from the artifact); the implicit optimizer= spelling cannot resume.",
                [
                    "drop optimizer= and wrap each step in `with collector.step(optimizer, "
                    "examples=n):`"
                ],
            )

    @property
    def descriptor(self) -> HistogramDescriptor:
        return self.histogram_descriptor or HistogramDescriptor()
