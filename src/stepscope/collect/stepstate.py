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
from stepscope.collect.sites import Row
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
        """A user scalar for this step (batched to the host at the step boundary)."""
        self._c.log(name, value, step)


def step_truth(
    state: StepState, scaler: Any, provenance: StepProvenance, optimizer_known: bool
) -> StepTruth:
    """The optimizer facts of a finished step (``unknown`` wherever they were not seen)."""
    if state.skipped and not state.stepped:
        applied = Tristate.NO  # the scaler ended the iteration without an optimizer step
    elif optimizer_known and provenance is StepProvenance.EXPLICIT:
        applied = Tristate.of(state.stepped)
    else:
        applied = Tristate.YES if state.stepped else Tristate.UNKNOWN
    return StepTruth(
        applied=applied,
        scale=as_scale(state.scale_in_force),
        unscaled=Tristate.of(state.scale_grad == "unscaled")
        if state.scale_grad != "unknown"
        else Tristate.UNKNOWN,
        clipped=Tristate.of(state.clipped),
        micro_batches=state.micro_batches,
    )


def assemble_batches(
    state: StepState,
    streams: Sequence[str],
    by_stream: Mapping[str, Sequence[Row]],
    host: Mapping[Any, tuple[np.ndarray, np.ndarray | None]],
    stagings: Mapping[Any, Any],
    scaler: Any,
    update_sample_size: int,
) -> list[ObservationBatch]:
    """One batch per due stream: every registered row of it, with its presence.

    A row is ``observed`` when a hook wrote it on some device, ``unsupported`` when a hook saw it
    but could not reduce it (the reason is a per-row disclosure ``unsupported:<reason>``),
    ``capture_failed`` when the reduction raised (disclosure ``capture_failed:<exception>``;
    the error never reaches the training step), and ``site_absent`` otherwise (the site did not
    run, or its gradient was ``None``).
    """
    out = []
    for stream in streams:
        if not state.spine_due[stream]:
            continue
        rows = [r for r in by_stream[stream] if r.site_id is not None]
        if not rows:
            continue
        if stream == "update" and not state.stepped:
            continue  # a skipped optimizer step records no update at all
        idx = np.array([r.index for r in rows])
        spines = np.full((len(rows), SPINE_WIDTH), np.nan)
        presence = np.full(len(rows), ABSENT, dtype=np.uint8)
        hist_rows, hists = [], []
        for dev, (sp, hi) in host.items():
            st = stagings[dev]
            fired = st.fired[idx] > 0
            spines[fired] = sp[idx[fired]]
            presence[fired] = OBSERVED
            if hi is not None and state.hist_due[stream]:
                for k in np.flatnonzero(st.hist_fired[idx]):
                    if rows[k].index in state.failed:
                        continue
                    hist_rows.append(k)
                    hists.append(hi[idx[k]])
        notes: list[tuple[str, ...]] = []
        # the common case: no row of the step failed, was unsupported or carries a note, and
        # only update rows disclose anything (their sample size): every note is empty
        plain = stream != "update" and not (state.failed or state.unsupported or state.row_notes)
        for j, r in enumerate(() if plain else rows):
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
            note: tuple[str, ...] = ()
            if presence[j] == OBSERVED:
                extra = state.row_notes.get(r.index)
                note = () if extra is None else (extra,)
                if r.update_index is not None:  # a sample of the parameter: an estimate
                    note = (*note, f"{UPDATE_SAMPLED}:{len(r.update_index)}")
            notes.append(note)
        disclosures: tuple[str, ...] = ()
        scale_grad = scale_grad_of(stream, state.scale_grad, state.explicit, scaler)
        out.append(
            ObservationBatch(
                Stream(stream),
                PHASE[stream]
                if not (stream == "gradient" and not state.stepped)
                else Phase.BACKWARD,
                np.array([r.site_id for r in rows]),
                presence,
                spines,
                hist_rows=np.array(hist_rows, dtype=np.int64) if hists else None,
                histograms=np.stack(hists) if hists else None,
                scale_grad=None if scale_grad is None else ScaleGrad(scale_grad),
                disclosures=disclosures,
                row_disclosures=tuple(notes) if any(notes) else None,
            )
        )
    return out
