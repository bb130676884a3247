"""The per-step history schema: four normalised record layers with a JSON round trip.

* :class:`~stepscope.history.runrecord.RunRecord` — one segment of a run: identity, resume ancestry, fingerprint, versions,
  histogram descriptor, cadences, budgets, device, rank/world (defined in
  :mod:`stepscope.history.runrecord`).
* :class:`SiteRecord` — the stable *structural* identity of an observed site (qualified module
  name, module type, output signature): one catalog entry. Labels are display only. Topology
  drift ends a site (``ended_step``/``ended_reason``) and starts a new one under the same name;
  a site id is never re-bound.
* :class:`StepBlockRecord` — the training coordinate of one optimizer step, its provenance and its
  optimizer truth (:class:`StepTruth`, ``unknown`` allowed).
* :class:`ObservationRecord` — one (step, site, stream, phase) cell with a closed presence
  vocabulary; a non-observed cell never carries a payload, gradient streams carry ``scale_grad``.

Example
-------
>>> from stepscope.history.schema import SiteRecord
>>> s = SiteRecord(site_id=0, name="fc1", module_type="torch.nn.Linear", signature="f32[*,8]")
>>> SiteRecord.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stepscope.codec import parse_enum
from stepscope.errors import Refusal
from stepscope.history.fields import _need, _opt
from stepscope.history.inputs import as_stored, check_step, finite_or_none, natural_or_none
from stepscope.history.vocab import (
    GRADIENT_STREAMS,
    Phase,
    Presence,
    ScaleGrad,
    StepProvenance,
    Stream,
    Tristate,
)
from stepscope.stats import Histogram, RunningStats

__all__ = [
    "ObservationRecord",
    "SiteRecord",
    "StepBlockRecord",
    "StepTruth",
]


@dataclass(frozen=True)
class SiteRecord:
    """Structural identity of one observed site (one entry of the catalog).

    ``site_id`` is the site's id inside an artifact. Two site records are the same site only
    when ``name``, ``module_type`` and ``signature`` all agree; ``label`` is display only.
    ``ended_step``/``ended_reason`` close a site when the topology drifts.
    """

    site_id: int
    name: str
    module_type: str
    signature: str
    label: str | None = None
    started_step: int | None = None
    ended_step: int | None = None
    ended_reason: str | None = None

    @property
    def structure(self) -> tuple[str, str, str]:
        """The structural key that identifies the site (labels excluded)."""
        return (self.name, self.module_type, self.signature)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary."""
        return {
            "site_id": self.site_id,
            "name": self.name,
            "module_type": self.module_type,
            "signature": self.signature,
            "label": self.label,
            "started_step": self.started_step,
            "ended_step": self.ended_step,
            "ended_reason": self.ended_reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SiteRecord:
        """Inverse of :meth:`to_dict`."""
        w = "site record"
        return cls(
            site_id=_need(d, "site_id", int, w),
            name=_need(d, "name", str, w),
            module_type=_need(d, "module_type", str, w),
            signature=_need(d, "signature", str, w),
            label=_opt(d, "label", str, w),
            started_step=_opt(d, "started_step", int, w),
            ended_step=_opt(d, "ended_step", int, w),
            ended_reason=_opt(d, "ended_reason", str, w),
        )


@dataclass(frozen=True)
class StepTruth:
    """What the optimizer really did at a step; ``unknown``/``None`` where it cannot be known.

    ``scale`` is the loss scale in force (``None``: unknown or no scaler),
    ``micro_batches`` the number of accumulated micro-batches (``None``: unknown).
    """

    applied: Tristate = Tristate.UNKNOWN
    scale: float | None = None
    unscaled: Tristate = Tristate.UNKNOWN
    clipped: Tristate = Tristate.UNKNOWN
    micro_batches: int | None = None

    def __post_init__(self) -> None:
        for name in ("applied", "unscaled", "clipped"):
            object.__setattr__(self, name, Tristate.of(getattr(self, name)))
        if self.scale is not None and not math.isfinite(self.scale):
            raise Refusal("history_json_invalid", f"loss scale {self.scale} is not finite.", [])
        if self.micro_batches is not None and self.micro_batches < 1:
            raise Refusal("history_json_invalid", "micro_batches must be >= 1 or None.", [])

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary."""
        return {
            "applied": self.applied.value,
            "scale": self.scale,
            "unscaled": self.unscaled.value,
            "clipped": self.clipped.value,
            "micro_batches": self.micro_batches,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepTruth:
        """Inverse of :meth:`to_dict`."""
        w = "step truth"
        scale = _opt(d, "scale", (int, float), w)
        return cls(
            applied=Tristate.of(_need(d, "applied", str, w)),
            scale=None if scale is None else float(scale),
            unscaled=Tristate.of(_need(d, "unscaled", str, w)),
            clipped=Tristate.of(_need(d, "clipped", str, w)),
            micro_batches=_opt(d, "micro_batches", int, w),
        )


@dataclass(frozen=True)
class StepBlockRecord:
    """The atomic training coordinate: one optimizer step and how it is known."""

    optimizer_step: int
    examples_seen: int | None = None
    epoch: int | None = None
    provenance: StepProvenance = StepProvenance.EXPLICIT
    truth: StepTruth = field(default_factory=StepTruth)
    wall_time: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "provenance",
            parse_enum(StepProvenance, self.provenance, "provenance", "history_json_invalid"),
        )
        check_step(self.optimizer_step, "optimizer_step")
        object.__setattr__(self, "optimizer_step", int(self.optimizer_step))
        object.__setattr__(
            self, "examples_seen", natural_or_none(self.examples_seen, "examples_seen")
        )
        object.__setattr__(self, "epoch", natural_or_none(self.epoch, "epoch"))
        object.__setattr__(self, "wall_time", finite_or_none(self.wall_time, "wall_time"))
        if not isinstance(self.truth, StepTruth):
            raise Refusal("history_write_invalid", f"truth {self.truth!r} is not a StepTruth.")

    @classmethod
    def trusted(
        cls,
        optimizer_step: int,
        examples_seen: int | None,
        epoch: int | None,
        provenance: StepProvenance,
        truth: StepTruth,
        wall_time: float,
    ) -> StepBlockRecord:
        """A block from a producer whose every field is already of its checked kind (the
        collector's step boundary: counts checked where the user gave them, an enum, a
        :class:`StepTruth`, ``time.time()``), built without re-checking them (every step).

        >>> b = StepBlockRecord.trusted(3, 48, None, StepProvenance.EXPLICIT, StepTruth(), 1.0)
        >>> b == StepBlockRecord(3, 48, None, StepProvenance.EXPLICIT, StepTruth(), 1.0)
        True
        """
        block = object.__new__(cls)
        block.__dict__.update(
            optimizer_step=optimizer_step,
            examples_seen=examples_seen,
            epoch=epoch,
            provenance=provenance,
            truth=truth,
            wall_time=wall_time,
        )
        return block

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary."""
        return {
            "optimizer_step": self.optimizer_step,
            "examples_seen": self.examples_seen,
            "epoch": self.epoch,
            "provenance": self.provenance.value,
            "truth": self.truth.to_dict(),
            "wall_time": self.wall_time,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepBlockRecord:
        """Inverse of :meth:`to_dict`."""
        w = "step block"
        wall = _opt(d, "wall_time", (int, float), w)
        return as_stored(
            cls,
            optimizer_step=_need(d, "optimizer_step", int, w),
            examples_seen=_opt(d, "examples_seen", int, w),
            epoch=_opt(d, "epoch", int, w),
            provenance=parse_enum(
                StepProvenance, _need(d, "provenance", str, w), "provenance", "history_json_invalid"
            ),
            truth=StepTruth.from_dict(_need(d, "truth", Mapping, w)),
            wall_time=None if wall is None else float(wall),
        )


@dataclass(frozen=True)
class ObservationRecord:
    """One (step, site, stream, phase) cell.

    ``spine`` is a ``stepscope.stats.RunningStats`` and ``histogram`` a
    ``stepscope.stats.Histogram`` (or ``None``). Only ``presence=observed`` may carry them
    (else ``presence_payload_forbidden``); gradient streams need ``scale_grad``
    (else ``scale_grad_required``). ``micro_batch`` is ``None`` for a whole-step cell.
    """

    step: int
    site_id: int
    stream: Stream
    phase: Phase
    presence: Presence
    spine: RunningStats | None = None
    histogram: Histogram | None = None
    scale_grad: ScaleGrad | None = None
    micro_batch: int | None = None
    disclosures: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "stream", parse_enum(Stream, self.stream, "stream", "stream_unknown")
        )
        object.__setattr__(
            self, "phase", parse_enum(Phase, self.phase, "phase", "history_json_invalid")
        )
        object.__setattr__(
            self,
            "presence",
            parse_enum(Presence, self.presence, "presence", "history_json_invalid"),
        )
        object.__setattr__(self, "disclosures", tuple(self.disclosures))
        if self.scale_grad is not None:
            object.__setattr__(
                self,
                "scale_grad",
                parse_enum(ScaleGrad, self.scale_grad, "scale_grad", "history_json_invalid"),
            )
        if self.presence is not Presence.OBSERVED and (
            self.spine is not None or self.histogram is not None
        ):
            raise Refusal(
                "presence_payload_forbidden",
                f"step {self.step} site {self.site_id} {self.stream.value}: presence "
                f"{self.presence.value!r} carries a payload; only 'observed' cells hold data.",
                ["set presence='observed'", "or drop the spine/histogram"],
            )
        if self.stream in GRADIENT_STREAMS and self.scale_grad is None:
            raise Refusal(
                "scale_grad_required",
                f"a {self.stream.value} record must say whether it was loss-scaled.",
                ["pass scale_grad='scaled', 'unscaled' or 'unknown'"],
            )
