"""Exact streaming statistics of tensors: the spine and the signed log2 histogram."""

from stepscope.stats._native import backend_info
from stepscope.stats.descriptor import SPECIAL_FIELDS, HistogramDescriptor
from stepscope.stats.histogram import Histogram, QuantileEstimate
from stepscope.stats.protocol import BUILTIN_STATS, StreamingStat, aggregate
from stepscope.stats.reduce import (
    REDUCTION_DTYPE,
    SPINE_FIELDS,
    SPINE_WIDTH,
    merge_spine_rows,
    reduce_histograms,
    reduce_spines,
    spine_and_histogram_into,
    spine_into,
    spines_into,
)
from stepscope.stats.spine import RunningStats
from stepscope.stats.text import render_histogram, render_spine

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
