"""The step boundary: a finished step's rows become its record and reach the destination.

At the end of every step the collector hands its :class:`~stepscope.collect.stepstate.StepState`
to :meth:`StepBoundary.write`, which

1. copies the staged rows to the host (one copy per buffer; none when no stream is due),
2. drains the user's scalars and branch masks of the step and assembles one
   :class:`~stepscope.history.ObservationBatch` per due stream (rows of inactive branches
   withheld),
3. builds the :class:`~stepscope.history.StepBlockRecord` (``examples_seen`` accumulated, the
   optimizer facts of :func:`~stepscope.collect.stepstate.step_truth`),
4. closes the step's clocks (``clock/*`` scalars) and, during an ``"auto"`` cadence warm-up,
   feeds the :class:`~stepscope.collect.warmup.WarmupMeter` (``cadence/*`` scalars),
5. writes the step (artifact, or RAM ring and run-log rows).

:meth:`StepBoundary.close` flushes what is left when the collector closes.

:meth:`StepBoundary.publish` then puts the step on the event stream; the collector calls it
last, once the next step has begun, so that a check raising there leaves it ready.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepscope.collect import stepstate
from stepscope.collect.activations import ActivationSites
from stepscope.collect.reduce import Reducer
from stepscope.collect.settings import Cadence, WatchSettings
from stepscope.collect.sites import SiteRow
from stepscope.collect.stepstate import StepState, StreamPlan, assemble_batches, step_truth
from stepscope.collect.store import Store
from stepscope.collect.warmup import WarmupMeter
from stepscope.errors import Refusal
from stepscope.events.convert import events_from_step
from stepscope.events.live import LiveStream, open_live
from stepscope.history import (
    CloseReport,
    ObservationBatch,
    StepBlockRecord,
    StepProvenance,
    StepTruth,
)
from stepscope.runlog import (
    Drained,
    PendingStep,
    StepClock,
    clock_scalars,
    close_artifact,
    withhold_inactive,
    write_clock_rows,
)

__all__ = ["StepBoundary", "WrittenStep"]

#: what a step that logged nothing drains (never mutated: the boundary copies its scalars)
NOTHING_LOGGED = Drained()


@dataclass(frozen=True)
class WrittenStep:
    """What :meth:`StepBoundary.write` wrote for one step."""

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
    store, rows
        The destination and its run-log row sink.
    meter
        The auto-cadence warm-up meter (``None`` without ``cadence="auto"``).
    settings
        The collector's settings (update sample size, event stream, descriptor).
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
        rows: Any,
        meter: WarmupMeter | None,
        settings: WatchSettings,
    ) -> None:
        self.streams, self.by_stream, self.sites, self.reducer = streams, by_stream, sites, reducer
        self.pending, self.clock, self.store, self.rows = pending, clock, store, rows
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
        self.sites.register_not_run(state)  # never ran so far: recorded site_absent
        hist_step = any(state.hist_due.values())
        any_due = any(state.spine_due.values())  # nothing due: no copy at all this step
        host = self.reducer.to_host(hist_step) if any_due else {}
        fast = stepstate.FAST_BOUNDARY
        # nothing logged this step (the common case): nothing to drain
        drained = self.pending.drain(state.step) if self.pending or not fast else NOTHING_LOGGED
        scalars = dict(drained.scalars)
        inactive = {a.name for a in drained.activity if not a.ran}
        batches: list[ObservationBatch] = []
        if any_due or not fast:  # nothing due: no batch (none is assembled)
            batches = assemble_batches(
                state,
                self.streams,
                self.by_stream,
                host,
                self.reducer.stagings,
                scaler,
                self.settings.update_sample_size,
                self._plans if fast else None,
            )
            batches = withhold_inactive(batches, self.store.catalog.sites, inactive)
        if examples_seen is not None:  # None: unknown since a resume (never restarted at 0)
            examples_seen += state.examples or 0
        block = StepBlockRecord(
            optimizer_step=state.step,
            examples_seen=examples_seen if state.examples is not None else None,
            epoch=state.epoch,
            provenance=provenance,
            truth=step_truth(
                state, scaler, provenance, optimizer_known, self._truths if fast else None
            ),
            wall_time=time.time(),
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
                # what one commit costs (the warm-up steps' rows), spread over the steps
                # between commits by the decision; it is charged to the next step like a write
                t0 = time.perf_counter()
                writer.commit()
                self.meter.commit_s = time.perf_counter() - t0
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
        late = [r for r in clock_rows if r.step != state.step]  # CUDA: resolved late
        self.store.write_step(self.rows, block, batches, scalars, drained.dated, late)
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
                self.rows.write_scalar(name, at, value)
        self.pending.clear()
        if self.live is not None:
            self.live.close()  # sends what is queued; never raises
        write_clock_rows(self.rows, self.clock.resolve(block=True))
        if self.store.writer is None:
            return None
        return close_artifact(self.rows, self.clock.summary(closed=True))

    def publish(
        self,
        written: WrittenStep,
        merged: tuple[StepBlockRecord, list[ObservationBatch]] | None = None,
    ) -> None:
        """Put a written step on the event stream (skipped without an enabled subscriber).

        ``merged``: rank 0 of a live merge publishes the ranks' merged rows instead of its own.
        """
        sites, descriptor = self.store.catalog.sites, self.settings.descriptor
        block, batches = merged or (written.block, written.batches)
        if self.live is not None:  # queued for the streaming thread; never waits
            self.live.submit(block, batches, sites, descriptor, written.scalars)
        stream = self.settings.event_stream
        if stream is not None and stream.active:
            stream.publish(events_from_step(block, batches, sites, descriptor, written.scalars))
