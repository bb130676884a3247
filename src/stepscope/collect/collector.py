"""``HistoryCollector``: module-tier collection that is cheap, batched and pure.

Forward hooks reduce *detached* module outputs under ``no_grad`` at module return; tensor hooks on
those outputs reduce their gradients (``activation_grad``); optimizer pre/post-step hooks reduce
parameter gradients, parameter values and the actual update of a seeded parameter subvector.
Every reduction writes a fixed-width row into a preallocated staging buffer on the tensor's
device; rows reach the host in one copy per buffer at the step boundary, and the step is written
to the history (disk-first artifact or RAM ring) and published on the event bus.

The class orchestrates; each concept lives in its own module, and only this class begins and
ends a step: the open step the hooks record into (:mod:`.step`), which streams are due
(:mod:`.cadence`), forward hooks and which tensor is an activation (:mod:`.activations`), what
may be reduced and the reduction into staged rows (:mod:`.staging`), optimizer step hooks,
closures and ownership (:mod:`.optimizer`), update sampling (:mod:`.updates`), model surgery
(:mod:`.surgery`), the step boundary, batch assembly and the destination (:mod:`.write`), sharded
parameters and the live rank merge (:mod:`.distributed`), and the user log
(:class:`stepscope.runlog.userlog.UserLog`, shared with ``RunLog``). What every row means:
``docs/sites.md``; the walk of one gradient from its hook to disk: ``docs/architecture.md``.

Example
-------
Record to disk (crash-safe, readable while training runs, no step limit): without
``output_dir`` each collector writes a new ``runs/<name>/version_<N>`` (``collector.run_dir``;
``docs/collect.md``), with ``output_dir`` exactly that directory; ``in_memory=True`` keeps a
RAM ring of 256 steps instead:

>>> import tempfile, torch, stepscope as ss
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> run_dir = tempfile.mkdtemp()  # e.g. "runs/exp1"
>>> settings = ss.WatchSettings(output_dir=run_dir)
>>> with ss.HistoryCollector(model, sites="Linear", settings=settings) as c:
...     for _ in range(3):
...         with c.step(opt, examples=16):
...             loss = model(torch.randn(16, 4)).pow(2).mean()
...             opt.zero_grad(); loss.backward(); opt.step()
>>> ss.open_run(run_dir).steps.tolist()
[0, 1, 2]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from stepscope.collect.activations import ActivationSites
from stepscope.collect.cadence import AutoCadence, Cadence, DueTable, WarmupMeter, resolve_cadence
from stepscope.collect.distributed import LiveMerge, safe_merge
from stepscope.collect.flight import open_flight
from stepscope.collect.misuse import MisuseGuard
from stepscope.collect.optimizer import OptimizerSteps, OptimizerWatch
from stepscope.collect.plan import Plan, build_plan
from stepscope.collect.settings import WatchSettings, check_streams
from stepscope.collect.sites import (
    SiteRow,
    build_rows,
    leaf_modules,
    parameter_holders,
    register_param_sites,
    unwrap_compiled,
)
from stepscope.collect.staging import Reducer
from stepscope.collect.step import OpenStep, StepScope, StepState
from stepscope.collect.surgery import StructureWatch
from stepscope.collect.updates import assign_update_indices
from stepscope.collect.write import StepBoundary, open_store
from stepscope.errors import Refusal
from stepscope.history import CloseReport, StepBlockRecord, StepProvenance
from stepscope.history.inputs import MAX_STEP
from stepscope.runlog import (
    PendingStep,
    StepClock,
    check_count,
    write_summary,
)
from stepscope.runlog.runlog import view_of
from stepscope.runlog.userlog import UserLog
from stepscope.selection import Selector, select_modules

DEFAULT_STREAMS: tuple[str, ...] = ("activation", "gradient", "parameter", "update")

__all__ = ["DEFAULT_STREAMS", "HistoryCollector"]

log = logging.getLogger("stepscope")


class HistoryCollector(UserLog):
    """Watch a model's training, step by step.

    Parameters
    ----------
    model
        The module to watch. It is never modified; hooks are removed by :meth:`close`.
    sites
        Selector of modules (type name, full-name glob, predicate or list; see
        :mod:`stepscope.selection`). Default: every leaf module, and for the parameter-sized
        streams every parameter wherever it is held (a module with children may hold one).
    streams
        Any of ``activation, gradient, parameter, update, activation_grad``.
    cadence
        Per-stream :class:`Cadence` (or int, or a ``{stream: ...}`` mapping); default
        :data:`~stepscope.collect.settings.DEFAULT_CADENCE`. ``"auto"`` (or an
        :class:`~stepscope.collect.AutoCadence`) measures every stream's cost for a warm-up and
        then chooses cadences that keep telemetry within a target fraction of training time
        (decision in :attr:`cadence_decision` and in ``cadence/...`` scalar rows).
    settings
        :class:`WatchSettings` (output directory, ring, descriptor, update sample, ...).
    optimizer
        Implicit spelling: the optimizer's step hooks end each step (unscale/clip status is then
        ``unknown``). The explicit ``with collector.step(optimizer)`` transaction is authoritative.
        Wrappers exposing ``.optimizer`` (accelerate, the HF ``Trainer``) are unwrapped.
    scaler
        Implicit spelling with a ``torch.amp.GradScaler``: pass it so that an iteration whose
        step the scaler skipped (inf/NaN gradients) ends at its ``scaler.update()`` as its own
        step with ``applied=no``, and so that the recorded scale is the one in force.

    Raises
    ------
    Refusal
        ``selection_empty`` at construction when ``sites`` matches nothing (before any forward),
        ``stream_unknown``, ``cadence_invalid``, ``settings_invalid``, ``optimizer_unsupported``,
        ``step_transaction_required`` (``resume`` with the implicit ``optimizer=`` spelling),
        ``resume_fingerprint_mismatch`` / ``resume_descriptor_mismatch`` (see
        :class:`WatchSettings` ``resume``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        sites: Selector | None = None,
        streams: tuple[str, ...] | list[str] = DEFAULT_STREAMS,
        cadence: Any = None,
        settings: WatchSettings | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):  # never a raw AttributeError later
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
        streams = check_streams(streams)
        self.model = model
        if settings is not None and not isinstance(settings, WatchSettings):
            raise Refusal(
                "settings_invalid",
                f"settings must be a stepscope.WatchSettings, not {type(settings).__name__}",
                [f"pass settings=ss.WatchSettings(...), e.g. ss.WatchSettings(name={'run'!r})"],
            )
        self.settings = settings or WatchSettings()
        self.settings.check_spelling(implicit=optimizer is not None)
        self.streams = streams
        self.auto: AutoCadence | None = None
        if cadence == "auto" or isinstance(cadence, AutoCadence):
            self.auto = cadence if isinstance(cadence, AutoCadence) else AutoCadence()
            cadence = dict.fromkeys(streams, self.auto.warmup_cadence())
        self.cadences: dict[str, Cadence] = resolve_cadence(cadence, streams)
        self._due = DueTable(self.cadences, self.streams)  # which streams are due at a step
        s = self.settings
        policy = None if s.in_memory else (s.commit_steps, s.commit_seconds)
        self._meter = None if self.auto is None else WarmupMeter(self.auto, streams, policy)
        watched = unwrap_compiled(model)  # torch.compile(model): sites keep their own names
        self.modules = select_modules(watched, sites if sites is not None else leaf_modules)
        owners = parameter_holders(watched) if sites is None else None
        self.rows: list[SiteRow] = build_rows(self.modules, streams, owners)
        if not self.rows:
            raise Refusal(
                "selection_empty",
                f"the selected modules own no parameters for streams {streams}",
                ["add 'activation' to streams", "select modules that own parameters"],
            )
        self.descriptor = self.settings.descriptor
        self._by_stream: dict[str, list[SiteRow]] = {
            s: [r for r in self.rows if r.stream == s] for s in streams
        }
        self._open = OpenStep()  # the step the hooks record into; only this class ends one
        store = open_store(watched, self.settings, streams, self.cadences, self.auto)
        self._store = store
        self.run, self.ring, self.catalog = store.run, store.ring, store.catalog
        self.writer, self.path, self._next_step = store.writer, store.path, store.next_step
        self._reducer = Reducer(
            len(self.rows), self.descriptor, self.settings.kernel_backend, self._open.recording
        )
        self._sites = ActivationSites(
            self._open,
            self._reducer,
            self.catalog,
            self._check_structure,
            model,
            self.modules,
            self.rows,
            self.settings.output_keys,
        )
        self._steps = OptimizerSteps(
            self._open,
            self._finish_step,
            self._restart_step,
            self.rows,
            self._by_stream,
            streams,
            self._reducer,
            self.settings.resume,
        )
        self._pending = PendingStep()  # user scalars and branch masks of the current step
        self._timer = time.perf_counter
        self._closed = False
        self.close_report: CloseReport | None = None  # set by close(): what was not committed
        self._staged = True  # rows may be staged since the buffers' last reset
        self.last_block: StepBlockRecord | None = None
        self.telemetry_seconds = 0.0
        self._misuse = MisuseGuard(model)
        self._examples_seen: int | None = store.examples_seen
        if self.path is not None:
            log.info("recording run %s to %s", self.run.run_id, self.path)
        self.clock = StepClock(self.run.device)
        self._boundary = StepBoundary(
            streams,
            self._by_stream,
            self._sites,
            self._reducer,
            self._pending,
            self.clock,
            store,
            self._meter,
            self.settings,
        )
        write_summary(self.path, self.clock.summary(closed=False))
        register_param_sites(self.rows, self.catalog, self._next_step)
        assign_update_indices(
            self.rows, self.settings.update_sample_size, self.settings.update_seed
        )
        # one gather per logged step to rank 0 (fixed cadences only: ranks must agree on steps)
        self._live = LiveMerge.create(
            self.rows,
            self.descriptor.width,
            self.settings.live_merge and self.auto is None,
            self.run.run_id,
        )
        self.last_merged: tuple[StepBlockRecord, list] | None = None
        self._structure = StructureWatch(
            watched,
            self.rows,
            self._sites,
            self.catalog,
            self._by_stream,
            self.settings.update_sample_size,
            self.settings.update_seed,
        )
        # spike forensics (WatchSettings(flight_recorder=...)); None: off
        self.forensics = open_flight(
            self.settings, self.modules, owners, self._sites, self.path, self.run.rank,
            self.run.world_size, self._charge,
        )  # fmt: skip
        self._sites.rest_root = self.forensics is None  # the recorder reads every step's calls
        if self.forensics is not None and self.writer is not None:
            self.forensics.write_beside(self.writer)  # its files on the writer thread
        try:
            self._sites.attach()
            if optimizer is not None:  # implicit: iterations end at update() with a scaler
                self._steps.attach_implicit(model, optimizer, scaler, self._sites)
                self._flight_optimizers()
        except BaseException:
            self.close()
            raise
        self._begin_step()

    @property
    def cadence_decision(self) -> dict[str, Any] | None:
        """The ``cadence="auto"`` decision (``None`` before it, or without auto cadence)."""
        return None if self._meter is None else self._meter.decision

    @property
    def live(self) -> Any:
        """The live stream to TensorBoard/W&B (``WatchSettings(tensorboard=..., wandb=...)``), or
        ``None``: a :class:`~stepscope.events.LiveStream` (``.counts``, ``.destinations``)."""
        return self._boundary.live

    @property
    def run_dir(self) -> Path:
        """The directory this collector writes to (``collector.path``, never ``None``).

        Without ``output_dir`` it is a new ``<root_dir>/<name>/version_<N>`` per collector;
        read it back with ``ss.open_run(collector.run_dir)``. An ``in_memory=True`` collector
        has none: refuses ``collector_in_memory``.
        """
        if self.path is None:
            raise Refusal(
                "collector_in_memory",
                "this collector keeps its steps in RAM (in_memory=True): it has no run directory",
                [
                    "read its steps from collector.ring",
                    'or record to disk: ss.WatchSettings(name="<name>") (runs/<name>/version_<N>)',
                ],
            )
        return self.path

    @property
    def sites(self) -> list:
        """The site catalog (:class:`~stepscope.history.SiteRecord` list)."""
        return self.catalog.sites

    def plan(self) -> Plan:
        """The plan table: rows (site, stream, cadence, elements and bytes per logged step)."""
        live = self._live
        return build_plan(
            self.rows,
            self.cadences,
            self.descriptor.width,
            self.settings.update_sample_size,
            live_merge=None if live is None else (live.bytes_per_step(), live.world_size),
        )

    # ------------------------------------------------------------------ hooks
    def _attach_optimizer(self, optimizer: Any) -> OptimizerWatch:
        return self._steps.attach(optimizer)

    def _flight_optimizers(self) -> None:
        """The flight recorder reads every watched optimizer's steps (idempotent)."""
        if self.forensics is not None:
            for watch in self._steps.watches.values():
                self.forensics.attach_optimizer(watch.optimizer)

    def _check_structure(self) -> None:
        """Model surgery: end the sites of replaced or removed modules and parameters."""
        state = self._open.state
        if state is None:
            return
        state.structure_checked = True
        if self._structure.check(state.step):
            self._steps.invalidate()

    def telemetry(self) -> Any:
        """A context manager for work done *for* telemetry outside the hooks (a dense probe).

        Its seconds count in the step's ``clock/telemetry_seconds``, never in its training
        seconds, and the forwards, backwards and optimizer steps run inside it never reach the
        step's rows. See :mod:`stepscope.collect.step`.
        """
        return self._open.window()

    # ------------------------------------------------------------------ step lifecycle
    def _begin_step(self) -> StepState:
        step = self._next_step
        if not self.ring.disk_backed:
            self.ring.check_room()  # refuse *before* the step that would not fit
        if not self._due.matches(self.cadences):  # "auto" decided, or cadences were replaced
            self._due = DueTable(self.cadences, self.streams)
        spine_due, hist_due = self._due.at(step)
        if self.forensics is not None and self.forensics.dense_at(step):  # after a trigger
            spine_due = dict.fromkeys(spine_due, True)
        state = StepState(
            step=step, spine_due=spine_due, hist_due=hist_due, started=time.perf_counter()
        )
        due = state.spine_due
        state.activations_quiet = not (due.get("activation") or due.get("activation_grad"))
        state.optimizer_quiet = not (
            due.get("gradient") or due.get("parameter") or due.get("update")
        )
        # model surgery is looked for before steps that record rows: a step with nothing due
        # records none, so a change is found (and its site ended) at the next step with some
        any_due = any(due.values())  # histogram steps are spine steps
        state.structure_checked = not any_due
        self._sites.rest(state.activations_quiet)  # quiet: module hooks off (torch's fast path)
        self._open.state = state
        self.clock.begin(step)
        # rows are staged only while a step with something due is open: after a quiet step the
        # buffers' flags are still clear (no numpy call on nine steps in ten by default)
        if self._staged:
            self._reducer.reset()
        self._staged = any_due
        return state

    def _restart_step(self) -> None:
        """Drop the open step's observations and begin it afresh (a bare optimizer step outside
        a transaction, where only transactions are steps: nothing of it is recorded)."""
        self._open.state = None
        self._begin_step()

    def step(
        self,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        scaler: Any = None,
        examples: int | None = None,
        epoch: int | None = None,
    ) -> StepScope:
        """The explicit, authoritative step transaction (a context manager).

        Put one optimizer step (forward, backward, ``optimizer.step()`` or
        ``optimizer.step(closure)``, or ``scaler.step(optimizer); scaler.update()``) inside.
        ``optimizer`` may be a sequence (several optimizers: each owns the rows of its own
        parameters) or a wrapper exposing ``.optimizer``. ``examples`` is the number of examples
        this step consumed (accumulated into ``examples_seen``); ``epoch`` is your own epoch
        count (never derived). ``with`` yields the step's
        :class:`~stepscope.collect.step.StepTransaction`. An exception escaping the block
        closes the collector (hooks removed, committed data kept) and propagates.

        Once a transaction was used (or the collector resumes), only transactions are steps: a
        bare ``optimizer.step()`` outside one is not recorded, is warned about, and the next
        ``step()`` refuses ``step_transaction_required``.
        """
        return StepScope(self, optimizer, scaler, examples, epoch)

    def _open_transaction(
        self, optimizer: Any, scaler: Any, examples: int | None, epoch: int | None
    ) -> StepState:
        """``with collector.step(...)`` is entered: check, watch, open the step's window."""
        t_enter = time.perf_counter()
        if self._closed:
            self._check_open()
        if examples.__class__ is not int or not 0 <= examples <= MAX_STEP + 1:  # (checked at once)
            examples = check_count(examples, "examples")
        if epoch is not None:
            epoch = check_count(epoch, "epoch")
        if self._open.in_transaction:
            raise Refusal(
                "step_transaction_nested", "a step transaction is already open", ["close it first"]
            )
        given: Any = [] if optimizer is None else optimizer
        opts = list(given) if isinstance(given, (list, tuple)) else [given]
        if not self._steps.same_transaction(opts):  # new optimizers: checked and watched once
            self._misuse.check_optimizers(opts, self.streams)
            self._steps.open_transaction(opts)
            self._flight_optimizers()
        state = self._open.state or self._begin_step()  # the open step (one always is)
        if not state.structure_checked:
            self._check_structure()
        state.open_transaction(examples, epoch, scaler)
        self._open.in_transaction, self._open.scaler = True, scaler
        self.clock.begin(state.step)  # the training clock times the transaction body
        # the transaction's own bookkeeping (checks, optimizer watches, model surgery) is telemetry
        state.charge(None, time.perf_counter() - t_enter)
        state.window_from, state.started = state.telemetry_s, time.perf_counter()
        return state

    def _close_transaction(self, state: StepState, scaler: Any, failed: bool) -> None:
        """The ``with`` block ended: write the step, or (``failed``: an exception escapes it)
        close the collector."""
        self._open.in_transaction = False
        if failed:
            self.close()
            return
        t_close, charged = time.perf_counter(), state.telemetry_s
        self._steps.close_transaction(scaler, state)
        # its bookkeeping beyond the reductions it charged is telemetry, not training
        state.charge(None, time.perf_counter() - t_close - (state.telemetry_s - charged))
        try:
            self._finish_step(StepProvenance.EXPLICIT, optimizer_known=bool(self._steps.watches))
        finally:
            self._open.scaler = None

    def _finish_step(self, provenance: StepProvenance, optimizer_known: bool = True) -> None:
        state = self._open.state or self._begin_step()  # the open step (one always is)
        self.clock.end(state.step)
        started = time.perf_counter()
        if not state.structure_checked:
            self._check_structure()
        written = self._boundary.write(
            state, started, provenance, optimizer_known, self._open.scaler, self._examples_seen
        )
        if written.cadences is not None:
            self.cadences = written.cadences
        self._examples_seen = written.examples_seen
        self.telemetry_seconds += written.telemetry_s
        self.last_block, self.last_batches = written.block, written.batches
        if self.forensics is not None:  # the step's every-step readings, triggers
            self.forensics.end_step(
                state.step,
                written.scalars,
                (written.block.examples_seen, written.block.epoch),
                None if self.writer is None else self.writer.commits,
            )
        self.last_merged = None
        if written.any_due:  # a collective: every rank logs the same steps (fixed cadences)
            self._live, self.last_merged = safe_merge(
                self._live, written.block, written.batches, written.histogram_step
            )
        self._next_step = state.step + 1
        self._open.state = None
        nxt = self._begin_step()
        # publish last, once the step is written and the next one begun: a check that raises
        # (action="raise") leaves the collector ready for the next step
        try:
            self._boundary.publish(written, self.last_merged)
        finally:
            # write, publish, begin: charged to the next step (the auto-cadence meter reads it)
            nxt.carried_s = time.perf_counter() - written.written_from
            nxt.telemetry_s += nxt.carried_s

    # ------------------------------------------------------------------ run log (UserLog)
    def _log_in(
        self, state: StepState, name: str, value: float | torch.Tensor, step: int | None
    ) -> None:
        """``StepTransaction.log``: after the step's ``with`` block ended it warns once and
        records the value at that step (:mod:`stepscope.collect.misuse`)."""
        if step is None and self._next_step > state.step:  # that step is written already
            self._misuse.log_after_close(name, state.step)
            step = state.step
        self.log(name, value, step)

    def _charge(self, seconds: float) -> None:
        self._open.charge(seconds)

    def _eval_coordinate(self) -> tuple[int, int | None]:
        step = self._open.state.step if self._open.state is not None else self._next_step
        last = self.last_block
        if last is None and self._next_step == 0:  # nothing consumed yet: a true zero
            return step, 0
        if last is None:  # resumed, no step yet: what the artifact had consumed (None: unknown)
            return step, self._examples_seen
        return step, last.examples_seen

    @property
    def _log_sink(self) -> Any:
        return self._store.sink

    def run_view(self) -> Any:
        """Run-log rows written so far (:class:`~stepscope.runlog.view.RunView`; commits first)."""
        return view_of(self._store.sink, self.clock, self._closed)

    # ------------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed:
            raise Refusal(
                "collector_closed", "this collector is closed", ["create a new HistoryCollector"]
            )

    def close(self) -> None:
        """Remove every hook and close the history (idempotent). Pending partial steps are dropped."""
        if self._closed:
            return
        self._misuse.at_close(self._next_step - self._store.next_step)
        try:  # implicit + scaler: the last iteration's skipped step is still a step
            self._steps.finish_skipped()
        except Exception:  # closing must not fail for telemetry reasons; hooks still go
            pass
        self._closed = True
        try:
            self._sites.remove()
        finally:
            self._steps.remove()  # optimizer hooks; pending update samples are dropped
            if self._open.state is not None:  # telemetry after the last step is still telemetry
                self.clock.trailing(self._open.state.telemetry_s)
            self._open.state = None
            # disk faults are reported (close_report), not raised
            self.close_report = self._boundary.close(self._next_step)
            if self.forensics is not None:  # hooks off, the window written a last time
                self.forensics.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> HistoryCollector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter shutdown
        try:
            if not self._closed:
                self._sites.remove()
                self._steps.remove()
                if self.forensics is not None:
                    self.forensics.reader.remove()
        except Exception:
            pass
