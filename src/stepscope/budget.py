"""The one budget rule behind every chosen cadence: the densest cadence whose cost fits.

Work that costs ``cost`` seconds each time it runs, run every ``k`` steps, costs ``cost / k``
seconds per step. Given what a step may spend on it (``budget`` seconds), the densest cadence is

.. math:: k = \\max\\left(1, \\left\\lceil \\frac{\\mathrm{cost}}{\\mathrm{budget}} \\right\\rceil\\right),

the smallest ``k >= 1`` with ``cost / k <= budget`` (a ratio within ``1e-12`` above an integer
counts as that integer, so float round-off never costs a step). Both choosers use it: the
collector's ``cadence="auto"`` (:func:`stepscope.collect.choose_stream_cadences`, budget
``(tau T - F) / n`` per stream) and the probe's (:func:`stepscope.probe.cadence.choose_cadence`,
budget ``tau T``).

Example
-------
>>> densest_cadence(0.30, 0.05 * 2.0), densest_cadence(0.0, 1.0), densest_cadence(5.0, 1.0)
(3, 1, 5)
"""

from __future__ import annotations

import math


def densest_cadence(cost: float, budget: float) -> int:
    """The smallest ``k >= 1`` with ``cost / k <= budget`` (see the module docstring).

    Parameters
    ----------
    cost
        Seconds one run of the work costs (``>= 0``).
    budget
        Seconds per step the work may cost (``> 0``).

    Returns
    -------
    int
        The cadence ``k`` (run every ``k``-th step).

    Raises
    ------
    ValueError
        ``budget`` not positive or ``cost`` negative (a caller's bug: both are measured times).
    """
    if not budget > 0 or not cost >= 0:
        raise ValueError(f"need cost >= 0 and budget > 0, got cost={cost!r}, budget={budget!r}")
    return max(1, math.ceil(cost / budget - 1e-12))
