"""Span capture at the ``op``, ``aten`` and ``grad_fn_fire`` altitudes: stepscope's one hook stack.

This is the only module in stepscope that registers autograd-node (``grad_fn``) hooks; a test
scans the package and fails on a second such site. Capture is opt-in per altitude because it
costs a Python call per op:

* ``op``: a ``TorchFunctionMode`` opens a span around each torch-level call made by user code
  (calls made inside a torch function are not re-entered, so this is the user's altitude).
* ``aten``: a ``TorchDispatchMode`` opens a span around each ATen operator.
* ``grad_fn_fire``: each autograd node created by an ``op``-level call gets a pre-hook and a hook
  that bracket its execution in backward.

Every mode is exited and every node hook handle removed by :meth:`AltitudeCapture.remove`, which
the session calls from its exit stack on every exit path. Hooks return ``None`` and never touch
tensors, so observed results are bitwise those of an unobserved run.

Example
-------
>>> import torch
>>> from stepscope.profile.spans import Altitude, SpanRegistry
>>> reg = SpanRegistry()
>>> cap = AltitudeCapture(reg, {Altitude.OP})
>>> cap.install()
>>> _ = torch.ones(2).add(1)
>>> cap.remove()
>>> sorted({s.name for s in reg.spans})
['Tensor.add', 'torch.ones']
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from stepscope.profile.spans import Altitude, OwnerClass, SpanRegistry

#: Altitudes this module can capture.
HOOK_ALTITUDES = frozenset({Altitude.OP, Altitude.ATEN, Altitude.GRAD_FN_FIRE})


def _func_name(func: Any) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if name is None:
        return repr(func)
    owner = getattr(func, "__objclass__", None)
    if owner is torch._C.TensorBase and not name.startswith("Tensor"):
        return f"Tensor.{name}"
    if name.startswith("_VariableFunctionsClass."):
        return "torch." + name[len("_VariableFunctionsClass.") :]
    if name.startswith("TensorBase."):
        return "Tensor." + name[len("TensorBase.") :]
    return name


class _OpMode(TorchFunctionMode):
    def __init__(self, capture: AltitudeCapture) -> None:
        super().__init__()
        self._capture = capture

    def __torch_function__(self, func, types, args=(), kwargs=None):
        capture = self._capture
        span = None
        if capture.record_op:
            span = capture.registry.open(_func_name(func), Altitude.OP, OwnerClass.FRAMEWORK)
        try:
            out = func(*args, **(kwargs or {}))
        finally:
            if span is not None:
                capture.registry.close(span)
        if capture.record_grad_fn:
            capture.hook_outputs(out)
        return out


class _AtenMode(TorchDispatchMode):
    def __init__(self, capture: AltitudeCapture) -> None:
        super().__init__()
        self._registry = capture.registry

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        span = self._registry.open(str(func.name()), Altitude.ATEN, OwnerClass.FRAMEWORK)
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self._registry.close(span)


class AltitudeCapture:
    """Installs and removes the span capture for a set of altitudes."""

    def __init__(self, registry: SpanRegistry, altitudes: Iterable[Altitude]) -> None:
        self.registry = registry
        wanted = frozenset(altitudes)
        self.record_op = Altitude.OP in wanted
        self.record_grad_fn = Altitude.GRAD_FN_FIRE in wanted
        self.record_aten = Altitude.ATEN in wanted
        self._modes: list[Any] = []
        self._handles: list[Any] = []
        self._hooked: set[int] = set()
        self._open_nodes: dict[int, list[Any]] = {}

    def install(self) -> None:
        """Enter the modes the altitudes need (idempotent per instance)."""
        if self._modes:
            return
        if self.record_op or self.record_grad_fn:
            mode = _OpMode(self)
            mode.__enter__()
            self._modes.append(mode)
        if self.record_aten:
            aten = _AtenMode(self)
            aten.__enter__()
            self._modes.append(aten)

    def hook_outputs(self, out: Any) -> None:
        """Bracket the autograd nodes of ``out`` (tensors, or tuples/lists of them)."""
        items = out if isinstance(out, (tuple, list)) else (out,)
        for item in items:
            node = getattr(item, "grad_fn", None) if isinstance(item, torch.Tensor) else None
            if node is None or id(node) in self._hooked:
                continue
            self._hooked.add(id(node))
            key = id(node)
            name = type(node).__name__
            self._handles.append(
                node.register_prehook(lambda grads, k=key, n=name: self._fire(k, n))
            )
            self._handles.append(node.register_hook(lambda gi, go, k=key: self._done(k)))

    def _fire(self, key: int, name: str) -> None:
        span = self.registry.open(name, Altitude.GRAD_FN_FIRE, OwnerClass.FRAMEWORK)
        self._open_nodes.setdefault(key, []).append(span)

    def _done(self, key: int) -> None:
        spans = self._open_nodes.get(key)
        if spans:
            self.registry.close(spans.pop())

    def remove(self) -> None:
        """Exit every mode (innermost first) and remove every node hook handle."""
        try:
            while self._modes:
                self._modes.pop().__exit__(None, None, None)
        finally:
            while self._handles:
                self._handles.pop().remove()
            self._hooked.clear()
            self._open_nodes.clear()

    @property
    def handle_count(self) -> int:
        """Node hook handles currently registered (zero after :meth:`remove`)."""
        return len(self._handles)
