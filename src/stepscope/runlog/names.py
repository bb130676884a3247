"""Names of run-log rows: user scalars, the clock and branch rows stepscope writes, eval labels.

Everything lands in the artifact's ``scalars`` table, so every exporter that already publishes
user scalars (TensorBoard, W&B, JSONL, the report) carries it too:

``clock/training_seconds``, ``clock/telemetry_seconds``, ``clock/elapsed_seconds``
    Cumulative seconds at the end of each step (see :mod:`stepscope.runlog.clocks`). These three
    names are reserved: a user scalar of that name refuses ``runlog_name_invalid``.
``branch/<branch>/<field>``
    Branch activity of a step (:class:`BranchField`); ``nominal_skipped_macs`` is nominal
    arithmetic exposure, never measured time or energy saved. You may log your own quantities
    beside them (e.g. ``branch/blocks.2/survival_probability``), not the same field in the same
    step as :meth:`log_mask`.
``eval/<split>/<metric>``
    One row per metric of an evaluation, at the evaluation's ``optimizer_step``; the evaluation's
    own axes, endpoint flag, sample count and data hash are in ``evals.log``
    (:mod:`stepscope.runlog.evals`).

Example
-------
>>> branch_scalar("blocks.2", BranchField.ACTIVE_FRACTION)
'branch/blocks.2/active_fraction'
>>> eval_scalar("validation", "ce")
'eval/validation/ce'
>>> parse_branch_scalar("branch/blocks.2/active_fraction")
('blocks.2', <BranchField.ACTIVE_FRACTION: 'active_fraction'>)
"""

from __future__ import annotations

import enum
import re

from stepscope.errors import Refusal

CLOCK_TRAINING = "clock/training_seconds"
CLOCK_TELEMETRY = "clock/telemetry_seconds"
CLOCK_ELAPSED = "clock/elapsed_seconds"
CLOCK_NAMES = (CLOCK_TRAINING, CLOCK_TELEMETRY, CLOCK_ELAPSED)
BRANCH_PREFIX = "branch/"
EVAL_PREFIX = "eval/"

#: Widths of the fixed-width text fields of the ``evals`` table (characters).
SPLIT_WIDTH, METRIC_WIDTH, HASH_WIDTH = 32, 64, 128
_LABEL = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./:@+-]*$")


class BranchField(str, enum.Enum):
    """The per-step fields of one branch's activity."""

    ACTIVE_FRACTION = "active_fraction"  # active units / total units (exact ratio of counts)
    ACTIVE_UNITS = "active_units"  # nonzero mask entries (exact integer)
    TOTAL_UNITS = "total_units"  # mask entries (exact integer)
    NOMINAL_SKIPPED_MACS = "nominal_skipped_macs"  # inactive units x declared MACs per unit


class Split(str, enum.Enum):
    """Common evaluation split names (any label matching the name rules is accepted)."""

    TRAIN_PROBE = "train_probe"  # a fixed subset of the fitting split: not held-out evidence
    TRAIN = "train"
    VALIDATION = "validation"
    TEST = "test"  # official test: plot only at declared endpoints


def branch_scalar(branch: str, field: BranchField) -> str:
    """The reserved scalar name of one branch field."""
    return f"{BRANCH_PREFIX}{branch}/{field.value}"


def eval_scalar(split: str, metric: str) -> str:
    """The scalar name of one evaluation metric."""
    return f"{EVAL_PREFIX}{split}/{metric}"


def parse_branch_scalar(name: str) -> tuple[str, BranchField] | None:
    """``(branch, field)`` of a reserved branch scalar name, else ``None``."""
    if not name.startswith(BRANCH_PREFIX):
        return None
    branch, _, field = name[len(BRANCH_PREFIX) :].rpartition("/")
    try:
        return branch, BranchField(field)
    except ValueError:
        return None


def check_scalar_name(name: object) -> str:
    """A user scalar name: non-empty text, not one of the reserved clock names."""
    if not isinstance(name, str) or not name.strip():
        raise Refusal("runlog_name_invalid", f"scalar name {name!r} is not a non-empty string.", [])
    if name in CLOCK_NAMES:
        raise Refusal(
            "runlog_name_invalid",
            f"scalar name {name!r} is a clock stepscope writes itself at every step.",
            ["choose another name (e.g. clock/my_timer_s)"],
        )
    return name


def check_label(value: object, what: str, width: int) -> str:
    """A split/metric/branch label: ``[A-Za-z0-9_]`` first, then ``[A-Za-z0-9_./:@+-]``."""
    if not isinstance(value, str) or not _LABEL.match(value) or len(value) > width:
        raise Refusal(
            "runlog_name_invalid",
            f"{what} {value!r} must be 1..{width} characters of [A-Za-z0-9_./:@+-], "
            "starting with a letter, digit or underscore.",
            [f"rename the {what}"],
        )
    return value
