"""Writing a step: the step boundary, batch assembly, the destination, and resume.

The step boundary: a finished step's rows become its record and reach the destination.

At the end of every step the collector hands its :class:`~stepscope.collect.step.StepState`
to :meth:`StepBoundary.write`, which

1. copies the staged rows to the host (one copy per buffer; none when no stream is due),
2. drains the user's scalars and branch masks of the step and assembles one
   :class:`~stepscope.history.ObservationBatch` per due stream (rows of inactive branches
   withheld),
3. builds the :class:`~stepscope.history.StepBlockRecord` (``examples_seen`` accumulated, the
   optimizer facts of :func:`~stepscope.collect.step.step_truth`),
4. closes the step's clocks (``clock/*`` scalars) and, during an ``"auto"`` cadence warm-up,
   feeds the :class:`~stepscope.collect.cadence.WarmupMeter` (``cadence/*`` scalars),
5. writes the step (artifact, or RAM ring and run-log rows).

:meth:`StepBoundary.close` flushes what is left when the collector closes.

:meth:`StepBoundary.publish` then puts the step on the event bus; the collector calls it
last, once the next step has begun, so that a check raising there leaves it ready.

Where a collector's steps go: a disk-first artifact (a new version, or ``output_dir``) or RAM.

:func:`open_store` builds the run record (fingerprint, descriptor, cadences, streams) and the
writer, ring and site catalog that the collector writes through.

Resume: where a resumed collector's step and ``examples_seen`` continue from.

The checks themselves (same run, same model fingerprint, same histogram descriptor) are made by
the writer (:func:`stepscope.history.artifact.check_resume_facts`), which also records the new
segment's own facts with its ancestry. This module answers the two questions the collector
has before its first step:

* which run the artifact holds (:func:`artifact_run_id`), so that a resume without an explicit
  ``run_id`` continues it;
* how many examples were consumed before the resume step (:func:`resumed_examples_seen`).

Example
-------
>>> from stepscope.history import StepBlockRecord
>>> resumed_examples_seen(10, StepBlockRecord(9, examples_seen=640), None)
640
>>> resumed_examples_seen(12, StepBlockRecord(9, examples_seen=640), None) is None  # a gap
True
>>> resumed_examples_seen(12, StepBlockRecord(9, examples_seen=640), 768)  # declared
768
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from stepscope import transfer
from stepscope.collect.activations import ActivationSites
from stepscope.collect.cadence import Cadence, WarmupMeter
from stepscope.collect.settings import WatchSettings
from stepscope.collect.sites import SiteCatalog, SiteRow
from stepscope.collect.staging import Reducer, Staging
from stepscope.collect.step import StepState, as_scale, scale_grad_of
from stepscope.errors import Refusal
from stepscope.events.convert import events_from_step
from stepscope.events.live import LiveStream, open_live
from stepscope.history import (
    CloseReport,
    HistoryWriter,
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
from stepscope.history.files import read_json
from stepscope.history.versions import claim_version, default_root
from stepscope.history.vocab import UPDATE_SAMPLED, Phase, ScaleGrad, Stream
from stepscope.runlog import (
    DiskSink,
    Drained,
    MemorySink,
    PendingStep,
    StepClock,
    StepSink,
    clock_scalars,
    withhold_inactive,
    write_clock_rows,
)
from stepscope.stats import SPINE_WIDTH, backend_info

__all__ = ["StepBoundary", "WrittenStep", "artifact_run_id", "resumed_examples_seen"]

OBSERVED, ABSENT = code_of(Presence.OBSERVED), code_of(Presence.SITE_ABSENT)
UNSUPPORTED, FAILED = code_of(Presence.UNSUPPORTED), code_of(Presence.CAPTURE_FAILED)
PHASE: dict[str, Phase] = {
    "activation": Phase.FORWARD,
    "activation_grad": Phase.BACKWARD,
    "gradient": Phase.PRE_STEP,
    "parameter": Phase.POST_STEP,
    "update": Phase.POST_STEP,
}

# ------------------------------------------------------------------ (boundary)
#: what a step that logged nothing drains (never mutated: the boundary copies its scalars)
NOTHING_LOGGED = Drained()


class WrittenStep(NamedTuple):
    """What :meth:`StepBoundary.write` wrote for one step (a tuple: built at every step)."""

    block: StepBlockRecord
    batches: list[ObservationBatch]
    scalars: dict[str, float]
    examples_seen: int | None  # the running count after this step (``None``: unknown)
    telemetry_s: float  # the step's telemetry seconds up to ``written_from``
    written_from: float  # ``perf_counter()`` when the write began (charged to the next step)
    cadences: dict[str, Cadence] | None  # the auto-cadence decision, once it is made
    any_due: bool = False  # some stream was due: the rows were copied (a live merge's step)
    histogram_step: bool = False  # some stream's histograms were due


class StepBoundary:
    """Turns one collector's finished steps into written step blocks.

    Parameters
    ----------
    streams, by_stream
        The collector's streams and its per-stream rows (shared with model surgery).
    sites
        The activation sites (modules that never ran are registered ``site_absent``).
    reducer
        The staging buffers holding the step's rows.
    pending, clock
        The user's scalars/masks of the step and the step clock.
    store
        The destination (its :attr:`Store.sink` is where every step is written).
    meter
        The auto-cadence warm-up meter (``None`` without ``cadence="auto"``).
    settings
        The collector's settings (update sample size, event bus, descriptor).
    """

    def __init__(
        self,
        streams: Sequence[str],
        by_stream: Mapping[str, list[SiteRow]],
        sites: ActivationSites,
        reducer: Reducer,
        pending: PendingStep,
        clock: StepClock,
        store: Store,
        meter: WarmupMeter | None,
        settings: WatchSettings,
    ) -> None:
        self.streams, self.by_stream, self.sites, self.reducer = streams, by_stream, sites, reducer
        self.pending, self.clock, self.store, self.sink = pending, clock, store, store.sink
        self.meter, self.settings = meter, settings
        self._plans: dict[str, StreamPlan] = {}  # each stream's rows and arrays, between steps
        self._truths: dict[tuple[Any, ...], StepTruth] = {}  # step facts seen, by their inputs
        # live streaming to TensorBoard/W&B (settings.tensorboard/wandb), rank 0 only
        self.live: LiveStream | None = None
        if store.run.rank == 0:
            self.live = open_live(settings, store.run, settings.output_dir)

    def write(
        self,
        state: StepState,
        started: float,
        provenance: StepProvenance,
        optimizer_known: bool,
        scaler: Any,
        examples_seen: int | None,
    ) -> WrittenStep:
        """Write the step of ``state``; ``started`` is ``perf_counter()`` when its boundary began
        (the boundary's own seconds are telemetry) and ``examples_seen`` the count before it."""
        in_window = state.telemetry_s - state.window_from
        if self.sites.compiled or not state.activations_quiet:  # (else nothing to register)
            self.sites.register_not_run(state)  # never ran so far: recorded site_absent
        hist_step = any(state.hist_due.values())
        any_due = any(state.spine_due.values())  # nothing due: no copy at all this step
        host = host_copy(self.reducer.stagings, hist_step) if any_due else {}
        # nothing logged this step (the common case): nothing to drain
        drained = self.pending.drain(state.step) if self.pending else NOTHING_LOGGED
        scalars = dict(drained.scalars) if drained.scalars else {}
        batches: list[ObservationBatch] = []
        if any_due:  # nothing due: no batch (none is assembled)
            inactive = {a.name for a in drained.activity if not a.ran}
            batches = assemble_batches(
                state,
                self.streams,
                self.by_stream,
                host,
                self.reducer.stagings,
                scaler,
                self.settings.update_sample_size,
                self._plans,
            )
            batches = withhold_inactive(batches, self.store.catalog.sites, inactive)
        if examples_seen is not None:  # None: unknown since a resume (never restarted at 0)
            examples_seen += state.examples or 0
        block = StepBlockRecord.trusted(
            state.step,
            examples_seen if state.examples is not None else None,
            state.epoch,
            provenance,
            step_truth(state, scaler, provenance, optimizer_known, self._truths),
            time.time(),
        )
        # clocks before the write: a host-clock row travels in the block's scalars (and live
        # events); the write and publish count in the next step's telemetry
        t_split = time.perf_counter()
        telemetry_now = state.telemetry_s + (t_split - started)
        clock_rows = self.clock.finish(state.step, in_window, telemetry_now)
        own = [r for r in clock_rows if r.step == state.step]
        if own:
            scalars = {**scalars, **clock_scalars(own[0])}
        cadences = None
        if self.meter is not None and self.meter.decision is None:
            train = (started - state.started) - (state.telemetry_s - state.window_from)
            writer = self.store.writer
            if writer is not None and self.meter.done(state.step):
                # the warm-up's rows are made durable at the decision; what one commit costs
                # is spread over the steps between commits and charged to the next step like a
                # write -- nothing where commits run on the writer thread, not this one
                t0 = time.perf_counter()
                writer.commit()
                self.meter.commit_s = 0.0 if writer.background else time.perf_counter() - t0
            rows = self.meter.observe(
                state.step,
                train,
                state.stream_s,
                telemetry_now,
                state.carried_s,
                state.hook_s,
                state.hook_calls,
            )
            cadences = self.meter.cadences
            scalars = {**scalars, **rows}
        self.sink.write_step(block, batches, scalars)
        for name, at, value in drained.dated:  # logged for other steps
            self.sink.write_scalar(name, at, value)
        if len(clock_rows) != len(own):  # CUDA: rows of earlier steps resolved late
            write_clock_rows(self.sink, [r for r in clock_rows if r.step != state.step])
        return WrittenStep(
            block,
            batches,
            scalars,
            examples_seen,
            telemetry_now,
            t_split,
            cadences,
            any_due,
            hist_step,
        )

    def close(self, next_step: int) -> CloseReport | None:
        """The collector closes: keep the scalars logged for written steps (the open step's
        are dropped with it), write the clock rows still waiting (CUDA), close the artifact.

        Returns what the artifact's close left uncommitted or dropped (``None`` in RAM-only
        mode); a disk fault is reported there, never raised.
        """
        try:
            dated = self.pending.drain(next_step).dated if self.pending else ()
        except Refusal:  # the open step's own rows clash: they are dropped with it
            dated = ()
        for name, at, value in dated:
            if at < next_step:
                self.sink.write_scalar(name, at, value)
        self.pending.clear()
        if self.live is not None:
            self.live.close()  # sends what is queued; never raises
        write_clock_rows(self.sink, self.clock.resolve(block=True))
        return self.sink.close(self.clock.summary(closed=True))

    def publish(
        self,
        written: WrittenStep,
        merged: tuple[StepBlockRecord, list[ObservationBatch]] | None = None,
    ) -> None:
        """Put a written step on the event bus (skipped without an enabled subscriber).

        ``merged``: rank 0 of a live merge publishes the ranks' merged rows instead of its own.
        """
        bus = self.settings.event_bus
        active = bus is not None and bus.active
        if self.live is None and not active:  # no subscriber (the default): nothing to build
            return
        sites, descriptor = self.store.catalog.sites, self.settings.descriptor
        block, batches = merged or (written.block, written.batches)
        if self.live is not None:  # queued for the streaming thread; never waits
            self.live.submit(block, batches, sites, descriptor, written.scalars)
        if bus is not None and active:
            bus.publish(events_from_step(block, batches, sites, descriptor, written.scalars))


# ------------------------------------------------------------------ (batch assembly)
def host_copy(
    stagings: Mapping[Any, Staging], with_histograms: bool
) -> dict[Any, tuple[np.ndarray, np.ndarray | None]]:
    """Every staging buffer's rows on the host: one copy of its spine buffer (and of its
    histogram buffer on histogram steps when a histogram row fired), through
    :func:`stepscope.transfer.to_host`, the one copy every layer uses (looked up at each call:
    tests count it)."""
    out = {}
    for dev, st in stagings.items():
        spines = transfer.to_host(st.spines)
        hist = transfer.to_host(st.hist) if with_histograms and st.hist_fired.any() else None
        out[dev] = (spines, hist)
    return out


def step_truth(
    state: StepState,
    scaler: Any,
    provenance: StepProvenance,
    optimizer_known: bool,
    seen: dict[tuple[Any, ...], StepTruth] | None = None,
) -> StepTruth:
    """The optimizer facts of a finished step (``unknown`` wherever they were not seen).

    ``seen`` keeps the facts of earlier steps by their inputs: most steps state the same facts,
    and a :class:`~stepscope.history.StepTruth` is immutable, so it is built once and shared.
    """
    if state.skipped and not state.stepped:
        applied = Tristate.NO  # the scaler ended the iteration without an optimizer step
    elif optimizer_known and provenance is StepProvenance.EXPLICIT:
        applied = Tristate.YES if state.stepped else Tristate.NO  # (Tristate.of a bool)
    else:
        applied = Tristate.YES if state.stepped else Tristate.UNKNOWN
    if seen is None:
        return _truth(state, applied)
    scale = state.scale_in_force
    if scale is not None and not isinstance(scale, float):
        return _truth(state, applied)  # a device scale: read once, never a key
    key = (applied, scale, state.scale_grad, state.clipped, state.micro_batches)
    truth = seen.get(key)
    if truth is None:
        truth = seen[key] = _truth(state, applied)
    return truth


def _truth(state: StepState, applied: Tristate) -> StepTruth:
    return StepTruth(
        applied=applied,
        scale=as_scale(state.scale_in_force),
        unscaled=Tristate.of(state.scale_grad == "unscaled")
        if state.scale_grad != "unknown"
        else Tristate.UNKNOWN,
        clipped=Tristate.of(state.clipped),
        micro_batches=state.micro_batches,
    )


@dataclass
class StreamPlan:
    """The registered rows of one stream and the arrays its batches need, built once.

    Rebuilt by :func:`stream_plan` whenever the stream's row list is replaced (model surgery
    retires a row), a row's site changes (discovery, surgery, ``site_absent`` registration)
    or an update row's sampled indices change; it holds the lists and index tensors it was
    built from, so their identities cannot be reused while it lives.
    """

    rows_list: Sequence[SiteRow]  # the collector's row list of the stream it was built from
    site_key: tuple[int | None, ...]  # every row's site id when built
    sample_key: tuple[int, ...]  # ids of the update rows' sampled indices when built
    samples: tuple[Any, ...]  # those index tensors (held: their ids stay unique)
    rows: list[SiteRow]  # the rows with a site, in order
    idx: np.ndarray  # their staging rows (int64)
    site_ids: np.ndarray  # their site ids (int32, read-only: shared by every step's batch)
    sampled: tuple[tuple[str, ...], ...]  # each row's ``update_sampled:<k>`` note, or ()
    any_sampled: bool
    stream: Stream


def stream_plan(
    plans: dict[str, StreamPlan], stream: str, rows_list: Sequence[SiteRow]
) -> StreamPlan:
    """The cached :class:`StreamPlan` of ``stream``, rebuilt when its rows changed."""
    site_key = tuple([r.site_id for r in rows_list])
    samples = tuple([r.update_index for r in rows_list]) if stream == "update" else ()
    sample_key = tuple(map(id, samples))
    plan = plans.get(stream)
    if (
        plan is not None
        and plan.rows_list is rows_list
        and plan.site_key == site_key
        and plan.sample_key == sample_key
    ):
        return plan
    rows = [r for r in rows_list if r.site_id is not None]
    site_ids = np.array([r.site_id for r in rows], dtype=np.int32)
    site_ids.flags.writeable = False
    sampled = tuple(
        () if r.update_index is None else (f"{UPDATE_SAMPLED}:{len(r.update_index)}",) for r in rows
    )
    plan = StreamPlan(
        rows_list,
        site_key,
        sample_key,
        samples,
        rows,
        np.array([r.index for r in rows], dtype=np.int64),
        site_ids,
        sampled,
        any(sampled),
        Stream(stream),
    )
    plans[stream] = plan
    return plan


def _rows_of(
    plan: StreamPlan,
    state: StepState,
    stream: str,
    host: Mapping[Any, tuple[np.ndarray, np.ndarray | None]],
    stagings: Mapping[Any, Any],
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Spines, presence and histograms of a plan's rows: whole-array operations per device."""
    idx, n = plan.idx, len(plan.rows)
    spines: np.ndarray | None = None
    presence: np.ndarray | None = None
    hist_rows: list[np.ndarray] = []
    hists: list[np.ndarray] = []
    take_hist = state.hist_due[stream]
    failed = None
    for dev, (sp, hi) in host.items():
        st = stagings[dev]
        fired = st.fired[idx] > 0
        if spines is None and fired.all():  # the common case: every row written on one device
            spines = sp[idx]
            presence = np.full(n, OBSERVED, dtype=np.uint8)
        else:
            if spines is None or presence is None:
                spines = np.full((n, SPINE_WIDTH), np.nan)
                presence = np.full(n, ABSENT, dtype=np.uint8)
            spines[fired] = sp[idx[fired]]
            presence[fired] = OBSERVED
        if hi is not None and take_hist:
            ks = np.flatnonzero(st.hist_fired[idx])
            if state.failed and len(ks):
                if failed is None:
                    failed = np.isin(idx, np.fromiter(state.failed, np.int64, len(state.failed)))
                ks = ks[~failed[ks]]
            if len(ks):
                hist_rows.append(ks)
                hists.append(hi[idx[ks]])
    if spines is None or presence is None:  # no buffer at all: nothing was written
        spines = np.full((n, SPINE_WIDTH), np.nan)
        presence = np.full(n, ABSENT, dtype=np.uint8)
    if not hists:
        return spines, presence, None, None
    if len(hists) == 1:
        return spines, presence, hist_rows[0].astype(np.int64), np.ascontiguousarray(hists[0])
    return spines, presence, np.concatenate(hist_rows).astype(np.int64), np.concatenate(hists)


def assemble_batches(
    state: StepState,
    streams: Sequence[str],
    by_stream: Mapping[str, Sequence[SiteRow]],
    host: Mapping[Any, tuple[np.ndarray, np.ndarray | None]],
    stagings: Mapping[Any, Any],
    scaler: Any,
    update_sample_size: int,
    plans: dict[str, StreamPlan] | None = None,
) -> list[ObservationBatch]:
    """One batch per due stream: every registered row of it, with its presence.

    A row is ``observed`` when a hook wrote it on some device, ``unsupported`` when a hook saw it
    but could not reduce it (the reason is a per-row disclosure ``unsupported:<reason>``),
    ``capture_failed`` when the reduction raised (disclosure ``capture_failed:<exception>``;
    the error never reaches the training step), and ``site_absent`` otherwise (the site did not
    run, or its gradient was ``None``).

    ``plans`` caches each stream's :class:`StreamPlan` between steps (``None``: built afresh).
    The batches are built by :meth:`~stepscope.history.ObservationBatch.trusted`: their arrays
    are made here, of the right kinds, one row per site (``tests/collect/boundary_reference.py``
    keeps the checked per-row assembly the equivalence test compares against).
    """
    out = []
    plans = {} if plans is None else plans
    for stream in streams:
        if not state.spine_due[stream]:
            continue
        plan = stream_plan(plans, stream, by_stream[stream])
        rows = plan.rows
        if not rows:
            continue
        if stream == "update" and not state.stepped:
            continue  # a skipped optimizer step records no update at all
        spines, presence, hist_rows, histograms = _rows_of(plan, state, stream, host, stagings)
        notes: Sequence[tuple[str, ...]]
        if not (state.failed or state.unsupported or state.row_notes):
            # the common case: only update rows disclose anything (their sample size)
            if not plan.any_sampled:
                notes = ()
            elif (presence == OBSERVED).all():
                notes = plan.sampled
            else:
                notes = tuple(
                    note if p == OBSERVED else ()
                    for note, p in zip(plan.sampled, presence.tolist())
                )
        else:
            notes = _row_notes(plan, state, spines, presence)
        scale_grad = scale_grad_of(stream, state.scale_grad, state.explicit, scaler)
        phase = (
            PHASE[stream] if not (stream == "gradient" and not state.stepped) else Phase.BACKWARD
        )
        grad_scale = None if scale_grad is None else ScaleGrad(scale_grad)
        row_disclosures = tuple(notes) if any(notes) else None
        out.append(
            ObservationBatch.trusted(
                plan.stream,
                phase,
                plan.site_ids,
                presence,
                spines,
                hist_rows=hist_rows,
                histograms=histograms,
                scale_grad=grad_scale,
                row_disclosures=row_disclosures,
            )
        )
    return out


def _row_notes(
    plan: StreamPlan, state: StepState, spines: np.ndarray, presence: np.ndarray
) -> list[tuple[str, ...]]:
    """Rows that failed, were refused or carry a note: presence and disclosures row by row."""
    notes: list[tuple[str, ...]] = []
    for j, r in enumerate(plan.rows):
        reason = state.unsupported.get(r.index)
        error = state.failed.get(r.index)
        if error is not None:  # a partial row is not a fact: drop what was written
            presence[j], spines[j] = FAILED, np.nan
            notes.append((f"capture_failed:{error}",))
            continue
        if reason is not None and presence[j] != OBSERVED:
            presence[j] = UNSUPPORTED
            notes.append((f"unsupported:{reason}",))
            continue
        extra = state.row_notes.get(r.index)
        note: tuple[str, ...] = () if extra is None else (extra,)
        if presence[j] == OBSERVED:
            note = (*note, *plan.sampled[j])
        notes.append(note)  # an absent row's note says why (e.g. not_stepped:grad_none)
    return notes


# ------------------------------------------------------------------ (store)
@dataclass
class Store:
    """The opened destination of a collector."""

    run: RunRecord
    ring: StepRing
    catalog: Any  # HistoryWriter (disk) or SiteCatalog (RAM): both register and end sites
    writer: HistoryWriter | None
    path: Path | None
    next_step: int  # 0, or the step after the last committed one when resuming
    examples_seen: int | None = 0  # examples consumed before next_step (None: unknown)
    _sink: StepSink | None = None

    @property
    def sink(self) -> StepSink:
        """Where the steps are written: the artifact's writer (trusted: the boundary registers
        every site it writes), or RAM (the ring keeps the observation batches)."""
        if self._sink is None:
            self._sink = (
                MemorySink(self.ring)
                if self.writer is None
                else DiskSink(self.writer, trusted=True)
            )
        return self._sink


def run_directory(settings: WatchSettings, rank: int = 0, world: int = 1) -> Path | None:
    """The directory a collector writes to (``None``: ``in_memory``); claims a new version.

    ``output_dir`` is used as given; otherwise the next ``version_<N>`` of
    ``<root_dir>/<name>`` is created (:func:`~stepscope.history.versions.claim_version`). Under
    several ranks each rank writes its own ``rank<r>`` subdirectory.
    """
    s = settings
    if s.in_memory:
        return None
    slot = f"rank{rank:03d}" if world > 1 else None
    if s.output_dir:
        return Path(s.output_dir) / (slot or "")
    parent = Path(s.root_dir) if s.root_dir else default_root()
    return claim_version(parent / s.name if s.name else parent, slot)


def run_exists_remedies(path: Path) -> list[str]:
    """What to do when an exact ``output_dir`` already holds a run: the two exact spellings."""
    name = (
        path.name
        if (default_root() / path.name).resolve() != path.resolve()
        else f"{path.name}_runs"
    )
    return [
        f"continue that run: ss.WatchSettings(output_dir={str(path)!r}, resume=True)",
        f"or a new run every time: ss.WatchSettings(name={name!r}) writes "
        f"{default_root() / name}/version_<N> (collector.run_dir says which)",
    ]


def open_store(
    model: torch.nn.Module,
    settings: WatchSettings,
    streams: Sequence[str],
    cadences: Mapping[str, Cadence],
    auto: Any,
) -> Store:
    """Open the artifact (or RAM ring) a collector of ``model`` writes to."""
    s = settings
    rank, world = 0, 1
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    device = next((str(p.device) for p in model.parameters()), "cpu")
    run = RunRecord.new(
        run_id=s.run_id,
        model_fingerprint=model_fingerprint(model),
        histogram_descriptor=s.descriptor.to_dict(),
        cadences={k: c.spine for k, c in cadences.items() if isinstance(c.spine, int)},
        device=device,
        rank=rank,
        world_size=world,
        extra={
            **dict(s.extra),
            "cadences": {k: c.describe() for k, c in cadences.items()},
            "auto_cadence": None if auto is None else asdict(auto),
            "streams": list(streams),
            "update_sample_size": s.update_sample_size,
            "update_seed": s.update_seed,
            "kernel_backend": backend_info(),  # which reduction kernels produced the rows
        },
    )
    path = run_directory(s, rank, world)
    if path is None:
        ring = StepRing(s.ram_capacity, s.ram_policy)
        return Store(run, ring, SiteCatalog(), None, None, 0)
    ring = StepRing(s.ram_capacity, "refuse", disk_backed=True)
    if s.resume and s.run_id is None:
        found = artifact_run_id(path)
        if found is not None:  # continue the artifact's run (none yet: keep the new run id)
            run = replace(run, run_id=found)
    try:
        writer = HistoryWriter(
            path,
            run,
            resume=s.resume,
            resume_at_step=s.resume_step,
            commit_steps=s.commit_steps,
            commit_seconds=s.commit_seconds,
            durable=s.durable,
            ring=ring,
            background=s.background_writer,  # (a flight recorder saves through it too)
        )
    except Refusal as err:
        if err.code != "history_run_exists":
            raise
        raise Refusal("history_run_exists", err.message, run_exists_remedies(path)) from err
    if not s.resume:
        return Store(run, ring, writer, writer, path, 0)
    step = int(writer.run.resumed_at_step or 0)
    seen = resumed_examples_seen(step, writer.resumed_after, s.resume_examples_seen)
    return Store(writer.run, ring, writer, writer, path, step, seen)


# ------------------------------------------------------------------ (resume)
def artifact_run_id(path: str | Path) -> str | None:
    """The run id of the artifact in ``path`` (``None`` when there is none yet)."""
    manifest = Path(path) / "manifest.json"
    if not manifest.exists():
        return None
    segments = read_json(manifest, "manifest").get("segments") or [{}]
    run_id = segments[-1].get("run_id")
    return run_id if isinstance(run_id, str) else None


def resumed_examples_seen(
    step: int, before: StepBlockRecord | None, declared: int | None
) -> int | None:
    """``examples_seen`` at the resume ``step``: declared, or the committed block just before.

    Parameters
    ----------
    step
        The first step of the new segment.
    before
        The last committed step block before ``step`` (``None``: there is none).
    declared
        The user's ``resume_examples_seen`` (wins when given).

    Returns
    -------
    int or None
        ``0`` at step 0; the block's value when it is exactly ``step - 1``; otherwise ``None``
        (the steps in between were never committed, so the count is unknown, never restarted).
    """
    if declared is not None:
        return int(declared)
    if step == 0:
        return 0
    if before is None or before.optimizer_step != step - 1:
        return None
    return before.examples_seen
