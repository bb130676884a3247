"""The flight recorder's bounded RAM window: the last ``capacity`` steps, one row per step.

A row is a step's channel values (float64) and presence (bool: ``False`` means the number was
not observed that step, never that it is zero). The window holds at most ``capacity`` rows;
pushing into a full window forgets its oldest row. :meth:`FlightWindow.rows` returns them
oldest first.

>>> import numpy as np
>>> w = FlightWindow(capacity=2, width=1)
>>> for step in range(3):
...     w.push(step, np.array([float(step)]), np.array([True]))
>>> w.rows()[0].tolist(), w.rows()[1][:, 0].tolist()
([1, 2], [1.0, 2.0])
"""

from __future__ import annotations

import numpy as np

__all__ = ["FlightWindow"]


class FlightWindow:
    """A ring of ``capacity`` step rows of ``width`` channels."""

    def __init__(self, capacity: int, width: int) -> None:
        self.capacity, self.width = capacity, width
        self._steps = np.zeros(capacity, dtype=np.int64)
        self._values = np.full((capacity, width), np.nan)
        self._present = np.zeros((capacity, width), dtype=bool)
        self._next = 0  # rows pushed so far

    def __len__(self) -> int:
        return min(self._next, self.capacity)

    def push(self, step: int, values: np.ndarray, present: np.ndarray) -> None:
        """Append the row of ``step`` (forgetting the oldest row of a full window)."""
        at = self._next % self.capacity
        self._steps[at] = step
        self._values[at] = values
        self._present[at] = present
        self._next += 1

    def rows(self, last: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(steps, values, present)`` of the held rows (the ``last`` ones), oldest first."""
        n = len(self) if last is None else min(last, len(self))
        order = (np.arange(self._next - n, self._next) % self.capacity).astype(np.int64)
        return self._steps[order], self._values[order], self._present[order]
