"""The one device-to-host copy, and the profiler label of stepscope's own work.

A bottom-level module (it imports only torch and numpy) so that every layer that moves values
off the device — the collector's staging buffers (:mod:`stepscope.collect.staging`) and the run
log's step buffer (:mod:`stepscope.runlog.pending`) — goes through the same :func:`to_host`,
and the profiler sees that copy as stepscope's work (:func:`internal_scope`, accounted by
:mod:`stepscope.profile.accounting`). Tests count transfers by patching :func:`to_host` here
(and in the modules that imported the name).

Example
-------
>>> import torch
>>> to_host(torch.arange(3.0)).tolist()
[0.0, 1.0, 2.0]
>>> with internal_scope("collector.reduce"):  # no profiler recording: a no-op
...     _ = torch.ones(3).sum()
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import numpy as np
import torch

__all__ = ["INTERNAL_PREFIX", "internal_scope", "to_host"]

#: Label prefix of stepscope's own work in the profiler (see :mod:`stepscope.profile.accounting`).
INTERNAL_PREFIX = "stepscope.internal/"

_NOTHING: AbstractContextManager[None] = nullcontext()


def internal_scope(label: str) -> AbstractContextManager[object]:
    """A ``stepscope.internal/<label>`` profiler bracket if a profiler records, else a no-op.

    The check is one C call (``torch.autograd._profiler_enabled()``), so hot paths pay no
    ``record_function`` cost when nothing is profiling.
    """
    if torch.autograd._profiler_enabled():
        return torch.profiler.record_function(INTERNAL_PREFIX + label)
    return _NOTHING


def to_host(t: torch.Tensor) -> np.ndarray:
    """Copy ``t`` to a new host array (its own memory: device buffers are reused).

    The one place where staged rows and buffered scalars leave the device; profiled as
    stepscope's work (``stepscope.internal/collector.host_copy``).
    """
    with internal_scope("collector.host_copy"):
        return np.array(t.detach().to("cpu").numpy(), copy=True)
