"""The step-indexed views a reader returns: :class:`Series`, :class:`HistogramSeries`, and the
check of a query's step range (:func:`check_steps`).

Example
-------
>>> check_steps((2, 5))
(2, 5)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stepscope.errors import Refusal
from stepscope.history.frames import series_frame, series_text
from stepscope.history.vocab import Presence
from stepscope.stats import Histogram, HistogramDescriptor

__all__ = ["HistogramSeries", "Series", "check_steps"]


@dataclass(frozen=True)
class Series:
    """A step-indexed series. ``values`` is NaN wherever ``valid`` is False (never 0).

    ``presence`` holds :class:`Presence` storage codes (see :meth:`presence_names`);
    ``valid`` is ``presence == observed`` and a defined value (e.g. ``min`` of an all-NaN tensor
    is not defined). ``name``, ``stream``, ``cadence`` (its spine cadence in steps) say what it
    is; ``print(series)`` shows them beside a step/value table (:mod:`~stepscope.history.frames`).
    """

    field: str
    steps: np.ndarray
    values: np.ndarray
    presence: np.ndarray
    valid: np.ndarray
    site_ids: np.ndarray
    name: str = ""
    stream: str = ""
    cadence: int | None = None

    def __repr__(self) -> str:
        return series_text(self)

    def to_pandas(self) -> Any:
        """A ``pandas.DataFrame`` with columns ``step``, ``value``, ``presence`` (names)."""
        return series_frame(self)

    @property
    def valid_count(self) -> int:
        """Number of steps holding a defined value."""
        return int(self.valid.sum())

    def presence_names(self) -> np.ndarray:
        """``presence`` as strings (``"observed"``, ``"not_scheduled"``, ...)."""
        names = np.array(["invalid", *(p.value for p in Presence)])
        return names[self.presence]


@dataclass(frozen=True)
class HistogramSeries:
    """Histogram rows of one site/stream, only at the steps where one was taken."""

    steps: np.ndarray
    site_ids: np.ndarray
    counts: np.ndarray
    descriptor: HistogramDescriptor

    def histogram(self, i: int) -> Histogram:
        """Row ``i`` as a ``stepscope.stats.Histogram`` (``0 <= i < len(steps)``, or negative)."""
        n = len(self.steps)
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not -n <= i < n:
            raise Refusal(
                "history_query_invalid",
                f"histogram row {i!r} is not an int in {-n}..{n - 1} ({n} rows).",
                ["index a row of .steps, e.g. hs.histogram(len(hs.steps) - 1)"],
            )
        return Histogram.from_vector(self.counts[i], self.descriptor)


def check_steps(steps: Any) -> tuple[int, int] | None:
    """An inclusive ``(first, last)`` step range of ints, or None; else ``history_query_invalid``.

    >>> check_steps([2, 5])
    (2, 5)
    """
    if steps is None:
        return None
    if (
        not isinstance(steps, (tuple, list))
        or len(steps) != 2
        or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in steps)
        or steps[0] > steps[1]
    ):
        raise Refusal(
            "history_query_invalid",
            f"steps={steps!r} is not an inclusive (first, last) pair of ints.",
            ["pass steps=(first, last) with first <= last, or None for all steps"],
        )
    return int(steps[0]), int(steps[1])
