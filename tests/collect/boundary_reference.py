"""The step boundary's batch assembly as it was before its per-stream plans: the reference.

:func:`reference_assemble_batches` rebuilds every index array, presence vector and note of a due
stream from the rows at every step, one row at a time, exactly as the collector did before
:class:`~stepscope.collect.write.StreamPlan` cached them. The boundary test
(``test_boundary_equivalence.py``) records the same run through it (with every fast path of the
boundary switched off) and through the production path, and compares every stored value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stepscope.collect.sites import SiteRow
from stepscope.collect.step import StepState, scale_grad_of
from stepscope.collect.write import ABSENT, FAILED, OBSERVED, PHASE, UNSUPPORTED
from stepscope.history import ObservationBatch
from stepscope.history.vocab import UPDATE_SAMPLED, Phase, ScaleGrad, Stream
from stepscope.stats import SPINE_WIDTH


def reference_assemble_batches(
    state: StepState,
    streams: Sequence[str],
    by_stream: Mapping[str, Sequence[SiteRow]],
    host: Mapping[Any, tuple[np.ndarray, np.ndarray | None]],
    stagings: Mapping[Any, Any],
    scaler: Any,
    update_sample_size: int,
    plans: Any = None,
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
