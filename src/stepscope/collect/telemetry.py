"""The telemetry window: work the user does *for* telemetry, outside the collector's hooks.

``with collector.telemetry(): ...`` brackets work such as a dense probe's measurement, its
serialisation, or a parameter snapshot. While a window is open:

* its wall-clock seconds are charged to the current step's ``clock/telemetry_seconds`` (the
  step being recorded, or the next one between steps), never to the isolated training seconds
  ``clock/training_seconds`` of a step transaction it runs inside;
* the collector's hooks record nothing: forwards, backwards and optimizer steps run inside the
  window never reach the step's activation, gradient, parameter or update rows.

Windows nest; only the outermost one is timed.

Example
-------
>>> import torch, stepscope as ss
>>> model = torch.nn.Linear(4, 2)
>>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> with ss.HistoryCollector(model, sites="Linear") as c:
...     with c.step(opt, examples=8):
...         model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
...         with c.telemetry():
...             _ = model(torch.randn(100, 4))  # a probe forward: not folded into the step
>>> int(c.last_batches[0].spines[0, 0])  # the activation row counts the 8x2 training output
16
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["TelemetryWindow"]


class TelemetryWindow:
    """Depth and timing of nested ``telemetry()`` windows of one collector.

    Parameters
    ----------
    charge
        Called with the seconds of each outermost window when it closes.
    """

    def __init__(self, charge: Callable[[float], None]) -> None:
        self._charge = charge
        self.depth = 0

    @property
    def open(self) -> bool:
        """Whether a window is open (the hooks must record nothing)."""
        return self.depth > 0

    @contextmanager
    def __call__(self) -> Iterator[None]:
        """Open a window; on exit (also by an exception) charge its seconds and close it."""
        t0 = time.perf_counter()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self._charge(time.perf_counter() - t0)
