"""Loss-scaler inspection: is a gradient read now scaled or unscaled, and what scale is in force.

Only public facts of a ``torch.amp.GradScaler`` are read (its per-optimizer stage and
``get_scale()``); nothing is changed.
"""

from __future__ import annotations

from typing import Any

import torch


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
