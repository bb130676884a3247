"""Evaluation rows: metrics of one named split at one training coordinate.

An evaluation (:class:`EvalRecord`) is written twice, by the same call: one scalar row per metric
(``eval/<split>/<metric>`` at its ``optimizer_step``, so trackers and reports carry it), and one
checksummed JSON line in the artifact's ``evals.log`` that keeps what a scalar cannot: the three
axes as measured at the evaluation — ``optimizer_step`` (optimizer steps applied before it, ``0``
at initialization), ``examples_seen`` (training examples consumed before it) and the user's own
``epoch`` — plus the declared ``endpoint`` flag, the ``sample_count`` and the ``data_hash``. An
unknown count is ``None``, never a zero. A plot of official-test values uses only the records
whose ``endpoint`` is true.

A metric named ``confusion`` may be a ``(classes, classes)`` matrix of counts
(``confusion[true][predicted]``, array or tensor): :func:`expand_confusion` turns it into the
integer metrics ``confusion/<true>/<predicted>`` and ``predicted_counts/<class>`` (column sums), so
evaluation splits carry the same class-level view as the dense probe.

Example
-------
>>> r = EvalRecord("validation", {"ce": 0.5, "accuracy_fraction": 0.875}, optimizer_step=100,
...                examples_seen=6400, epoch=None, sample_count=512, data_hash="sha256:ab12")
>>> r.to_dict()["metrics"]
{'accuracy_fraction': 0.875, 'ce': 0.5}
>>> EvalRecord.from_dict(r.to_dict()) == r
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stepscope.codec import float_from_json, json_float
from stepscope.errors import Refusal
from stepscope.history.inputs import natural_or_none
from stepscope.runlog.names import HASH_WIDTH, METRIC_WIDTH, SPLIT_WIDTH, check_label

CONFUSION_METRIC = "confusion"


def expand_confusion(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Replace a ``confusion`` matrix metric by its cells and predicted-class counts.

    >>> sorted(expand_confusion({"accuracy": 0.5, "confusion": [[1, 1], [0, 2]]}).items())
    ... # doctest: +NORMALIZE_WHITESPACE
    [('accuracy', 0.5), ('confusion/0/0', 1), ('confusion/0/1', 1), ('confusion/1/0', 0),
     ('confusion/1/1', 2), ('predicted_counts/0', 1), ('predicted_counts/1', 3)]
    """
    if not isinstance(metrics, Mapping) or CONFUSION_METRIC not in metrics:
        return dict(metrics) if isinstance(metrics, Mapping) else metrics
    raw = metrics[CONFUSION_METRIC]
    if hasattr(raw, "detach"):
        raw = raw.detach().cpu().numpy()
    matrix = np.asarray(raw)
    square = matrix.ndim == 2 and matrix.shape[0] == matrix.shape[1] and matrix.size > 0
    if (
        not square
        or not np.issubdtype(matrix.dtype, np.number)
        or not np.all(np.isfinite(matrix))
        or np.any(matrix < 0)
        or np.any(matrix != np.round(matrix))
    ):
        raise Refusal(
            "runlog_value_invalid",
            f"metric 'confusion' must be a square matrix of counts, got shape {matrix.shape}.",
            ["pass confusion[true][predicted] counts, e.g. torch.bincount(...).reshape(C, C)"],
        )
    counts = matrix.astype(np.int64)
    out = {k: v for k, v in metrics.items() if k != CONFUSION_METRIC}
    for t, row in enumerate(counts.tolist()):
        for p, count in enumerate(row):
            out[f"{CONFUSION_METRIC}/{t}/{p}"] = count
    for p, count in enumerate(counts.sum(0).tolist()):
        out[f"predicted_counts/{p}"] = count
    return out


def check_count(value: Any, what: str) -> int | None:
    """``value`` as an exact int >= 0 (or None); anything else refuses ``runlog_value_invalid``.

    Never coerced: ``-1``, ``1.5``, ``"3"`` and ``True`` all refuse.

    >>> check_count(8, "examples")
    8
    """
    return natural_or_none(value, what, "runlog_value_invalid")


