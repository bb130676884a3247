"""What a hook may reduce: the tensor inside a module's output, and whether it is reducible.

Output rule (documented in ``docs/sites.md``)
-------------------------------------------------
A module's activation is the **first tensor found depth-first** in its output: a tensor is
itself; a ``dict``/``Mapping`` (``ModelOutput``, ``OrderedDict``) is searched in insertion order
of its values; a dataclass in field order; a ``tuple``/``list`` in order; ``None`` values are
skipped; other objects are not searched, nor anything nested deeper than
:data:`MAX_DEPTH` levels. ``WatchSettings(output_keys={glob: path})`` names the tensor instead: a
dotted path of mapping keys, attribute names and sequence indices (``"logits"``,
``"0"``, ``"hidden_states.-1"``), for the sites whose qualified name matches ``glob``.
An output with no tensor records ``unsupported`` with reason ``no_tensor_output``; a named path
that does not resolve records ``unsupported`` with reason ``output_key_missing``.

Reducibility
------------
:func:`reducible` decides before any kernel runs: complex dtypes, dtypes with no order
(``unsupported:complex``; a dtype the kernels refuse, ``unsupported:dtype``), tensor subclasses
other than ``DTensor`` such as fake tensors (``unsupported:tensor_subclass``, whose storage the
native kernel must not read; a ``DTensor`` reduces its local shard, see :mod:`.sharded`) and
hooks firing during CUDA-graph stream capture (``unsupported:cuda_graph_capture``: the capture's
replays are not observed). Sparse tensors are reduced over their stored values with the
disclosure ``sparse_values`` (implicit zeros are not counted).

Example
-------
>>> import torch
>>> t = torch.ones(2, 3)
>>> find_tensor({"loss": None, "logits": (t,)}) is t, find_tensor([None, "x"])
(True, None)
>>> find_path({"logits": (t,)}, "logits.0") is t
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from stepscope.collect.sharded import local_part

MAX_DEPTH = 4


def _children(value: Any) -> list[Any] | None:
    if isinstance(value, Mapping):
        return list(value.values())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, f.name) for f in dataclasses.fields(value)]
    if isinstance(value, (tuple, list)):
        return list(value)
    return None


def find_tensor(output: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor depth-first in ``output`` (the rule above), or ``None``."""
    if isinstance(output, torch.Tensor):
        return output
    if depth >= MAX_DEPTH:
        return None
    children = _children(output)
    for child in children or ():
        if child is not None:
            found = find_tensor(child, depth + 1)
            if found is not None:
                return found
    return None


def find_path(output: Any, path: str) -> torch.Tensor | None:
    """The tensor at a dotted ``path`` of keys, attributes and indices (``None``: not there)."""
    value = output
    for part in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(part)
        elif isinstance(value, (tuple, list)):
            try:
                value = value[int(part)]
            except (ValueError, IndexError):
                return None
        else:
            value = getattr(value, part, None)
        if value is None:
            return None
    return value if isinstance(value, torch.Tensor) else None


def module_output(output: Any, key: str | None) -> tuple[torch.Tensor | None, str | None]:
    """``(tensor, None)``, or ``(None, reason)`` when the output holds no reducible tensor."""
    if key is None:
        t = find_tensor(output)
        return (t, None) if t is not None else (None, "no_tensor_output")
    t = find_path(output, key)
    return (t, None) if t is not None else (None, f"output_key_missing:{key}")


def _not_capturing() -> bool:
    return False


#: the CUDA-graph capture probe (tests substitute it on the CPU)
capture_probe = (
    torch.cuda.is_current_stream_capturing if torch.cuda.is_available() else _not_capturing
)


def reducible(t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """``(tensor to reduce, disclosure or None)``, or ``(None, unsupported reason)``."""
    if capture_probe():
        return None, "cuda_graph_capture"
    t = t.detach()
    if type(t) is not torch.Tensor:  # a DTensor: its local shard (see .sharded)
        local, reason = local_part(t)
        if local is None:  # FakeTensor, other subclasses (detach keeps them), Partial DTensors
            return None, reason
        t = local
    if t.layout is torch.strided and not t.is_meta and not t.is_complex():
        return t, None  # the common case, decided as the checks below decide it
    note = None
    if t.layout is not torch.strided:
        if t.layout is torch.sparse_coo:
            t = t.coalesce().values()
        elif t.layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
            t = t.values()
        else:
            return None, f"layout:{str(t.layout).replace('torch.', '')}"
        note = "sparse_values"
    if t.is_complex():  # other dtypes the kernels refuse are caught by the collector
        return None, f"complex:{str(t.dtype).replace('torch.', '')}"
    if t.device.type == "meta":
        return None, "meta_tensor"
    return t, note


#: Unsupported reason (and ``skipped_calls:`` disclosure) of a call under a ``torch.func`` transform.
TORCH_FUNC = "torch_func"

_functorch = getattr(torch._C, "_functorch", None)


def under_transform(t: torch.Tensor) -> bool:
    """Whether ``t`` is a ``torch.func`` (functorch) wrapper: a module called inside ``vmap``,
    ``grad`` or ``jvp``. Its values live in the transform's batched view, not in a storage a
    kernel may read."""
    return (
        _functorch is not None
        and _functorch.peek_interpreter_stack() is not None
        and _functorch.is_functorch_wrapped_tensor(t)
    )


_graph_task_id = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread (a checkpoint recompute
    is the only forward that happens there)."""
    return _graph_task_id() != -1
