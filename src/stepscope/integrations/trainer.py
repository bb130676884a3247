"""Watching a trainer, framework-neutral: the one core both trainer callbacks delegate to.

A trainer (Lightning, Hugging Face) calls its callbacks at fixed events; a
:class:`TrainerWatch` turns those events into the collector's explicit spelling::

    with collector.step(optimizer, scaler=..., epoch=...) as st:   # begin_step()
        ...micro-batches...                                         # micro_batch() each
        st.declare(micro_batches=..., examples=..., clipped=...)    # end_step()

The ``with`` block is entered and exited from two different callback events, so the watch holds
the context manager between them. Everything a framework adapter needs is here: the default run
directory, one run id shared by every rank (broadcast from rank 0), resume at the trainer's
checkpoint step with segment ancestry, scalars and evaluation rows, and the optional dense probe.
The adapters (:mod:`stepscope.integrations.lightning`, :mod:`stepscope.integrations.transformers`)
derive from :class:`WatchingCallback` (the constructor and ``watch``), only read their
framework's state and delegate here, one line per event.

Example
-------
>>> import torch
>>> from stepscope.integrations.trainer import TrainerWatch
>>> model = torch.nn.Linear(4, 2)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> watch = TrainerWatch(settings=None)
>>> _ = watch.start(model, default_dir=None, trainer_step=0, rank=0, announce=print)
stepscope: run ... recording to .../version_0
>>> for step in range(2):
...     watch.begin_step(opt, trainer_step=step, epoch=0)
...     for _ in range(2):  # two micro-batches of 8 examples
...         model(torch.randn(8, 4)).pow(2).mean().backward()
...         watch.micro_batch(examples=8)
...     opt.step(); opt.zero_grad()
...     recorded = watch.end_step(clipped=False, scalars={"train/loss": 1.0})
>>> [(r.block.optimizer_step, r.block.examples_seen, r.block.truth.micro_batches)
...  for r in watch.collector.ring.blocks()]
[(0, 16, 2), (1, 32, 2)]
>>> watch.close()
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from stepscope.collect import DEFAULT_STREAMS, HistoryCollector, StepTransaction, WatchSettings
from stepscope.errors import Refusal
from stepscope.history.versions import default_root, newest_version
from stepscope.probe import DenseProbe, choose_cadence, write_probe_record

#: Where a run records is said through ``logging`` (this module's logger), as Lightning says its
#: own: printed on stderr while the application has configured no logging, else its handlers.
_log = logging.getLogger(__name__)
if not logging.getLogger().hasHandlers() and not _log.handlers:
    _log.setLevel(logging.INFO)
    _log.addHandler(logging.StreamHandler())
    _log.propagate = False

#: Steps whose training-clock seconds are timed before the probe's cadence is chosen.
PROBE_TIMING_STEPS = 5


class IntegrationStoppedWarning(RuntimeWarning):
    """A trainer callback stopped recording (the run goes on; committed steps are kept)."""


def shared_run_id(run_id: str | None) -> str:
    """One run id for every rank: ``run_id`` if given, else a fresh one broadcast from rank 0.

    Without an initialised process group this is just ``run_id`` or a fresh id.
    """
    chosen = run_id or uuid.uuid4().hex[:12]
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [chosen]
        dist.broadcast_object_list(box, src=0)
        chosen = box[0]
    return chosen


@dataclass
class ProbePlan:
    """How the optional dense probe runs: every ``every`` optimizer steps, chosen from timings.

    Attributes
    ----------
    probe
        The :class:`~stepscope.DenseProbe` (a fixed probe from the training split).
    every
        Probe cadence in optimizer steps; ``None`` until it is chosen from measurements (the
        probe's own time at step 0 and the first :data:`PROBE_TIMING_STEPS` training steps).
    target
        Overhead target of the choice (fraction of training time).
    decision
        The :class:`~stepscope.probe.CadenceDecision` as a dict once made (run scalars
        ``probe/cadence_steps`` and ``probe/expected_overhead`` record it too).
    probe_seconds
        Measured seconds of each probe measurement so far (the cadence is chosen from them).
    """

    probe: DenseProbe
    every: int | None = None
    target: float = 0.05
    decision: dict[str, Any] | None = None
    probe_seconds: list[float] = dataclasses.field(default_factory=list)

    def due(self, step: int) -> bool:
        """Step 0 always (the init reference); then every ``every`` steps once chosen."""
        return step == 0 or (self.every is not None and step % self.every == 0)


def as_probe_plan(probe: DenseProbe | ProbePlan | None) -> ProbePlan | None:
    """Accept a :class:`~stepscope.DenseProbe` or a :class:`ProbePlan` (``None``: no probe)."""
    if probe is None or isinstance(probe, ProbePlan):
        return probe
    if isinstance(probe, DenseProbe):
        return ProbePlan(probe)
    raise Refusal(
        "settings_invalid",
        f"probe= must be a DenseProbe or a ProbePlan, not {type(probe).__name__}",
        ["build one with ss.DenseProbe(inputs, labels, size=...)"],
    )


@dataclass
class _OpenStep:
    """The step transaction held between the framework's begin and end events."""

    manager: Any
    txn: StepTransaction
    started: float
    micro_batches: int = 0
    examples: int | None = 0


class Removable(Protocol):
    """A hook handle: ``torch.utils.hooks.RemovableHandle``, ``stepscope.stephooks.OuterStepHooks``."""

    def remove(self) -> None: ...


class TrainerWatch:
    """Drive a :class:`~stepscope.HistoryCollector` from a trainer's callback events.

    Parameters
    ----------
    sites, streams, cadence, settings
        As for :class:`~stepscope.HistoryCollector`. Without ``settings.output_dir`` each run
        is a new ``<default_dir>/version_<N>`` (``settings.root_dir`` replaces ``default_dir``),
        so running the same training twice never collides; a trainer resumed from a checkpoint
        continues the newest version.
    probe
        Optional :class:`~stepscope.DenseProbe` (or a :class:`ProbePlan` fixing its cadence).
    """

    def __init__(
        self,
        sites: Any = None,
        streams: tuple[str, ...] | list[str] = DEFAULT_STREAMS,
        cadence: Any = None,
        settings: WatchSettings | None = None,
        probe: DenseProbe | ProbePlan | None = None,
    ) -> None:
        self.sites, self.streams, self.cadence = sites, tuple(streams), cadence
        self.settings = settings
        self.probe = as_probe_plan(probe)
        self.collector: HistoryCollector | None = None
        self.path: Path | None = None
        self._open: _OpenStep | None = None
        self._model: torch.nn.Module | None = None
        self._step_seconds: list[float] = []
        self._handles: list[Removable] = []

    # ------------------------------------------------------------------ lifecycle
    def start(
        self,
        model: torch.nn.Module,
        *,
        default_dir: str | Path | None,
        trainer_step: int,
        rank: int,
        announce: Callable[[str], None] | None = None,
    ) -> HistoryCollector:
        """Open the collector at the trainer's current optimizer step ``trainer_step``.

        ``trainer_step > 0`` (a run resumed from a checkpoint) appends a segment to the existing
        artifact whose steps continue at ``trainer_step`` (``WatchSettings.resume_step``): steps
        recorded after an earlier checkpoint are superseded by the new segment, never duplicated.
        Rank 0 announces the run directory (``announce``, by default an INFO line of logger
        ``stepscope.integrations.trainer``).
        """
        if self.collector is not None and not self.collector.closed:
            return self.collector
        settings = self.settings or WatchSettings()
        out = None if settings.output_dir is None else str(settings.output_dir)
        if out is None and not settings.in_memory:
            root = settings.root_dir or default_dir  # a new version_<N> under it per run
            settings = dataclasses.replace(settings, root_dir=None if root is None else str(root))
            if trainer_step > 0:  # resumed from a checkpoint: continue the newest version
                out = _resumable(Path(root or default_root()) / (settings.name or ""))
        resume = trainer_step > 0 and out is not None and _has_artifact(out)
        settings = dataclasses.replace(
            settings,
            output_dir=out,
            root_dir=None if out is not None else settings.root_dir,
            name=None if out is not None else settings.name,
            run_id=None if resume else shared_run_id(settings.run_id),
            resume=resume,
            resume_step=trainer_step if resume else None,
        )
        self.collector = HistoryCollector(
            model, sites=self.sites, streams=self.streams, cadence=self.cadence, settings=settings
        )
        self._model = model
        self.path = self.collector.path
        if rank == 0:
            where = self.path if self.path is not None else "RAM (in_memory=True)"
            (announce or _log.info)(
                f"stepscope: run {self.collector.run.run_id} recording to {where}"
            )
        if self.probe is not None and trainer_step == 0:
            self._measure_probe(0)
        return self.collector

    def own(self, handle: Removable) -> None:
        """Keep a hook ``handle`` the adapter registered: removed when the run closes or aborts."""
        self._handles.append(handle)

    @property
    def hooked(self) -> bool:
        """Whether the adapter's hooks are registered (owned and not yet removed)."""
        return bool(self._handles)

    def close(self) -> None:
        """Remove the owned hooks, end an open step (if any) and close the collector (idempotent)."""
        try:
            self._remove_hooks()
        finally:
            if self.collector is not None:
                self._open = None  # a half-open step is dropped, like the collector's own close
                self.collector.close()

    def abort(self, exc: BaseException) -> None:
        """The trainer raised: remove the owned hooks, exit an open transaction with ``exc``
        (the collector closes)."""
        try:
            self._remove_hooks()
        finally:
            if self._open is not None:
                manager, self._open = self._open.manager, None
                try:
                    manager.__exit__(type(exc), exc, exc.__traceback__)
                except BaseException as err:  # the transaction re-raises what it was given
                    if err is not exc:
                        raise
            self.close()

    def _remove_hooks(self) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    # ------------------------------------------------------------------ steps
    @property
    def in_step(self) -> bool:
        """Whether a step transaction is open."""
        return self._open is not None

    def begin_step(
        self,
        optimizer: Any,
        *,
        trainer_step: int,
        scaler: Any = None,
        epoch: int | None = None,
    ) -> None:
        """Enter ``collector.step(...)`` for the trainer's optimizer step ``trainer_step``.

        When the collector would record another step number (the trainer counted optimizer
        steps the adapter did not see end), recording stops: the open step is dropped, the collector
        closes with everything already committed, and an :class:`IntegrationStoppedWarning`
        (code ``integration_step_mismatch``) says why. Training is never interrupted.
        """
        collector = self.collector
        if collector is None or collector.closed:
            return
        manager = collector.step(optimizer, scaler=scaler, epoch=epoch)
        txn = manager.__enter__()
        if txn.step != trainer_step:
            self._stop(manager, trainer_step, txn.step)
            return
        self._open = _OpenStep(manager, txn, time.perf_counter())

    def micro_batch(self, examples: int | None) -> None:
        """Count one forward/backward of the open step (``examples``: ``None`` if unknown)."""
        if self._open is None:
            return
        self._open.micro_batches += 1
        if examples is None or self._open.examples is None:
            self._open.examples = None
        else:
            self._open.examples += int(examples)

    def end_step(
        self,
        *,
        clipped: bool | None,
        scalars: Mapping[str, Any] | None = None,
        trainer_step: int | None = None,
    ) -> int | None:
        """Declare the step's facts, log ``scalars`` and exit the transaction.

        ``trainer_step`` is the trainer's optimizer-step count after the step: anything but one
        more than at :meth:`begin_step` stops recording like a mismatch there (this step is not
        written). Returns the recorded step, or ``None`` if none was open.
        """
        if self._open is None:
            return None
        opened, self._open = self._open, None
        txn = opened.txn
        if trainer_step is not None and trainer_step != txn.step + 1:
            self._stop(opened.manager, trainer_step - 1, txn.step)
            return None
        txn.declare(
            micro_batches=opened.micro_batches or None,
            clipped=clipped,
            examples=opened.examples,
        )
        for name, value in (scalars or {}).items():
            txn.log(name, value)
        opened.manager.__exit__(None, None, None)
        if len(self._step_seconds) < PROBE_TIMING_STEPS:
            self._step_seconds.append(time.perf_counter() - opened.started)
            if len(self._step_seconds) == PROBE_TIMING_STEPS:
                self._choose_probe_cadence()
        if self.probe is not None and self.probe.due(txn.step + 1):
            self._measure_probe(txn.step + 1)
        return txn.step

    def _stop(self, manager: Any, trainer_step: int, step: int) -> None:
        """Stop recording on a step-count disagreement: drop the open step, warn, keep the rest."""
        err = Refusal(
            "integration_step_mismatch",
            f"the trainer counts optimizer step {trainer_step} where stepscope records step "
            f"{step} (several optimizer steps per batch?); recording stopped, steps before "
            f"{step} are kept",
            [
                "run one optimizer step per step transaction (automatic optimization)",
                "or drive HistoryCollector.step() yourself in a manual loop",
            ],
        )
        manager.__exit__(Refusal, err, None)  # the exception path: no block, collector closed
        warnings.warn(str(err), IntegrationStoppedWarning, stacklevel=3)

    # ------------------------------------------------------------------ run log
    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """A run scalar (``step``: a step already recorded, e.g. a framework's logging step)."""
        if self.collector is not None and not self.collector.closed:
            self.collector.log(name, value, step)

    def log_eval(
        self,
        split: str,
        metrics: Mapping[str, Any],
        *,
        sample_count: int | None = None,
        epoch: int | None = None,
    ) -> None:
        """One evaluation row set (finite real metrics only) at the current training coordinate."""
        if self.collector is None or self.collector.closed:
            return
        clean = {k: v for k, v in metrics.items() if _is_real(v)}
        if clean:
            self.collector.log_eval(split, clean, sample_count=sample_count, epoch=epoch)

    # ------------------------------------------------------------------ probe
    def _measure_probe(self, step: int) -> None:
        plan, collector = self.probe, self.collector
        if plan is None or collector is None or self._model is None:
            return
        last = getattr(collector, "last_block", None)
        seen = 0 if last is None else (last.examples_seen or 0)
        epoch = -1 if last is None or last.epoch is None else last.epoch
        with collector.telemetry():  # charged to telemetry time; its forwards are not the step's
            record = plan.probe.measure(self._model, step=step, examples_seen=seen, epoch=epoch)
        plan.probe_seconds.append(float(record.cost.get("seconds", math.nan)))
        if collector.writer is not None:
            write_probe_record(collector.writer, record)

    def _choose_probe_cadence(self) -> None:
        """The densest probe cadence under the target, from the probe's and the steps' times."""
        plan = self.probe
        if plan is None or plan.every is not None or not plan.probe_seconds or self._model is None:
            return
        dtype = str(next(self._model.parameters()).dtype).replace("torch.", "")
        choice = choose_cadence(
            plan.probe_seconds,
            self._step_seconds,
            plan.target,
            None,
            plan.probe.selection.size,
            dtype,
        )
        plan.decision = choice.to_dict()
        plan.every = choice.cadence_steps
        if plan.every is not None:
            self.log("probe/cadence_steps", float(plan.every))
        if choice.expected_overhead is not None:
            self.log("probe/expected_overhead", float(choice.expected_overhead))


class WatchingCallback:
    """What both trainer callbacks are: a :class:`TrainerWatch` (``watch``) their hooks delegate to.

    A framework's callback derives from this first, then from the framework's callback class
    (``class StepscopeCallback(WatchingCallback, lightning.pytorch.Callback)``), and writes only
    its hooks: each reads the framework's state and makes one call on ``watch``.

    Parameters
    ----------
    sites, streams, cadence, settings
        What to watch, as for :class:`~stepscope.HistoryCollector`.
    probe
        Optional :class:`~stepscope.DenseProbe` (a fixed probe drawn from the training split),
        measured at step 0 and then on the densest cadence whose measured cost stays within 5%
        of training time (or a :class:`ProbePlan`).

    Example
    -------
    >>> from stepscope.integrations.trainer import WatchingCallback
    >>> WatchingCallback(sites="Linear", cadence=5).watch.cadence
    5
    """

    def __init__(
        self,
        sites: Any = None,
        streams: tuple[str, ...] | list[str] = DEFAULT_STREAMS,
        cadence: Any = None,
        settings: WatchSettings | None = None,
        probe: DenseProbe | ProbePlan | None = None,
    ) -> None:
        super().__init__()  # the framework's callback class, next in the MRO
        self.watch = TrainerWatch(sites, streams, cadence, settings, probe)


def _resumable(parent: Path) -> str | None:
    """The run a resumed trainer continues: ``parent`` itself (the exact directory of older
    versions), else its newest ``version_<N>``; ``None`` when there is none."""
    if _has_artifact(parent):
        return str(parent)
    newest = newest_version(parent)
    return None if newest is None else str(newest)


def _has_artifact(path: str | os.PathLike[str]) -> bool:
    p = Path(path)
    return (p / "manifest.json").exists() or any(p.glob("rank*/manifest.json"))


def _is_real(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and not value.is_complex()
    return isinstance(value, (int, float)) and not isinstance(value, bool)
