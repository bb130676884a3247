"""``HistoryCollector``: module-tier collection that is cheap, batched and pure.

Forward hooks reduce *detached* module outputs under ``no_grad`` at module return; tensor hooks on
those outputs reduce their gradients (``activation_grad``); optimizer pre/post-step hooks reduce
parameter gradients, parameter values and the actual update of a seeded parameter subvector.
Every reduction writes a fixed-width row into a preallocated staging buffer on the tensor's
device; rows reach the host in one copy per buffer at the step boundary, and the step is written
to the history (disk-first artifact or RAM ring) and published on the event stream.

Example
-------
>>> import torch, stepscope as ss
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with ss.HistoryCollector(model, sites="Linear") as c:
...     for _ in range(3):
...         with c.step(opt, examples=16):
...             loss = model(torch.randn(16, 4)).pow(2).mean()
...             opt.zero_grad(); loss.backward(); opt.step()
>>> [b.step_lo for b in c.ring.blocks()]
[0, 1, 2]
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stepscope.collect.autocadence import AutoCadence, choose_stream_cadences
from stepscope.collect.plan import Plan, build_plan
from stepscope.collect.settings import ALL_STREAMS, Cadence, WatchSettings, resolve_cadence
from stepscope.collect.sites import (
    ACTIVATION_STREAMS,
    Row,
    SiteCatalog,
    build_rows,
    output_signature,
    param_signature,
    update_indices,
)
from stepscope.collect.staging import Staging, to_host  # noqa: F401  (tests patch it here)
from stepscope.errors import Refusal
from stepscope.history import (
    ArtifactWriter,
    ObservationBatch,
    Presence,
    RunRecord,
    StepBlockRecord,
    StepProvenance,
    StepRing,
    StepTruth,
    Tristate,
    model_fingerprint,
)
from stepscope.history.batch import code_of
from stepscope.runlog import (
    ArtifactRows,
    EvalRecord,
    MemoryRows,
    PendingStep,
    StepClock,
    check_count,
    clock_scalars,
    close_artifact,
    make_eval,
    withhold_inactive,
    write_clock_rows,
    write_eval,
    write_summary,
)
from stepscope.selection import Selector, select_modules
from stepscope.stats import SPINE_WIDTH

DEFAULT_STREAMS: tuple[str, ...] = ("activation", "gradient", "parameter", "update")
_OBSERVED, _ABSENT = code_of(Presence.OBSERVED), code_of(Presence.SITE_ABSENT)
_UNSUPPORTED = code_of(Presence.UNSUPPORTED)
_PHASE = {
    "activation": "forward",
    "activation_grad": "backward",
    "gradient": "pre_step",
    "parameter": "post_step",
    "update": "post_step",
}


def _leaf_modules(name: str, module: torch.nn.Module) -> bool:
    return next(module.children(), None) is None  # a bare module is its own (root) leaf


@dataclass
class StepState:
    """What the current step has seen so far (host-side bookkeeping only)."""

    step: int
    spine_due: dict[str, bool]
    hist_due: dict[str, bool]
    explicit: bool = False
    stepped: bool = False
    grads_taken: bool = False
    scale_grad: str = "unknown"
    examples: int | None = None
    epoch: int | None = None
    clipped: bool | None = None
    micro_batches: int | None = None
    telemetry_s: float = 0.0
    started: float = 0.0
    window_from: float = 0.0  # telemetry_s when the step's training-clock window opened
    stream_s: dict[str, float] = field(default_factory=dict)  # reduction seconds per stream


class StepTransaction:
    """Handle yielded by :meth:`HistoryCollector.step`; lets the user declare step facts."""

    def __init__(self, collector: HistoryCollector, state: StepState) -> None:
        self._c, self._s = collector, state

    @property
    def step(self) -> int:
        """The optimizer step being recorded (0-based)."""
        return self._s.step

    def declare(self, *, clipped: bool | None = None, micro_batches: int | None = None) -> None:
        """Record facts the collector cannot see (gradient clipping, micro-batch count)."""
        if clipped is not None:
            self._s.clipped = bool(clipped)
        if micro_batches is not None:
            self._s.micro_batches = int(micro_batches)

    def log(self, name: str, value: float | torch.Tensor, step: int | None = None) -> None:
        """A user scalar for this step (batched to the host at the step boundary)."""
        self._c.log(name, value, step)


class HistoryCollector:
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

    Raises
    ------
    Refusal
        ``selection_empty`` at construction when ``sites`` matches nothing (before any forward),
        ``stream_unknown``, ``cadence_invalid``, ``settings_invalid``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        sites: Selector | None = None,
        streams: tuple[str, ...] | list[str] = DEFAULT_STREAMS,
        cadence: Any = None,
        settings: WatchSettings | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module):  # issue 18: never a raw AttributeError
            raise TypeError(f"model must be a torch.nn.Module, not {type(model).__name__}")
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
        self.streams = streams
        self.auto: AutoCadence | None = None
        if cadence == "auto" or isinstance(cadence, AutoCadence):
            self.auto = cadence if isinstance(cadence, AutoCadence) else AutoCadence()
            cadence = dict.fromkeys(streams, self.auto.warmup_cadence())
        self.cadences: dict[str, Cadence] = resolve_cadence(cadence, streams)
        self.cadence_decision: dict[str, Any] | None = None
        self._auto_seen: dict[str, list[float]] = {"shared": [], "train": []}
        self.modules = select_modules(model, sites if sites is not None else _leaf_modules)
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
        self._act_rows: dict[int, dict[str, Row]] = {}
        for r in self.rows:
            if r.stream in ACTIVATION_STREAMS:
                self._act_rows.setdefault(id(r.module), {})[r.stream] = r
        self._stagings: dict[torch.device, Staging] = {}
        self._handles: list[Any] = []
        self._opt_handles: dict[int, list[Any]] = {}
        self._pending = PendingStep()  # user scalars and branch masks of the current step
        self._update_old: dict[int, torch.Tensor] = {}
        self._closed = False
        self._next_step = 0
        self._state: StepState | None = None
        self._txn_open = False
        self._scaler: Any = None
        self.telemetry_seconds = 0.0
        self._open_history(model)
        self.clock = StepClock(self.run.device)
        self._rows: Any = ArtifactRows(self.writer) if self.writer is not None else MemoryRows()
        write_summary(self.path, self.clock.summary(closed=False))
        self._register_param_sites()
        try:
            for _name, module in self.modules:
                if id(module) in self._act_rows:
                    self._handles.append(module.register_forward_hook(self._forward_hook))
            if optimizer is not None:
                self._attach_optimizer(optimizer)
        except BaseException:
            self.close()
            raise
        self._begin_step()

    # ------------------------------------------------------------------ history sink
    def _open_history(self, model: torch.nn.Module) -> None:
        s = self.settings
        rank, world = 0, 1
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        device = next((str(p.device) for p in model.parameters()), "cpu")
        run = RunRecord.new(
            run_id=s.run_id,
            model_fingerprint=model_fingerprint(model),
            histogram_descriptor=self.descriptor.to_dict(),
            cadences={k: c.spine for k, c in self.cadences.items() if isinstance(c.spine, int)},
            device=device,
            rank=rank,
            world_size=world,
            extra={
                **dict(s.extra),
                "cadences": {k: c.describe() for k, c in self.cadences.items()},
                "auto_cadence": None if self.auto is None else asdict(self.auto),
                "streams": self.streams,
                "update_sample_size": s.update_sample_size,
                "update_seed": s.update_seed,
            },
        )
        self.writer: ArtifactWriter | None = None
        self.catalog: Any
        if s.output_dir:
            path = Path(s.output_dir) / (f"rank{rank:03d}" if world > 1 else "")
            self.ring = StepRing(s.ram_capacity, "refuse", disk_backed=True)
            self.writer = ArtifactWriter(
                path,
                None if s.resume else run,
                resume=s.resume,
                commit_steps=s.commit_steps,
                commit_seconds=s.commit_seconds,
                durable=s.durable,
                ring=self.ring,
            )
            self.catalog = self.writer
            self.path: Path | None = path
            if s.resume and self.writer.committed_step is not None:
                self._next_step = self.writer.committed_step + 1
        else:
            self.ring = StepRing(s.ram_capacity, s.ram_policy)
            self.catalog = SiteCatalog()
            self.path = None
        self.run = run

    def _register_param_sites(self) -> None:
        for r in self.rows:
            if r.param is not None:
                r.signature = param_signature(r.param)
                r.site_id = self.catalog.register_site(
                    r.site, r.module_type, r.signature, step=self._next_step
                )
                if r.stream == "update":
                    r.update_index = update_indices(
                        r.site,
                        r.param.numel(),
                        self.settings.update_sample_size,
                        self.settings.update_seed,
                        r.param.device,
                    )

    @property
    def sites(self) -> list:
        """The site catalog (:class:`~stepscope.history.SiteRecord` list)."""
        return self.catalog.sites

    # ------------------------------------------------------------------ plan
    def plan(self) -> Plan:
        """The plan table: rows (site, stream, cadence, elements and bytes per logged step)."""
        return build_plan(
            self.rows, self.cadences, self.descriptor.width, self.settings.update_sample_size
        )

    # ------------------------------------------------------------------ staging helpers
    def _staging(self, device: torch.device) -> Staging:
        st = self._stagings.get(device)
        if st is None:
            st = Staging(len(self.rows), device, self.descriptor, self.settings.kernel_backend)
            self._stagings[device] = st
        return st

    def _reduce(self, row: Row, tensor: torch.Tensor) -> None:
        state = self._state
        if state is None or not state.spine_due[row.stream]:
            return
        t0 = time.perf_counter()
        # detached: no graph is built (the C kernel and the torch path only read the tensor)
        self._staging(tensor.device).write(row.index, tensor.detach(), state.hist_due[row.stream])
        dt = time.perf_counter() - t0
        state.telemetry_s += dt
        state.stream_s[row.stream] = state.stream_s.get(row.stream, 0.0) + dt

    def _recording(self) -> bool:
        # A forward belongs to the training step when the model trains, or, inside an explicit
        # transaction, when it builds a graph. An eval-mode no_grad forward (an evaluation, the
        # dense probe) is never folded into the step's activation rows.
        if self._state is None:
            return False
        return self.model.training or (self._txn_open and torch.is_grad_enabled())

    # ------------------------------------------------------------------ hooks
    def _forward_hook(self, module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if not self._recording():
            return
        rows = self._act_rows[id(module)]
        due = self._state.spine_due
        if not any(due[r.stream] for r in rows.values()) and all(
            r.signature is not None for r in rows.values()
        ):
            return  # nothing due and already discovered: drift is checked on observed steps
        t = (
            output
            if isinstance(output, torch.Tensor)
            else next((o for o in output if isinstance(o, torch.Tensor)), None)
            if isinstance(output, (tuple, list))
            else None
        )
        if t is None:
            return
        sig = output_signature(t)
        for row in rows.values():
            if row.signature != sig:  # discovery, or topology drift: a new series, never re-bound
                row.signature = sig
                row.site_id = self.catalog.register_site(
                    row.site, row.module_type, sig, step=self._state.step
                )
        row = rows.get("activation")
        if row is not None:
            self._reduce(row, t)
        grow = rows.get("activation_grad")
        if grow is not None and t.requires_grad and self._state.spine_due["activation_grad"]:
            t.register_hook(lambda g, grow=grow: self._reduce(grow, g))
        for r in rows.values():
            r.numel = t.numel()

    def _attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        if id(optimizer) in self._opt_handles:
            return
        pre = optimizer.register_step_pre_hook(lambda opt, a, k: self._pre_step(opt))
        post = optimizer.register_step_post_hook(lambda opt, a, k: self._post_step(opt))
        self._opt_handles[id(optimizer)] = [pre, post]

    def _take_gradients(self, phase_scale: str) -> None:
        state = self._state
        if state is None or state.grads_taken or "gradient" not in self.streams:
            return
        state.grads_taken = True
        state.scale_grad = phase_scale
        for row in self._by_stream["gradient"]:
            if row.param.grad is not None:
                self._reduce(row, row.param.grad)

    def _pre_step(self, optimizer: torch.optim.Optimizer) -> None:
        state = self._state
        if state is None:
            return
        self._take_gradients(self._scale_status())
        if "update" in self.streams and state.spine_due["update"]:
            t0 = time.perf_counter()
            with torch.no_grad():
                for row in self._by_stream["update"]:
                    self._update_old[row.index] = self._sample(row)
            dt = time.perf_counter() - t0
            state.telemetry_s += dt
            state.stream_s["update"] = state.stream_s.get("update", 0.0) + dt

    def _sample(self, row: Row) -> torch.Tensor:
        flat = row.param.detach().reshape(-1)
        picked = flat if row.update_index is None else flat.index_select(0, row.update_index)
        return picked.to(torch.float32, copy=True)

    def _post_step(self, optimizer: torch.optim.Optimizer) -> None:
        state = self._state
        if state is None:
            return
        state.stepped = True
        with torch.no_grad():
            for row in self._by_stream.get("update", []):
                old = self._update_old.pop(row.index, None)
                if old is not None:
                    self._reduce(row, self._sample(row) - old)
            for row in self._by_stream.get("parameter", []):
                self._reduce(row, row.param)
        if not self._txn_open:  # implicit spelling: the optimizer step ends the step
            self._finish_step(StepProvenance.IMPLICIT)

    def _scale_status(self) -> str:
        if not self._txn_open:
            return "unknown"
        if self._scaler is None:
            return "unscaled"  # the explicit transaction declared no loss scaling
        try:  # GradScaler.step unscales before calling optimizer.step
            stages = [str(s.get("stage")) for s in self._scaler._per_optimizer_states.values()]
            return (
                "unscaled" if any("UNSCALED" in s or "STEPPED" in s for s in stages) else "scaled"
            )
        except AttributeError:
            return "unknown"

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
        optimizer: torch.optim.Optimizer | None = None,
        scaler: Any = None,
        examples: int | None = None,
        epoch: int | None = None,
    ) -> Iterator[StepTransaction]:
        """The explicit, authoritative step transaction.

        Put one optimizer step (forward, backward, ``optimizer.step()``) inside. ``examples`` is
        the number of examples this step consumed (accumulated into ``examples_seen``);
        ``epoch`` is your own epoch count (never derived). An exception escaping the block
        closes the collector (hooks removed, committed data kept) and propagates.
        """
        self._check_open()
        examples, epoch = check_count(examples, "examples"), check_count(epoch, "epoch")
        if self._txn_open:
            raise Refusal(
                "step_transaction_nested", "a step transaction is already open", ["close it first"]
            )
        if optimizer is not None:
            self._attach_optimizer(optimizer)
        if self._state is None:
            self._begin_step()
        state = self._state
        state.explicit, state.examples, state.epoch = True, examples, epoch
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
        if not state.grads_taken:  # no optimizer step happened: take gradients as left
            self._take_gradients(self._scale_status() if scaler is not None else "unscaled")
        self._finish_step(StepProvenance.EXPLICIT, optimizer_known=bool(self._opt_handles))
        self._scaler = None

    def _finish_step(self, provenance: StepProvenance, optimizer_known: bool = True) -> None:
        state = self._state
        self.clock.end(state.step)
        in_window = state.telemetry_s - state.window_from
        t0 = time.perf_counter()
        hist_step = any(state.hist_due.values())
        any_due = any(state.spine_due.values())  # nothing due: no copy at all this step
        host = {dev: st.to_host(hist_step) for dev, st in self._stagings.items()} if any_due else {}
        drained = self._pending.drain(state.step)
        scalars = drained.scalars
        inactive = {a.name for a in drained.activity if not a.ran}
        batches = withhold_inactive(self._batches(state, host), self.sites, inactive)
        applied = (
            Tristate.of(state.stepped)
            if (optimizer_known and provenance is StepProvenance.EXPLICIT)
            else (Tristate.YES if state.stepped else Tristate.UNKNOWN)
        )
        truth = StepTruth(
            applied=applied,
            scale=None if self._scaler is None else float(self._scaler.get_scale()),
            unscaled=Tristate.of(state.scale_grad == "unscaled")
            if state.scale_grad != "unknown"
            else Tristate.UNKNOWN,
            clipped=Tristate.of(state.clipped),
            micro_batches=state.micro_batches,
        )
        self._examples_seen = getattr(self, "_examples_seen", 0) + (state.examples or 0)
        block = StepBlockRecord(
            optimizer_step=state.step,
            examples_seen=self._examples_seen if state.examples is not None else None,
            epoch=state.epoch,
            provenance=provenance,
            truth=truth,
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
        if self.auto is not None and self.cadence_decision is None:
            scalars = {**scalars, **self._auto_measure(state, t0, telemetry_now)}
        if self.writer is not None:
            self.writer.write_step(block, batches, scalars=scalars)
        else:
            self.ring.push(block, batches)
            self._rows.write_step(block, scalars=scalars)
        for name, at, value in drained.dated:
            self._rows.write_scalar(name, at, value)
        write_clock_rows(self._rows, [r for r in clock_rows if r.step != state.step])  # CUDA
        stream = self.settings.event_stream
        if stream is not None and stream.active:  # no enabled subscriber: skip the conversion
            from stepscope.events import events_from_step

            stream.publish(events_from_step(block, batches, self.sites, self.descriptor, scalars))
        self.telemetry_seconds += telemetry_now
        self.last_block, self.last_batches = block, batches
        self._next_step = state.step + 1
        self._state = None
        self._begin_step()
        self._state.telemetry_s += time.perf_counter() - t_split  # write, publish, next begin

    def _auto_measure(
        self, state: StepState, t_finish: float, telemetry: float
    ) -> dict[str, float]:
        """Record this warmup step's costs; at the last warmup step choose the cadences.

        Returns scalar rows ``cadence/<stream>/spine_every`` (and ``histogram_every``, and
        ``cadence/expected_overhead``) for the step at which the decision was made.
        """
        seen = self._auto_seen
        if state.step > 0:  # step 0 pays discovery and kernel loading: not representative
            seen["train"].append(max(0.0, (t_finish - state.started) - state.telemetry_s))
            seen["shared"].append(max(0.0, telemetry - sum(state.stream_s.values())))
            for s in self.streams:
                seen.setdefault(s, []).append(state.stream_s.get(s, 0.0))
        if state.step < self.auto.warmup - 1:
            return {}
        choice = choose_stream_cadences(
            {s: seen.get(s, []) for s in self.streams},
            seen["shared"],
            seen["train"],
            self.auto.target,
            self.auto.histogram_factor,
        )
        self.cadences = dict(choice.cadences)
        self.cadence_decision = {**choice.to_dict(), "decided_at_step": state.step}
        rows: dict[str, float] = {}
        for s, c in choice.cadences.items():
            rows[f"cadence/{s}/spine_every"] = float(c.spine)
            rows[f"cadence/{s}/histogram_every"] = float(c.histogram)
        if choice.expected_overhead is not None:
            rows["cadence/expected_overhead"] = choice.expected_overhead
        return rows

    def _batches(self, state: StepState, host: dict) -> list[ObservationBatch]:
        out = []
        for stream in self.streams:
            if not state.spine_due[stream]:
                continue
            rows = [r for r in self._by_stream[stream] if r.site_id is not None]
            if not rows:
                continue
            if stream == "update" and not state.stepped:
                continue  # a skipped optimizer step records no update at all
            idx = np.array([r.index for r in rows])
            spines = np.full((len(rows), SPINE_WIDTH), np.nan)
            presence = np.full(len(rows), _ABSENT, dtype=np.uint8)
            hist_rows, hists = [], []
            for dev, (sp, hi) in host.items():
                st = self._stagings[dev]
                fired = st.fired[idx] > 0
                spines[fired] = sp[idx[fired]]
                presence[fired] = _OBSERVED
                if hi is not None and state.hist_due[stream]:
                    for j in np.flatnonzero(st.hist_fired[idx]):
                        hist_rows.append(j)
                        hists.append(hi[idx[j]])
            disclosures: tuple[str, ...] = ()
            if stream == "update":
                sampled = [r for r in rows if r.update_index is not None]
                if sampled:
                    disclosures = (f"update_sampled:{self.settings.update_sample_size}",)
            out.append(
                ObservationBatch(
                    stream,
                    _PHASE[stream]
                    if not (stream == "gradient" and not state.stepped)
                    else "backward",
                    np.array([r.site_id for r in rows]),
                    presence,
                    spines,
                    hist_rows=np.array(hist_rows, dtype=np.int64) if hists else None,
                    histograms=np.stack(hists) if hists else None,
                    scale_grad=self._scale_grad_of(stream, state),
                    disclosures=disclosures,
                )
            )
        return out

    def _scale_grad_of(self, stream: str, state: StepState) -> str | None:
        if stream == "gradient":
            return state.scale_grad
        if (
            stream == "activation_grad"
        ):  # taken during backward: scaled iff a scaler scaled the loss
            if not state.explicit:
                return "unknown"
            return "scaled" if self._scaler is not None else "unscaled"
        return None

    # ------------------------------------------------------------------ run log
    def _telemetry(self, t0: float) -> None:
        if self._state is not None:
            self._state.telemetry_s += time.perf_counter() - t0

    def log(self, name: str, value: float | torch.Tensor, step: int | None = None) -> None:
        """Record a user scalar (loss, learning rate, ...) for the current step.

        Tensors stay on their device until the step boundary, where all of them are moved to the
        host in one transfer — never one ``.item()`` per call. ``step`` logs at another step.
        """
        t0 = time.perf_counter()
        self._check_open()
        self._pending.add_scalar(name, value, step)
        self._telemetry(t0)

    def log_mask(
        self,
        name: str,
        active_mask: Any,
        *,
        branch_dim: int | None = None,
        nominal_macs_per_unit: float | None = None,
    ) -> None:
        """Branch activity of the current step (stochastic depth, experts, unit dropout).

        ``name`` is the branch's qualified module name; each nonzero entry of ``active_mask`` is
        one active unit. Writes ``branch/<name>/active_fraction``, ``active_units``,
        ``total_units`` and, with ``nominal_macs_per_unit``, ``nominal_skipped_macs`` (nominal,
        not measured time or energy). A branch with no active unit this step has the gradient
        cells of its sites recorded ``not_scheduled`` (no payload), never as zeros.
        See :meth:`stepscope.runlog.PendingStep.add_mask` for ``branch_dim``.
        """
        t0 = time.perf_counter()
        self._check_open()
        self._pending.add_mask(
            name, active_mask, branch_dim=branch_dim, nominal_macs_per_unit=nominal_macs_per_unit
        )
        self._telemetry(t0)

    def log_eval(
        self,
        split: str,
        metrics: dict[str, Any],
        *,
        sample_count: int | None = None,
        data_hash: str | None = None,
        endpoint: bool = False,
        epoch: int | None = None,
    ) -> EvalRecord:
        """Record one evaluation of ``split`` at the current training coordinate.

        ``optimizer_step`` is the number of steps recorded so far (0 at initialization),
        ``examples_seen`` the examples of those steps (``None`` if a step did not declare them),
        ``epoch`` your own count (``None``: not recorded). Tensor metrics are moved to the host
        in one transfer. Returns the stored :class:`~stepscope.runlog.EvalRecord`.
        """
        t0 = time.perf_counter()
        self._check_open()
        step = self._state.step if self._state is not None else self._next_step
        last = getattr(self, "last_block", None)
        fresh = last is None and self._next_step == 0  # nothing consumed yet: a true zero
        seen = 0 if fresh else (None if last is None else last.examples_seen)
        rec = make_eval(
            split,
            metrics,
            step=step,
            examples_seen=seen,
            epoch=epoch,
            sample_count=sample_count,
            data_hash=data_hash,
            endpoint=endpoint,
        )
        write_eval(self._rows, rec)
        self._telemetry(t0)
        return rec

    def run_view(self) -> Any:
        """Run-log rows written so far (:class:`~stepscope.runlog.RunView`; commits first)."""
        from stepscope.runlog.runlog import view_of

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
        self._closed = True
        try:
            for h in self._handles:
                h.remove()
            for hs in self._opt_handles.values():
                for h in hs:
                    h.remove()
        finally:
            self._handles, self._opt_handles = [], {}
            self._state = None
            self._pending.clear()
            write_clock_rows(self._rows, self.clock.resolve(block=True))  # CUDA rows still waiting
            if self.writer is not None:  # disk faults are reported, not raised (issue 18)
                self.close_report = close_artifact(self._rows, self.clock.summary(closed=True))

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
                for h in self._handles:
                    h.remove()
        except Exception:
            pass
