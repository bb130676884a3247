"""The step: what one step has seen, its handle, its loss-scaler facts and telemetry window.

Step assembly: what one step has seen, the user's step handle, and the step's batches.

The collector's hooks fill a :class:`StepState`; at the step boundary :func:`assemble_batches`
turns the staged rows (already copied to the host) into one
:class:`~stepscope.history.ObservationBatch` per due stream, and :func:`step_truth` states the
optimizer facts of the step.

Loss-scaler inspection: is a gradient read now scaled or unscaled, and what scale is in force.

Only public facts of a ``torch.amp.GradScaler`` are read (its per-optimizer stage and
``get_scale()``); nothing is changed.

The telemetry window: work the user does *for* telemetry, outside the collector's hooks.

``with collector.telemetry(): ...`` brackets work such as a dense probe's measurement, its
serialisation, or a parameter snapshot. While a window is open:

* its wall-clock seconds are charged to the current step's ``clock/telemetry_seconds`` (the
  step being recorded, or the next one between steps), never to the isolated training seconds
  ``clock/training_seconds`` of a step transaction it runs inside;
* the collector's hooks record nothing: forwards, backwards and optimizer steps run inside the
  window never reach the step's activation, gradient, parameter or update rows.

Windows nest; only the outermost one is timed.

Example
-------
>>> import torch, stepscope as ss
>>> model = torch.nn.Linear(4, 2)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with ss.HistoryCollector(model, sites="Linear") as c:
...     with c.step(opt, examples=8):
...         model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
...         with c.telemetry():
...             _ = model(torch.randn(100, 4))  # a probe forward: not folded into the step
>>> int(c.last_batches[0].spines[0, 0])  # the activation row counts the 8x2 training output
16
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stepscope.collect.sites import Row
from stepscope.history import ObservationBatch, Presence, StepProvenance, StepTruth, Tristate
from stepscope.history.batch import code_of
from stepscope.history.vocab import UPDATE_SAMPLED, Phase, ScaleGrad, Stream
from stepscope.stats import SPINE_WIDTH

__all__ = ["TelemetryWindow"]

# ------------------------------------------------------------------ (stepstate)
OBSERVED, ABSENT = code_of(Presence.OBSERVED), code_of(Presence.SITE_ABSENT)
UNSUPPORTED, FAILED = code_of(Presence.UNSUPPORTED), code_of(Presence.CAPTURE_FAILED)
PHASE: dict[str, Phase] = {
    "activation": Phase.FORWARD,
    "activation_grad": Phase.BACKWARD,
    "gradient": Phase.PRE_STEP,
    "parameter": Phase.POST_STEP,
    "update": Phase.POST_STEP,
}


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

    rows_list: Sequence[Row]  # the collector's row list of the stream it was built from
    site_key: tuple[int | None, ...]  # every row's series id when built
    sample_key: tuple[int, ...]  # ids of the update rows' sampled indices when built
    samples: tuple[Any, ...]  # those index tensors (held: their ids stay unique)
    rows: list[Row]  # the rows with a series, in order
    idx: np.ndarray  # their staging rows (int64)
    site_ids: np.ndarray  # their series ids (int32, read-only: shared by every step's batch)
    sampled: tuple[tuple[str, ...], ...]  # each row's ``update_sampled:<k>`` note, or ()
    any_sampled: bool
    stream: Stream


def stream_plan(plans: dict[str, StreamPlan], stream: str, rows_list: Sequence[Row]) -> StreamPlan:
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
    by_stream: Mapping[str, Sequence[Row]],
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


# ------------------------------------------------------------------ (scaler)
def grad_scale_status(scaler: Any, explicit: bool) -> str:
    """``scaled``/``unscaled``/``unknown`` for parameter gradients read right now.

    Outside an explicit transaction the collector cannot know (``unknown``); inside one without a
    scaler the gradients are unscaled; with a scaler, ``GradScaler.step`` unscales before it
    calls ``optimizer.step``, which its per-optimizer stage records.
    """
    if not explicit:
        return "unknown"
    if scaler is None:
        return "unscaled"  # the explicit transaction declared no loss scaling
    try:
        stages = [str(s.get("stage")) for s in scaler._per_optimizer_states.values()]
        return "unscaled" if any("UNSCALED" in s or "STEPPED" in s for s in stages) else "scaled"
    except AttributeError:
        return "unknown"


def scale_grad_of(stream: str, grad_status: str, explicit: bool, scaler: Any) -> str | None:
    """The ``scale_grad`` field of a stream's batch (``None`` for non-gradient streams)."""
    if stream == "gradient":
        return grad_status
    if stream == "activation_grad":  # taken during backward: scaled iff a scaler scaled the loss
        if not explicit:
            return "unknown"
        return "scaled" if scaler is not None else "unscaled"
    return None


def loss_scale(scaler: Any) -> float | None:
    """The scaler's current scale (``None`` without a scaler)."""
    return None if scaler is None else float(scaler.get_scale())


def scale_in_force(scaler: Any) -> torch.Tensor | float | None:
    """The scale that multiplies this iteration's loss, read without a host sync.

    Taken when the iteration begins (before ``scaler.update()`` changes it): a device copy of
    the scale tensor, the initial scale before the first ``scaler.scale``, ``1.0`` for a
    disabled scaler, ``None`` without a scaler. :func:`as_scale` turns it into a float.
    """
    if scaler is None:
        return None
    if hasattr(scaler, "is_enabled") and not scaler.is_enabled():
        return 1.0
    current = getattr(scaler, "_scale", None)
    if isinstance(current, torch.Tensor):
        return current.detach().clone()
    init = getattr(scaler, "_init_scale", None)
    return float(init) if init is not None else float(scaler.get_scale())


def as_scale(value: torch.Tensor | float | None) -> float | None:
    """A :func:`scale_in_force` value as a float (one host read at the step boundary)."""
    return None if value is None else float(value)


def update_marker(scaler: Any) -> Any:
    """An object that changes identity at every ``scaler.update()`` (its per-optimizer states).

    ``GradScaler.update`` replaces ``_per_optimizer_states`` with a fresh dict, so a changed
    marker means an iteration ended, even when ``GradScaler.step`` skipped ``optimizer.step``
    (and with it the optimizer's hooks) because of an inf/NaN gradient.
    """
    return getattr(scaler, "_per_optimizer_states", None)


# ------------------------------------------------------------------ (telemetry)
class TelemetryWindow:
    """Depth and timing of nested ``telemetry()`` windows of one collector.

    Parameters
    ----------
    charge
        Called with the seconds of each outermost window when it closes.
    """

    def __init__(self, charge: Callable[[float], None]) -> None:
        self._charge = charge
        self.depth = 0

    @property
    def open(self) -> bool:
        """Whether a window is open (the hooks must record nothing)."""
        return self.depth > 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        """Open a window; on exit (also by an exception) charge its seconds and close it."""
        t0 = time.perf_counter()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self._charge(time.perf_counter() - t0)
