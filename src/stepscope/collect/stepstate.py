"""Step assembly: what one step has seen, the user's step handle, and the step's batches.

The collector's hooks fill a :class:`StepState`; at the step boundary :func:`assemble_batches`
turns the staged rows (already copied to the host) into one
:class:`~stepscope.history.ObservationBatch` per due stream, and :func:`step_truth` states the
optimizer facts of the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stepscope.collect.scaler import as_scale, scale_grad_of, scale_in_force, update_marker
from stepscope.collect.sites import SiteRow
from stepscope.history import ObservationBatch, Presence, StepProvenance, StepTruth, Tristate
from stepscope.history.batch import code_of
from stepscope.history.vocab import UPDATE_SAMPLED, Phase, ScaleGrad, Stream
from stepscope.stats import SPINE_WIDTH

OBSERVED, ABSENT = code_of(Presence.OBSERVED), code_of(Presence.SITE_ABSENT)
UNSUPPORTED, FAILED = code_of(Presence.UNSUPPORTED), code_of(Presence.CAPTURE_FAILED)
PHASE: dict[str, Phase] = {
    "activation": Phase.FORWARD,
    "activation_grad": Phase.BACKWARD,
    "gradient": Phase.PRE_STEP,
    "parameter": Phase.POST_STEP,
    "update": Phase.POST_STEP,
}

#: The step boundary's fast paths (cached per-stream plans, batches built without re-checking
#: what the boundary constructed itself, no host work on steps where nothing is due). ``False``
#: takes the plain path everywhere; a test records the same run both ways and compares.
FAST_BOUNDARY = True


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
    carried_s: float = 0.0  # the previous step's write/commit/publish, charged to this step
    stream_s: dict[str, float] = field(default_factory=dict)  # reduction seconds per stream
    activations_quiet: bool = False  # neither activation stream is due: hooks return at once
    hook_s: float = 0.0  # seconds inside the collector's hooks not charged as telemetry
    hook_calls: int = 0  # module and optimizer hook calls (each also pays torch's dispatch)
    unsupported: dict[int, str] = field(default_factory=dict)  # row index -> reason
    row_notes: dict[int, str] = field(default_factory=dict)  # row index -> extra disclosure
    failed: dict[int, str] = field(default_factory=dict)  # row index -> exception type
    structure_checked: bool = False  # model surgery looked for this step
    grad_rows: set[int] = field(default_factory=set)  # gradient rows read this step
    param_rows: set[int] = field(default_factory=set)  # parameter rows read this step
    optimizer_steps: dict[int, int] = field(default_factory=dict)  # id(watch) -> step() calls
    stepped_params: set[int] = field(default_factory=set)  # ids of shared parameters stepped
    skipped: bool = False  # an iteration ended (scaler.update) without an optimizer step
    scale_in_force: Any = None  # loss scale of this iteration (tensor or float; None: none)
    scaler_marker: Any = None  # the scaler's update marker when the iteration began

    def open_transaction(self, examples: int | None, epoch: int | None, scaler: Any) -> None:
        """An explicit transaction opens on this step: its declared facts, and the scaler's
        scale and update marker before ``scaler.update()`` changes them."""
        self.explicit, self.examples, self.epoch = True, examples, epoch
        self.scale_in_force = scale_in_force(scaler)
        self.scaler_marker = None if scaler is None else update_marker(scaler)

    def charge(self, stream: str | None, seconds: float) -> None:
        """Count ``seconds`` of telemetry work (for ``stream``, when it is one stream's)."""
        self.telemetry_s += seconds
        if stream is not None:
            self.stream_s[stream] = self.stream_s.get(stream, 0.0) + seconds


class StepTransaction:
    """Handle yielded by :meth:`HistoryCollector.step`; lets the user declare step facts."""

    def __init__(self, collector: Any, state: StepState) -> None:
        self._c, self._s = collector, state

    @property
    def step(self) -> int:
        """The optimizer step being recorded (0-based)."""
        return self._s.step

    def declare(
        self,
        *,
        clipped: bool | None = None,
        micro_batches: int | None = None,
        examples: int | None = None,
    ) -> None:
        """Record facts the collector cannot see (gradient clipping, micro-batch count).

        ``examples`` replaces the count given to :meth:`HistoryCollector.step` (a trainer
        callback knows it only after the step's last micro-batch).
        """
        if clipped is not None:
            self._s.clipped = bool(clipped)
        if micro_batches is not None:
            self._s.micro_batches = int(micro_batches)
        if examples is not None:
            self._s.examples = int(examples)

    def log(self, name: str, value: float | torch.Tensor, step: int | None = None) -> None:
        """A user scalar for this step (batched to the host at the step boundary).

        Called after the step's ``with`` block ended, it warns once and records the value at
        this step (:mod:`stepscope.collect.misuse`).
        """
        if step is None and self._c._next_step > self._s.step:  # this step is written already
            self._c._misuse.log_after_close(name, self._s.step)
            step = self._s.step
        self._c.log(name, value, step)


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
        applied = Tristate.of(state.stepped)
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
    retires a row), a row's series changes (discovery, surgery, ``site_absent`` registration)
    or an update row's sampled indices change; it holds the lists and index tensors it was
    built from, so their identities cannot be reused while it lives.
    """

    rows_list: Sequence[SiteRow]  # the collector's row list of the stream it was built from
    site_key: tuple[int | None, ...]  # every row's series id when built
    sample_key: tuple[int, ...]  # ids of the update rows' sampled indices when built
    samples: tuple[Any, ...]  # those index tensors (held: their ids stay unique)
    rows: list[SiteRow]  # the rows with a series, in order
    idx: np.ndarray  # their staging rows (int64)
    site_ids: np.ndarray  # their series ids (int32, read-only: shared by every step's batch)
    sampled: tuple[tuple[str, ...], ...]  # each row's ``update_sampled:<k>`` note, or ()
    any_sampled: bool
    stream: Stream


def stream_plan(plans: dict[str, StreamPlan], stream: str, rows_list: Sequence[SiteRow]) -> StreamPlan:
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
    With :data:`FAST_BOUNDARY` the batches are built by
    :meth:`~stepscope.history.ObservationBatch.trusted` (their arrays are made here, of the
    right kinds, one row per series); otherwise they are checked like any other batch.
    """
    out = []
    plans = {} if plans is None else plans
    fast = FAST_BOUNDARY
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
        make = ObservationBatch.trusted if fast else ObservationBatch
        out.append(
            make(
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