@dataclass(frozen=True)
class EvalRecord:
    """One evaluation of one split.

    Parameters
    ----------
    split
        The split's name: ``train_probe``, ``validation``, ``test`` or your own label.
    metrics
        Metric name -> value (host floats; NaN is a real observation, absent metrics have no row).
    optimizer_step
        Optimizer steps applied before this evaluation (``0`` at initialization).
    examples_seen
        Training examples consumed before it (``None``: unknown).
    epoch
        Your own epoch count (``None``: not given; never derived from examples).
    sample_count
        Examples evaluated (``None``: not given).
    data_hash
        Identity of the evaluated data (e.g. ``"sha256:..."``; ``None``: not given).
    endpoint
        Whether this is a declared endpoint (official-test values belong only there).
    wall_time
        Unix time of the evaluation.
    """

    split: str
    metrics: Mapping[str, float]
    optimizer_step: int
    examples_seen: int | None = None
    epoch: int | None = None
    sample_count: int | None = None
    data_hash: str | None = None
    endpoint: bool = False
    wall_time: float | None = None
    _sorted: tuple[tuple[str, float], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_label(self.split, "split", SPLIT_WIDTH)
        if not isinstance(self.metrics, Mapping) or not self.metrics:
            raise Refusal("runlog_value_invalid", "an evaluation needs at least one metric.", [])
        items = []
        for name, value in self.metrics.items():
            check_label(name, "metric name", METRIC_WIDTH)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
                raise Refusal(
                    "runlog_value_invalid",
                    f"metric {name!r} is {type(value).__name__}, not a real number.",
                    ["convert tensors with RunLog.log_eval, which batches them"],
                )
            try:
                items.append((name, float(value)))
            except OverflowError:
                raise Refusal(
                    "runlog_value_invalid", f"metric {name!r} does not fit a float64.", []
                ) from None
        object.__setattr__(self, "_sorted", tuple(sorted(items)))
        object.__setattr__(self, "metrics", dict(self._sorted))
        if check_count(self.optimizer_step, "optimizer_step") is None:
            raise Refusal("runlog_step_invalid", "an evaluation needs its optimizer_step.", [])
        check_count(self.examples_seen, "examples_seen")
        check_count(self.epoch, "epoch")
        check_count(self.sample_count, "sample_count")
        if self.data_hash is not None:
            check_label(self.data_hash, "data_hash", HASH_WIDTH)
        if not isinstance(self.endpoint, (bool, np.bool_)):
            raise Refusal("runlog_value_invalid", "endpoint must be True or False.", [])
        if self.wall_time is not None and (
            isinstance(self.wall_time, bool)
            or not isinstance(self.wall_time, (int, float))
            or not math.isfinite(self.wall_time)
        ):
            raise Refusal("runlog_value_invalid", "wall_time must be finite or None.", [])

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dictionary (metrics sorted by name; NaN metrics as the string ``"nan"``)."""
        return {
            "split": self.split,
            "metrics": {k: json_float(v) for k, v in self._sorted},
            "optimizer_step": self.optimizer_step,
            "examples_seen": self.examples_seen,
            "epoch": self.epoch,
            "sample_count": self.sample_count,
            "data_hash": self.data_hash,
            "endpoint": bool(self.endpoint),
            "wall_time": self.wall_time,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EvalRecord:
        """Inverse of :meth:`to_dict`; a malformed row refuses ``history_json_invalid``."""
        try:
            metrics: dict[str, float] = {}
            for k, v in dict(d["metrics"]).items():
                value = float_from_json(v, str(k))
                if value is None:
                    raise ValueError(f"metric {k!r} is null")
                metrics[str(k)] = value
            return cls(
                split=d["split"],
                metrics=metrics,
                optimizer_step=d["optimizer_step"],
                examples_seen=d.get("examples_seen"),
                epoch=d.get("epoch"),
                sample_count=d.get("sample_count"),
                data_hash=d.get("data_hash"),
                endpoint=d.get("endpoint", False),
                wall_time=d.get("wall_time"),
            )
        except (KeyError, TypeError, ValueError, ArithmeticError, Refusal) as exc:
            raise Refusal(
                "history_json_invalid",
                f"an evals.log row is malformed ({exc}).",
                ["restore evals.log from a copy"],
            ) from None
