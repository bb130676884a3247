"""Exact streaming statistics of tensors: the spine and the signed log2 histogram.

The spine row layout (:mod:`stepscope.stats.layout`), the histogram descriptor and the value
classes (:class:`RunningStats`, :class:`Histogram`) load without torch, so the history can decode
stored rows into them in a process that never imports torch. The reductions, which need torch,
are re-exported lazily: ``stepscope.stats.reduce_spines`` imports :mod:`stepscope.stats.reduce`
on first use. Type checkers see them through the ``TYPE_CHECKING`` imports below (a test keeps
them equal to the lazy table).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from stepscope.stats._native import backend_info
from stepscope.stats.descriptor import SPECIAL_FIELDS, HistogramDescriptor
from stepscope.stats.histogram import Histogram, QuantileEstimate
from stepscope.stats.layout import REDUCTION_DTYPE, SPINE_FIELDS, SPINE_WIDTH
from stepscope.stats.spine import RunningStats
from stepscope.stats.text import render_histogram, render_spine

if TYPE_CHECKING:  # what the lazy table below resolves to, spelled out for type checkers
    from stepscope.stats.binning import reduce_histograms as reduce_histograms
    from stepscope.stats.protocol import BUILTIN_STATS as BUILTIN_STATS
    from stepscope.stats.protocol import StreamingStat as StreamingStat
    from stepscope.stats.protocol import aggregate as aggregate
    from stepscope.stats.reduce import merge_spine_rows as merge_spine_rows
    from stepscope.stats.reduce import reduce_spines as reduce_spines
    from stepscope.stats.reduce import spines_into as spines_into
    from stepscope.stats.spinerow import spine_and_histogram_into as spine_and_histogram_into
    from stepscope.stats.spinerow import spine_into as spine_into

#: public name -> the module that defines it (imported on first access: it imports torch)
_LAZY: dict[str, str] = {
    "BUILTIN_STATS": "stepscope.stats.protocol",
    "StreamingStat": "stepscope.stats.protocol",
    "aggregate": "stepscope.stats.protocol",
    # numpy rows and torch rows (stepscope.stats.layout.merge_spine_rows is the numpy-only one)
    "merge_spine_rows": "stepscope.stats.reduce",
    "reduce_histograms": "stepscope.stats.binning",
    "reduce_spines": "stepscope.stats.reduce",
    "spine_and_histogram_into": "stepscope.stats.spinerow",
    "spine_into": "stepscope.stats.spinerow",
    "spines_into": "stepscope.stats.reduce",
}

__all__ = [
    "BUILTIN_STATS",
    "REDUCTION_DTYPE",
    "SPECIAL_FIELDS",
    "SPINE_FIELDS",
    "SPINE_WIDTH",
    "Histogram",
    "HistogramDescriptor",
    "QuantileEstimate",
    "RunningStats",
    "StreamingStat",
    "aggregate",
    "backend_info",
    "merge_spine_rows",
    "reduce_histograms",
    "reduce_spines",
    "render_histogram",
    "render_spine",
    "spine_and_histogram_into",
    "spine_into",
    "spines_into",
]


if not TYPE_CHECKING:  # hidden from type checkers, so that a misspelt name is an error there

    def __getattr__(name: str) -> Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'stepscope.stats' has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted(__all__)
