"""Assembling per-parameter records from moments, norms, snapshots and the last update.

Example
-------
>>> zero_fraction((3, 12, 0, 12), 0), zero_fraction(None, 0)
(0.25, None)
"""

from __future__ import annotations

from typing import Any

from stepscope.probe.recorder import BlockRecord
from stepscope.probe.state import ParamSnapshot, StepUpdate


def zero_fraction(zeros: tuple[int, int, int, int] | None, offset: int) -> float | None:
    """``zeros[offset] / zeros[offset + 1]`` or ``None`` when nothing was counted."""
    if zeros is None or zeros[offset + 1] == 0:
        return None
    return zeros[offset] / zeros[offset + 1]


def zero_validity(zeros: tuple[int, int, int, int] | None) -> dict[str, int | None]:
    """The counts behind both zero fractions (``None`` when the layer was not measured)."""
    keys = (
        "activation_zero_count",
        "activation_entries",
        "backprop_zero_count",
        "backprop_entries",
    )
    return dict(zip(keys, zeros if zeros is not None else (None,) * 4))


def block_record(
    key: str,
    moments: Any,
    param_l2: dict[str, float],
    from_init: dict[str, float],
    since: dict[str, float],
    snapshot: ParamSnapshot | None,
    step: int,
    upd: StepUpdate | None,
) -> BlockRecord:
    """Combine gradient moments and parameter distances of one parameter into a record."""
    validity = dict(moments.validity)
    # the interval's start step, where a delta since that snapshot was measured
    start = snapshot.optimizer_step if snapshot is not None and key in since else None
    has_delta = start is not None
    update = upd.update_norm.get(key) if upd else None
    before = upd.param_norm_before.get(key) if upd else None
    ratio = update / before if update is not None and before else None
    validity.update(
        init_snapshot_present=key in from_init,
        delta_snapshot_present=has_delta,
        update_present=update is not None,
        update_ratio_denominator=before,
        update_steps_verified=upd.steps_verified if upd else None,
    )
    return BlockRecord(
        **moments.moment_fields(),
        param_l2=param_l2[key],
        displacement_from_init=from_init.get(key),
        delta_since_snapshot=since.get(key) if has_delta else None,
        delta_since_snapshot_start_step=start,
        delta_since_snapshot_end_step=int(step) if has_delta else None,
        delta_since_snapshot_interval_steps=int(step) - start if start is not None else None,
        update=update,
        update_ratio=ratio,
        update_step=upd.optimizer_step_before if upd is not None and update is not None else None,
        validity=validity,
    )
