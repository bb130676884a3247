"""``HistoryCollector``: module-tier collection that is cheap, batched and pure.

Forward hooks reduce *detached* module outputs under ``no_grad`` at module return; tensor hooks on
those outputs reduce their gradients (``activation_grad``); optimizer pre/post-step hooks reduce
parameter gradients, parameter values and the actual update of a seeded parameter subvector.
Every reduction writes a fixed-width row into a preallocated staging buffer on the tensor's
device; rows reach the host in one copy per buffer at the step boundary, and the step is written
to the history (disk-first artifact or RAM ring) and published on the event stream.

The class orchestrates; each job lives in its own module: which forwards count and which tensor
(:mod:`.activations`, :mod:`.capture`), model surgery (:mod:`.surgery`), optimizer hooks and
ownership (:mod:`.optimizers`), update sampling (:mod:`.updates`), loss-scaler facts
(:mod:`.scaler`), step assembly (:mod:`.stepstate`), the destination (:mod:`.store`), auto
cadence measurement (:mod:`.warmup`), the telemetry window (:mod:`.telemetry`) and the user
log (:class:`stepscope.runlog.userlog.UserLog`, shared with ``RunLog``). What every row means:
``docs/sites.md``.

Example
-------
Record to disk (crash-safe, readable while training runs, no step limit); without
``output_dir`` a RAM ring holds 256 steps and then refuses ``ring_capacity_exhausted``:

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
>>> ss.open_history(run_dir).steps.tolist()
[0, 1, 2]
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from stepscope.collect.activations import ActivationSites
from stepscope.collect.autocadence import AutoCadence
from stepscope.collect.capture import reducible
from stepscope.collect.livemerge import LiveMerge, safe_merge
from stepscope.collect.optimizers import OptimizerWatch, unwrap_optimizer
from stepscope.collect.plan import Plan, build_plan
from stepscope.collect.scaler import grad_scale_status, scale_in_force, update_marker
from stepscope.collect.settings import ALL_STREAMS, Cadence, WatchSettings, resolve_cadence
from stepscope.collect.sites import Row, build_rows, param_signature
from stepscope.collect.staging import Staging, to_host  # noqa: F401  (tests patch it here)
from stepscope.collect.stepstate import StepState, StepTransaction, assemble_batches, step_truth
from stepscope.collect.store import open_store
from stepscope.collect.surgery import StructureWatch
from stepscope.collect.telemetry import TelemetryWindow
from stepscope.collect.updates import UpdateSampler, assign_update_indices
from stepscope.collect.warmup import WarmupMeter
from stepscope.errors import Refusal
from stepscope.events.convert import events_from_step
from stepscope.history import StepBlockRecord, StepProvenance
from stepscope.runlog import (
    ArtifactRows,
    MemoryRows,
    PendingStep,
    StepClock,
    clock_scalars,
    withhold_inactive,
    write_clock_rows,
    write_summary,
)
from stepscope.runlog.runlog import view_of
from stepscope.runlog.userlog import UserLog
from stepscope.selection import Selector, select_modules

DEFAULT_STREAMS: tuple[str, ...] = ("activation", "gradient", "parameter", "update")

__all__ = ["DEFAULT_STREAMS", "HistoryCollector", "StepState", "StepTransaction"]


def unwrap_compiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside ``torch.compile(model)`` (the model itself when not compiled)."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def _leaf_modules(name: str, module: torch.nn.Module) -> bool:
    return next(module.children(), None) is None  # a bare module is its own (root) leaf


class HistoryCollector(UserLog):
    """Watch a model's training, step by step.

    Parameters
    ----------
    model
        The module to watch. It is never modified; hooks are removed by :meth:`close`.
    sites
        Selector of modules (type name, full-name glob, predicate or list; see
        :mod:`stepscope.selection`). Default: every leaf module.
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
        streams = list(dict.fromkeys(streams))
        unknown = [s for s in streams if s not in ALL_STREAMS]
        if unknown or not streams:
            raise Refusal(
                "stream_unknown",
                f"unknown streams {unknown or streams}",
                [f"choose from {ALL_STREAMS}"],
            )
        self.model = model
        self.settings = settings or WatchSettings()
        if self.settings.resume and optimizer is not None:
            raise Refusal(
                "step_transaction_required",
                "a resumed run records only explicit steps (its step and examples_seen "
                "continue from the artifact); the implicit optimizer= spelling cannot resume.",
                ["drop optimizer= and wrap each step in `with collector.step(optimizer, "
                 "examples=n):`"],
            )
        self.streams = streams
        self.auto: AutoCadence | None = None
        if cadence == "auto" or isinstance(cadence, AutoCadence):
            self.auto = cadence if isinstance(cadence, AutoCadence) else AutoCadence()
            cadence = dict.fromkeys(streams, self.auto.warmup_cadence())
        self.cadences: dict[str, Cadence] = resolve_cadence(cadence, streams)
        self._meter = None if self.auto is None else WarmupMeter(self.auto, streams)
        watched = unwrap_compiled(model)  # torch.compile(model): sites keep their own names
        self.modules = select_modules(watched, sites if sites is not None else _leaf_modules)
        self.rows: list[Row] = build_rows(self.modules, streams)
        if not self.rows:
            raise Refusal(
                "selection_empty",
                f"the selected modules own no parameters for streams {streams}",
                ["add 'activation' to streams", "select modules that own parameters"],
            )
        self.descriptor = self.settings.descriptor
        self._by_stream: dict[str, list[Row]] = {
            s: [r for r in self.rows if r.stream == s] for s in streams
        }
        self._sites = ActivationSites(
            self, model, self.modules, self.rows, self.settings.output_keys
        )
        self._stagings: dict[torch.device, Staging] = {}
        self._handles: list[Any] = []
        self._watches: dict[int, OptimizerWatch] = {}
        self._explicit_only = self.settings.resume  # bare optimizer steps are not steps
        self._stray_step: int | None = None  # a bare optimizer step after explicit ones
        self._implicit_scaler = scaler
        self._telemetry = TelemetryWindow(self._charge)
        self._pending = PendingStep()  # user scalars and branch masks of the current step
        self._timer = time.perf_counter
        self._updates = UpdateSampler()
        self._closed = False
        self._state: StepState | None = None
        self._txn_open = False
        self._scaler: Any = None
        self._examples_seen: int | None = 0
        self.last_block: StepBlockRecord | None = None
        self.telemetry_seconds = 0.0
        store = open_store(watched, self.settings, streams, self.cadences, self.auto)
        self._store = store
        self.run, self.ring, self.catalog = store.run, store.ring, store.catalog
        self.writer, self.path, self._next_step = store.writer, store.path, store.next_step
        self._examples_seen = store.examples_seen
        self.clock = StepClock(self.run.device)
        self._rows: Any = ArtifactRows(self.writer) if self.writer is not None else MemoryRows()
        write_summary(self.path, self.clock.summary(closed=False))
        self._register_param_sites()
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
        try:
            self._sites.attach()
            if optimizer is not None:
                self._attach_optimizer(optimizer)
                if scaler is not None:  # implicit + GradScaler: iterations end at update()
                    self._handles.append(model.register_forward_pre_hook(self._iteration_hook))
        except BaseException:
            self.close()
            raise
        self._begin_step()

    @property
    def cadence_decision(self) -> dict[str, Any] | None:
        """The ``cadence="auto"`` decision (``None`` before it, or without auto cadence)."""
        return None if self._meter is None else self._meter.decision

    def _register_param_sites(self) -> None:
        for r in self.rows:
            if r.param is not None:
                r.signature = param_signature(r.param)
                r.site_id = self.catalog.register_site(
                    r.site, r.module_type, r.signature, step=self._next_step
                )
        assign_update_indices(
            self.rows, self.settings.update_sample_size, self.settings.update_seed
        )

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

    # ------------------------------------------------------------------ reductions
    def _staging(self, device: torch.device) -> Staging:
        st = self._stagings.get(device)
        if st is None:
            st = Staging(len(self.rows), device, self.descriptor, self.settings.kernel_backend)
            self._stagings[device] = st
        return st

    def _reduce(self, row: Row, tensor: torch.Tensor) -> None:
        state = self._state
        if state is None or not state.spine_due[row.stream] or self._telemetry.open:
            return
        t0 = time.perf_counter()
        try:
            x, note = reducible(tensor)  # detached: no graph is built
            if x is None:
                state.unsupported[row.index] = note
            else:
                self._staging(x.device).write(row.index, x, state.hist_due[row.stream])
                if note is not None:
                    state.row_notes[row.index] = note
        except Exception as e:  # telemetry never raises into the training step
            if isinstance(e, Refusal) and e.code == "stat_dtype_unsupported":  # no ordered stats
                state.unsupported[row.index] = f"dtype:{str(tensor.dtype).replace('torch.', '')}"
            else:
                state.failed[row.index] = type(e).__name__
        state.charge(row.stream, time.perf_counter() - t0)

    def _forward_may_count(self) -> bool:
        """The collector's half of the training-forward rule (see :mod:`.activations`)."""
        return (
            self._state is not None
            and not self._telemetry.open
            and (self.model.training or self._txn_open)
        )

    def _check_structure(self) -> None:
        """Model surgery: end the series of replaced or removed modules and parameters."""
        self._state.structure_checked = True
        if self._structure.check(self._state.step):
            for watch in self._watches.values():
                watch.invalidate()

    def _attach_optimizer(self, optimizer: Any) -> OptimizerWatch:
        opt = unwrap_optimizer(optimizer)
        watch = self._watches.get(id(opt))
        if watch is None:
            watch = OptimizerWatch(opt, self.rows, self._pre_step, self._post_step)
            self._watches[id(opt)] = watch
        return watch

    def _take_gradients(self, rows: Sequence[Row], phase_scale: str) -> None:
        state = self._state
        if state is None or "gradient" not in self.streams:
            return
        for row in rows:
            if row.index not in state.grad_rows and row.param.grad is not None:
                if not state.grads_taken:  # the first read of the step states the scaling
                    state.grads_taken, state.scale_grad = True, phase_scale
                state.grad_rows.add(row.index)
                self._reduce(row, row.param.grad)

    def _closure_gradient(self, row: Row, grad: torch.Tensor) -> None:
        """A closure's backward accumulated ``grad``: it replaces what the row held."""
        state = self._state
        if state is None or not state.spine_due["gradient"] or self._telemetry.open:
            return
        self._staging(grad.device).reset_row(row.index)
        state.grad_rows.add(row.index)
        state.row_notes[row.index] = "gradient_after_closure_backward"
        self._reduce(row, grad)

    def _outside_transaction(self) -> bool:
        """A bare ``optimizer.step()`` where only explicit steps count (never silently implicit)."""
        return self._explicit_only and not self._txn_open

    def _pre_step(self, watch: OptimizerWatch, closure: Callable[[], Any] | None) -> None:
        state = self._state
        if state is None or self._telemetry.open or self._outside_transaction():
            return
        # implicit spelling: known only when the scaler was given to the collector
        scaler = self._scaler if self._txn_open else self._implicit_scaler
        status = grad_scale_status(scaler, self._txn_open or scaler is not None)
        if closure is not None and "gradient" in self.streams and state.spine_due["gradient"]:
            if not state.grads_taken:
                state.grads_taken, state.scale_grad = True, status
            # the backward runs inside step(): rows not reached by it stay absent, never stale
            state.grad_rows.update(r.index for r in watch.owned("gradient"))
            watch.arm_gradient_hooks(self._closure_gradient)
        else:
            self._take_gradients(watch.owned("gradient"), status)
        if "update" in self.streams and state.spine_due["update"]:
            t0 = time.perf_counter()
            self._updates.snapshot(watch.owned("update"))
            state.charge("update", time.perf_counter() - t0)

    def _post_step(self, watch: OptimizerWatch) -> None:
        watch.disarm_gradient_hooks()
        state = self._state
        if state is None or self._telemetry.open:
            return
        if self._outside_transaction():
            self._discard_stray_step(watch)
            return
        state.stepped = True
        for row, delta in self._updates.deltas(watch.owned("update")):
            self._reduce(row, delta)
        self._take_parameters(watch.owned("parameter"))
        if not self._txn_open:  # implicit spelling: the optimizer step ends the step
            self._take_parameters(self._by_stream.get("parameter", []))  # frozen ones too
            self._finish_step(StepProvenance.IMPLICIT)

    def _take_parameters(self, rows: Sequence[Row]) -> None:
        state = self._state
        with torch.no_grad():
            for row in rows:
                if row.index not in state.param_rows:
                    state.param_rows.add(row.index)
                    self._reduce(row, row.param)

    def _discard_stray_step(self, watch: OptimizerWatch) -> None:
        """Drop what a bare optimizer step's iteration staged; the next step() refuses."""
        step = self._state.step
        self._stray_step = step
        warnings.warn(
            f"stepscope: {type(watch.optimizer).__name__}.step() ran outside `with "
            f"collector.step(...)` at step {step}; it is not recorded, and the next "
            "collector.step() refuses step_transaction_required.",
            RuntimeWarning,
            stacklevel=3,
        )
        self._updates.clear()
        self._state = None
        self._begin_step()

    def _iteration_hook(self, _module: torch.nn.Module, _inputs: Any) -> None:
        """Implicit spelling with a scaler: a training forward after ``scaler.update()``.

        An iteration whose optimizer step the scaler skipped never fires the step hooks; its
        ``update()`` is seen here, at the next iteration's first forward, and ends it as its
        own step with ``applied=no``.
        """
        state = self._state
        if state is None or self._txn_open or not self._sites.training_forward():
            return
        scaler = self._implicit_scaler
        marker = update_marker(scaler)
        if state.scaler_marker is not None and marker is not state.scaler_marker:
            state.skipped = True
            self._finish_step(StepProvenance.IMPLICIT)
            state = self._state
        if state.scaler_marker is None:
            state.scaler_marker = marker
            state.scale_in_force = scale_in_force(scaler)

    def telemetry(self) -> Any:
        """A context manager for work done *for* telemetry outside the hooks (a dense probe).

        Its seconds count in the step's ``clock/telemetry_seconds``, never in its training
        seconds, and the forwards, backwards and optimizer steps run inside it never reach the
        step's rows. See :mod:`stepscope.collect.telemetry`.
        """
        return self._telemetry()

    # ------------------------------------------------------------------ step lifecycle
    def _begin_step(self) -> None:
        step = self._next_step
        if not self.ring.disk_backed:
            self.ring.check_room()  # refuse *before* the step that would not fit
        self._state = StepState(
            step=step,
            spine_due={s: self.cadences[s].spine_due(step) for s in self.streams},
            hist_due={s: self.cadences[s].histogram_due(step) for s in self.streams},
            started=time.perf_counter(),
        )
        self.clock.begin(step)
        for st in self._stagings.values():
            st.reset()

    @contextmanager
    def step(
        self,
        optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None = None,
        scaler: Any = None,
        examples: int | None = None,
        epoch: int | None = None,
    ) -> Iterator[StepTransaction]:
        """The explicit, authoritative step transaction.

        Put one optimizer step (forward, backward, ``optimizer.step()`` or
        ``optimizer.step(closure)``, or ``scaler.step(optimizer); scaler.update()``) inside.
        ``optimizer`` may be a sequence (several optimizers: each owns the rows of its own
        parameters) or a wrapper exposing ``.optimizer``. ``examples`` is the number of examples
        this step consumed (accumulated into ``examples_seen``); ``epoch`` is your own epoch
        count (never derived). An exception escaping the block closes the collector (hooks
        removed, committed data kept) and propagates.

        Once a transaction was used (or the collector resumes), only transactions are steps: a
        bare ``optimizer.step()`` outside one is not recorded, is warned about, and the next
        ``step()`` refuses ``step_transaction_required``.
        """
        self._check_open()
        if self._txn_open:
            raise Refusal(
                "step_transaction_nested", "a step transaction is already open", ["close it first"]
            )
        if self._stray_step is not None:
            stray, self._stray_step = self._stray_step, None
            raise Refusal(
                "step_transaction_required",
                f"an optimizer step ran outside `with collector.step(...)` at step {stray}; it "
                "was not recorded (this collector records explicit steps only).",
                ["run every optimizer step inside `with collector.step(optimizer):`"],
            )
        self._explicit_only = True
        if optimizer is not None:
            opts = optimizer if isinstance(optimizer, (list, tuple)) else [optimizer]
            for opt in opts:
                self._attach_optimizer(opt)
        if self._state is None:
            self._begin_step()
        state = self._state
        if not state.structure_checked:
            self._check_structure()
        state.explicit, state.examples, state.epoch = True, examples, epoch
        state.scale_in_force = scale_in_force(scaler)  # before update() changes it
        state.scaler_marker = None if scaler is None else update_marker(scaler)
        self._txn_open, self._scaler = True, scaler
        self.clock.begin(state.step)  # the training clock times the transaction body
        state.window_from = state.telemetry_s
        try:
            yield StepTransaction(self, state)
        except BaseException:
            self._txn_open = False
            self.close()
            raise
        self._txn_open = False
        for watch in self._watches.values():
            watch.disarm_gradient_hooks()  # a closure step that raised inside the optimizer
        # rows of parameters no optimizer stepped: gradients as left, values at the step's end
        status = grad_scale_status(scaler, True)
        if scaler is not None and update_marker(scaler) is not state.scaler_marker:
            status = "unscaled"  # scaler.step() unscaled them; update() has reset its stages
        self._take_gradients(self._by_stream.get("gradient", []), status)
        self._take_parameters(self._by_stream.get("parameter", []))
        try:
            self._finish_step(StepProvenance.EXPLICIT, optimizer_known=bool(self._watches))
        finally:
            self._scaler = None

    def _finish_step(self, provenance: StepProvenance, optimizer_known: bool = True) -> None:
        state = self._state
        self.clock.end(state.step)
        in_window = state.telemetry_s - state.window_from
        t0 = time.perf_counter()
        if not state.structure_checked:
            self._check_structure()
        self._sites.register_not_run(state)  # never ran so far: recorded site_absent
        hist_step = any(state.hist_due.values())
        any_due = any(state.spine_due.values())  # nothing due: no copy at all this step
        host = {dev: st.to_host(hist_step) for dev, st in self._stagings.items()} if any_due else {}
        drained = self._pending.drain(state.step)
        scalars = drained.scalars
        inactive = {a.name for a in drained.activity if not a.ran}
        batches = assemble_batches(
            state,
            self.streams,
            self._by_stream,
            host,
            self._stagings,
            self._scaler,
            self.settings.update_sample_size,
        )
        batches = withhold_inactive(batches, self.sites, inactive)
        if self._examples_seen is not None:  # None: unknown since a resume (never restarted at 0)
            self._examples_seen += state.examples or 0
        block = StepBlockRecord(
            optimizer_step=state.step,
            examples_seen=self._examples_seen if state.examples is not None else None,
            epoch=state.epoch,
            provenance=provenance,
            truth=step_truth(state, self._scaler, provenance, optimizer_known),
            wall_time=time.time(),
        )
        # clocks before the write: a host-clock row travels in the block's scalars (and live
        # events); the write and publish below count in the next step's telemetry
        t_split = time.perf_counter()
        telemetry_now = state.telemetry_s + (t_split - t0)
        clock_rows = self.clock.finish(state.step, in_window, telemetry_now)
        own = [r for r in clock_rows if r.step == state.step]
        if own:
            scalars = {**scalars, **clock_scalars(own[0])}
        if self._meter is not None and self._meter.decision is None:
            rows = self._meter.observe(
                state.step, t0 - state.started, state.telemetry_s, state.stream_s, telemetry_now
            )
            if self._meter.cadences is not None:
                self.cadences = self._meter.cadences
            scalars = {**scalars, **rows}
        late = [r for r in clock_rows if r.step != state.step]  # CUDA: resolved late
        self._store.write_step(self._rows, block, batches, scalars, drained.dated, late)
        self.telemetry_seconds += telemetry_now
        self.last_block, self.last_batches = block, batches
        self.last_merged = None
        if any_due:  # a collective: every rank logs the same steps (fixed cadences)
            self._live, self.last_merged = safe_merge(self._live, block, batches, hist_step)
        shown = self.last_merged or (block, batches)  # rank 0 of a live merge: the merged rows
        self._next_step = state.step + 1
        self._state = None
        self._begin_step()
        # publish last, once the step is written and the next one begun: a check that raises
        # (action="raise") leaves the collector ready for the next step
        stream = self.settings.event_stream
        try:
            if stream is not None and stream.active:  # no enabled subscriber: skip conversion
                stream.publish(
                    events_from_step(*shown, self.sites, self.descriptor, scalars)
                )
        finally:
            self._state.telemetry_s += time.perf_counter() - t_split  # write, publish, begin

    # ------------------------------------------------------------------ run log (UserLog)
    def _charge(self, seconds: float) -> None:
        # inside a telemetry() window its own timer counts everything (no double charge)
        if self._state is not None and not self._telemetry.open:
            self._state.telemetry_s += seconds

    def _eval_coordinate(self) -> tuple[int, int | None]:
        step = self._state.step if self._state is not None else self._next_step
        last = self.last_block
        if last is None and self._next_step == 0:  # nothing consumed yet: a true zero
            return step, 0
        if last is None:  # resumed, no step yet: what the artifact had consumed (None: unknown)
            return step, self._examples_seen
        return step, last.examples_seen

    @property
    def _log_sink(self) -> Any:
        return self._rows

    def run_view(self) -> Any:
        """Run-log rows written so far (:class:`~stepscope.runlog.RunView`; commits first)."""
        return view_of(self._rows, self.clock, self._closed)

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
        try:  # implicit + scaler: the last iteration's skipped step is still a step
            state = self._state
            if (
                self._implicit_scaler is not None
                and state is not None
                and state.scaler_marker is not None
                and update_marker(self._implicit_scaler) is not state.scaler_marker
            ):
                state.skipped = True
                self._finish_step(StepProvenance.IMPLICIT)
        except Exception:  # closing must not fail for telemetry reasons; hooks still go
            pass
        self._closed = True
        try:
            self._sites.remove()
            for h in self._handles:
                h.remove()
            for watch in self._watches.values():
                watch.remove()
        finally:
            self._handles, self._watches = [], {}
            self._state = None
            self._pending.clear()
            self._updates.clear()
            write_clock_rows(self._rows, self.clock.resolve(block=True))  # CUDA rows still waiting
            if self.writer is not None:
                self.writer.close()
                write_summary(self.path, self.clock.summary(closed=True))

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
                for h in self._handles:
                    h.remove()
        except Exception:
            pass
