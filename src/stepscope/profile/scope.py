"""stepscope-owned record scopes: label stepscope's own work so the accounting charges it to us.

:func:`internal_scope` opens a ``torch.profiler.record_function`` bracket named
``stepscope.internal/<label>`` while a profiler records, and nothing otherwise. Every op inside
it (``aten::where``, ``bucketize``, ``isfinite``, ``index_add_``, ``stack``, the host copy, and
the device kernels they launch) is then stepscope's work in the two-part accounting of
:mod:`stepscope.profile.accounting` (part b, ``internal=True``), never the user's framework time.

The check is one C call (``torch.autograd._profiler_enabled()``), so the collector's hot path
pays no ``record_function`` cost when nothing is profiling.

Example
-------
>>> import torch
>>> from stepscope.profile.accounting import classify_owner
>>> with internal_scope("collector.reduce"):  # no profiler: a no-op
...     _ = torch.ones(3).sum()
>>> classify_owner(INTERNAL_PREFIX + "collector.reduce").value
'stepscope_internal'
"""

from __future__ import annotations

# defined in the bottom layer so the collector's staging and the run log's step buffer can use it
from stepscope.transfer import INTERNAL_PREFIX, internal_scope

__all__ = ["INTERNAL_PREFIX", "internal_scope"]
