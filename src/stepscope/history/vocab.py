"""Closed vocabularies of the history schema (enums; their order is part of the format).

Storage codes are each member's 1-based declaration position, so members are only ever appended.

Example
-------
>>> Presence("not_scheduled") is Presence.NOT_SCHEDULED
True
"""

from __future__ import annotations

import enum

from stepscope.codec import parse_enum


class Stream(str, enum.Enum):
    """What tensor a site's observation reduces."""

    ACTIVATION = "activation"  # module outputs, at module return (forward)
    GRADIENT = "gradient"  # parameter gradients, just before the optimizer step
    PARAMETER = "parameter"  # parameter values, just after the optimizer step
    UPDATE = "update"  # the actual parameter change of the optimizer step (sampled)
    ACTIVATION_GRAD = "activation_grad"  # gradients of module outputs (tensor hooks)


#: Streams whose records must say whether the gradient was loss-scaled.
GRADIENT_STREAMS = frozenset({Stream.GRADIENT, Stream.ACTIVATION_GRAD})


class Phase(str, enum.Enum):
    """When in the step the observation was taken."""

    FORWARD = "forward"
    BACKWARD = "backward"
    PRE_STEP = "pre_step"
    POST_STEP = "post_step"
    PRE_CLIP = "pre_clip"  # gradients before / after clipping (append-only: codes are stored)
    POST_CLIP = "post_clip"


class Presence(str, enum.Enum):
    """Why a cell does or does not hold data. Only ``observed`` may carry a payload."""

    OBSERVED = "observed"
    NOT_SCHEDULED = "not_scheduled"
    SITE_ABSENT = "site_absent"
    UNSUPPORTED = "unsupported"
    CAPTURE_FAILED = "capture_failed"
    BUDGET_DROPPED = "budget_dropped"


class ScaleGrad(str, enum.Enum):
    """Whether a gradient statistic was taken before or after loss-scale removal."""

    SCALED = "scaled"
    UNSCALED = "unscaled"
    UNKNOWN = "unknown"


class StepProvenance(str, enum.Enum):
    """Which spelling produced a step block: the authoritative transaction or the hook."""

    EXPLICIT = "explicit"
    IMPLICIT = "implicit"


class Tristate(str, enum.Enum):
    """A yes/no fact that may be unknown (never silently defaulted to ``no``)."""

    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"

    @classmethod
    def of(cls, value: bool | str | Tristate | None) -> Tristate:
        """Normalise ``True/False/None`` or a vocabulary string (``None`` means unknown)."""
        if isinstance(value, Tristate):
            return value
        if value is None:
            return cls.UNKNOWN
        if isinstance(value, bool):
            return cls.YES if value else cls.NO
        return parse_enum(cls, value, "tristate", "history_json_invalid")


#: Row disclosure of an ``update`` row reduced from a seeded sample of ``k`` elements
#: (``"update_sampled:<k>"``): its statistics are estimates, not exact values.
UPDATE_SAMPLED = "update_sampled"


def is_estimate(disclosures: tuple[str, ...]) -> bool:
    """Whether a row's disclosures mark its statistics as sample estimates.

    >>> is_estimate(("update_sampled:4096",)), is_estimate(())
    (True, False)
    """
    return any(d.split(":", 1)[0] == UPDATE_SAMPLED for d in disclosures)
