"""The current step's user scalars and branch masks, moved to the host in one transfer.

:meth:`PendingStep.add_scalar` and :meth:`PendingStep.add_mask` only keep references: a tensor
value stays on its device (detached), a mask becomes a device-side count of its nonzero entries.
:meth:`PendingStep.drain` stacks every pending tensor of a device into one float64 vector and
copies it to the host once — never one ``.item()`` per call.

Example
-------
>>> import torch
>>> p = PendingStep()
>>> p.add_scalar("loss", torch.tensor(0.25))
>>> p.add_scalar("lr", 0.1)
>>> p.add_mask("blocks.1", torch.tensor([True, False, True, True]), nominal_macs_per_unit=10.0)
>>> d = p.drain(step=7)
>>> d.scalars["loss"], d.scalars["lr"]
(0.25, 0.1)
>>> a = d.activity[0]
>>> (a.active_units, a.total_units, a.active_fraction, a.nominal_skipped_macs)
(3, 4, 0.75, 10.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from stepscope import transfer
from stepscope.errors import Refusal
from stepscope.history.inputs import check_step
from stepscope.runlog.names import (
    BRANCH_PREFIX,
    BranchField,
    branch_scalar,
    check_label,
    check_scalar_name,
    parse_branch_scalar,
)

Value = float | int | bool | torch.Tensor | np.ndarray | np.generic


@dataclass(frozen=True)
class BranchActivity:
    """Realised activity of one branch over one step.

    ``active_units`` counts nonzero mask entries (an entry is one scheduled unit: an example of a
    stochastic-depth block, a token routed to an expert, a dropped-out unit), ``total_units`` all
    entries, both exact. ``nominal_skipped_macs`` is ``(total - active) * nominal_macs_per_unit``:
    arithmetic the schedule nominally skipped, *not* measured time or energy saved (``None`` when
    no per-unit MAC count was declared).
    """

    name: str
    step: int
    active_units: int
    total_units: int
    nominal_macs_per_unit: float | None = None

    @property
    def active_fraction(self) -> float:
        """``active_units / total_units`` (a mask is never empty)."""
        return self.active_units / self.total_units

    @property
    def ran(self) -> bool:
        """Whether any unit of the branch was active this step."""
        return self.active_units > 0

    @property
    def nominal_skipped_macs(self) -> float | None:
        """Nominal multiply-accumulates skipped; ``None`` without a declared per-unit count."""
        if self.nominal_macs_per_unit is None:
            return None
        return (self.total_units - self.active_units) * self.nominal_macs_per_unit

    def scalar_rows(self) -> dict[str, float]:
        """The reserved ``branch/<name>/<field>`` scalar rows of this record."""
        out = {
            branch_scalar(self.name, BranchField.ACTIVE_FRACTION): self.active_fraction,
            branch_scalar(self.name, BranchField.ACTIVE_UNITS): float(self.active_units),
            branch_scalar(self.name, BranchField.TOTAL_UNITS): float(self.total_units),
        }
        skipped = self.nominal_skipped_macs
        if skipped is not None:
            out[branch_scalar(self.name, BranchField.NOMINAL_SKIPPED_MACS)] = skipped
        return out


@dataclass(frozen=True)
class Drained:
    """What one step boundary moved to the host."""

    scalars: dict[str, float] = field(default_factory=dict)  # current step, incl. branch rows
    dated: tuple[tuple[str, int, float], ...] = ()  # (name, step, value) for other steps
    activity: tuple[BranchActivity, ...] = ()


def _refuse_clash(scalar: str, branch: str) -> None:
    raise Refusal(
        "runlog_name_invalid",
        f"{scalar!r} is written by log_mask({branch!r}) in this step; it cannot also be logged.",
        ["log your own branch quantity under another field name (e.g. survival_probability)"],
    )


def _host_or_tensor(value: Any, what: str) -> float | torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise Refusal(
                "runlog_value_invalid",
                f"{what} is a tensor of shape {tuple(value.shape)} ({value.dtype}); "
                "a logged value is one real number.",
                ["reduce it first (e.g. .mean())"],
            )
        return value  # detached and reshaped at the boundary, in one stacked op
    if isinstance(value, np.ndarray) and value.size == 1:
        value = value.reshape(()).item()
    if isinstance(value, (bool, int, float, np.integer, np.floating, np.bool_)):
        try:
            return float(value)
        except OverflowError:
            raise Refusal(
                "runlog_value_invalid", f"{what} does not fit a float64.", ["log a float"]
            ) from None
    raise Refusal(
        "runlog_value_invalid",
        f"{what} is {type(value).__name__}, not a real number or a one-element tensor.",
        ["pass a float or a 0-d tensor", "do not log a value that was not measured"],
    )


class PendingStep:
    """Per-step buffer of scalars and masks (host bookkeeping; tensors stay on their device)."""

    def __init__(self) -> None:
        self._scalars: dict[tuple[str, int | None], float | torch.Tensor] = {}
        self._masks: dict[str, tuple[list[Any], int, float | None]] = {}

    def __bool__(self) -> bool:
        return bool(self._scalars or self._masks)

    def add_scalar(self, name: str, value: Value, step: int | None = None) -> None:
        """Keep ``value`` for ``name`` at ``step`` (``None``: the step being drained next).

        A second value for the same name and step replaces the first (last write wins).
        """
        check_scalar_name(name)
        if step is None and name.startswith(BRANCH_PREFIX):
            parsed = parse_branch_scalar(name)
            if parsed is not None and parsed[0] in self._masks:
                _refuse_clash(name, parsed[0])
        if step is not None:  # at log() time, never at the next step boundary
            step = check_step(step, "step", "runlog_step_invalid")
        self._scalars[(name, step)] = _host_or_tensor(value, f"scalar {name!r}")

    def add_mask(
        self,
        name: str,
        active_mask: Any,
        *,
        branch_dim: int | None = None,
        nominal_macs_per_unit: float | None = None,
    ) -> None:
        """Count the nonzero (active) entries of ``active_mask`` for branch ``name``.

        With ``branch_dim``, index ``i`` along that dimension is its own branch ``f"{name}.{i}"``
        (e.g. experts of a mixture-of-experts layer; ``ModuleList`` children are named so).
        Several masks of one branch in one step (micro-batches) add their counts exactly.
        """
        check_label(name, "branch name", 200)
        if nominal_macs_per_unit is not None and not (
            isinstance(nominal_macs_per_unit, (int, float))
            and not isinstance(nominal_macs_per_unit, bool)
            and math.isfinite(nominal_macs_per_unit)
            and nominal_macs_per_unit >= 0
        ):
            raise Refusal(
                "runlog_mask_invalid", "nominal_macs_per_unit must be finite and >= 0.", []
            )
        mask = (
            active_mask if isinstance(active_mask, torch.Tensor) else torch.as_tensor(active_mask)
        )
        if mask.numel() == 0 or mask.is_complex():
            raise Refusal(
                "runlog_mask_invalid",
                f"mask of branch {name!r} is empty or complex (shape {tuple(mask.shape)}).",
                ["pass one boolean (or 0/1) entry per scheduled unit"],
            )
        mask = mask.detach()
        # a NaN entry is neither active nor inactive (count_nonzero would call it active); a
        # floating mask is checked here (one sync: pass a bool mask to stay asynchronous)
        if mask.is_floating_point() and bool(torch.isnan(mask).any()):
            raise Refusal(
                "runlog_mask_invalid",
                f"mask of branch {name!r} holds NaN entries (neither active nor inactive).",
                ["pass a boolean mask, e.g. mask.isfinite() & (mask != 0)"],
            )
        if branch_dim is None:
            self._add_count(name, mask.count_nonzero(), mask.numel(), nominal_macs_per_unit)
            return
        if (
            isinstance(branch_dim, bool)
            or not isinstance(branch_dim, int)
            or not -mask.dim() <= branch_dim < mask.dim()
        ):
            raise Refusal(
                "runlog_mask_invalid",
                f"branch_dim {branch_dim!r} is not a dimension of the mask of branch {name!r} "
                f"(shape {tuple(mask.shape)}).",
                [f"pass branch_dim= an int in {-mask.dim()}..{mask.dim() - 1}"],
            )
        dim = branch_dim % mask.dim()
        others = [d for d in range(mask.dim()) if d != dim]
        counts = mask.count_nonzero(dim=others) if others else (mask != 0).to(torch.int64)
        per_branch = mask.numel() // mask.shape[dim]
        for i in range(mask.shape[dim]):
            self._add_count(f"{name}.{i}", counts[i], per_branch, nominal_macs_per_unit)

    def _add_count(self, name: str, active: Any, total: int, macs: float | None) -> None:
        for kind in BranchField:
            if (branch_scalar(name, kind), None) in self._scalars:
                _refuse_clash(branch_scalar(name, kind), name)
        parts, before, _ = self._masks.get(name, ([], 0, macs))
        self._masks[name] = ([*parts, active], before + total, macs)

    def drain(self, step: int) -> Drained:
        """Move everything pending to the host (one transfer per device) and clear the buffer."""
        if not self:
            return Drained()
        tensors: list[torch.Tensor] = []
        for v in self._scalars.values():
            if isinstance(v, torch.Tensor):
                tensors.append(v)
        for parts, _, _ in self._masks.values():
            tensors.extend(p for p in parts if isinstance(p, torch.Tensor))
        host = _to_host_all(tensors)
        it = iter(host)
        scalars: dict[str, float] = {}
        dated: list[tuple[str, int, float]] = []
        for (name, at), v in self._scalars.items():
            value = next(it) if isinstance(v, torch.Tensor) else float(v)
            if at is None or at == step:
                scalars[name] = value
            else:
                dated.append((name, at, value))
        activity = []
        for name, (parts, total, macs) in self._masks.items():
            active = sum(int(next(it)) if isinstance(p, torch.Tensor) else int(p) for p in parts)
            rec = BranchActivity(name, step, active, total, macs)
            activity.append(rec)
            rows = rec.scalar_rows()
            clash = sorted(set(rows) & set(scalars))  # only an explicit step=<this step> row
            if clash:
                self._scalars, self._masks = {}, {}
                _refuse_clash(clash[0], name)
            scalars.update(rows)
        self._scalars, self._masks = {}, {}
        return Drained(scalars, tuple(dated), tuple(activity))

    def clear(self) -> None:
        """Forget everything pending (a step that will not be written)."""
        self._scalars, self._masks = {}, {}


_NUMPY_EXACT = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool)


def _to_host_all(tensors: list[torch.Tensor]) -> list[float]:
    """Values of one-element tensors, in order, with one stacked copy per device."""
    if not tensors:
        return []
    device = tensors[0].device
    if all(t.device == device for t in tensors):  # the common case: one device
        return _one_transfer(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    out = [0.0] * len(tensors)  # every slot is overwritten below
    for idx in by_device.values():
        for i, v in zip(idx, _one_transfer([tensors[i] for i in idx])):
            out[i] = v
    return out


def _one_transfer(tensors: list[torch.Tensor]) -> list[float]:
    if len(tensors) == 1:
        stacked = tensors[0]  # the transfer detaches; numel() == 1 was checked when logged
    else:
        parts = [t.detach().reshape(()) for t in tensors]
        if any(p.dtype != parts[0].dtype for p in parts):  # torch would promote int64+float32
            parts = [p.to(torch.float64) for p in parts]  # to float32; float64 keeps both
        stacked = torch.stack(parts)
    if stacked.dtype not in _NUMPY_EXACT:
        stacked = stacked.detach().to(torch.float64)  # half/bfloat16 have no exact numpy twin
    # the counted transfer, looked up at each call (tests patch it)
    return [float(v) for v in transfer.to_host(stacked).reshape(-1).tolist()]
