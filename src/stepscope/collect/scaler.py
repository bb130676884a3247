"""Loss-scaler inspection: is a gradient read now scaled or unscaled, and what scale is in force.

Only public facts of a ``torch.amp.GradScaler`` are read (its per-optimizer stage and
``get_scale()``); nothing is changed.
"""

from __future__ import annotations

from typing import Any


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
