"""Every-step reading of the flight recorder's per-site scalars: its own hooks, cheap reductions.

:class:`SiteReader` reads, at every step and independently of the collector's cadence,

* at each watched optimizer's step pre-hook: the gradient norms (one fused ``_foreach_norm``
  per device and dtype; with ``optimizer.step(closure)`` at the post-hook instead, since the
  closure's backward runs inside the step) and a copy of each parameter's seeded update
  subvector;
* at its step post-hook: the same subvectors after the step (their differences are the update),
  and the parameters' norms;
* at each selected module's forward hook during a training forward: the output's ``max |a|``
  (one reduction, no copy).

Nothing is read back on the device side: :meth:`SiteReader.read` stacks the step's 0-d results
and copies them to the host once per step (:func:`stepscope.transfer.to_host`). No RNG is
consumed (the subvector indices are fixed when the reader is built) and nothing the training
step reads is written. The fields are defined in :mod:`stepscope.forensics.channels`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from stepscope.forensics.channels import Channel
from stepscope.stephooks import OuterStepHooks
from stepscope.transfer import to_host

__all__ = ["SiteReader", "local"]

Select = Callable[[str, Any], "torch.Tensor | None"]


def local(t: torch.Tensor) -> torch.Tensor:
    """``t`` detached; a ``DTensor`` (FSDP2) as its local shard (never a collective)."""
    t = t.detach()
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _norms(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """L2 norms of ``tensors`` (0-d, on their devices): one fused call per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out: list[Any] = [None] * len(tensors)
    for idx in groups.values():
        part = [tensors[i] for i in idx]
        try:
            norms = list(torch._foreach_norm(part))
        except (RuntimeError, TypeError, NotImplementedError):  # e.g. a sparse gradient
            norms = [torch.linalg.vector_norm(t.to_dense() if t.is_sparse else t) for t in part]
        for i, n in zip(idx, norms):
            out[i] = n
    return out


class SiteReader:
    """The recorder's hooks and the readings of the current step.

    Parameters
    ----------
    params
        ``(site, parameter)`` pairs (each parameter once).
    modules
        ``(site, module)`` activation sites (used when ``"activation"`` is in ``streams``).
    streams
        The recorder's streams (:data:`~stepscope.forensics.channels.RECORDER_STREAMS`).
    channels
        The window's columns (:func:`~stepscope.forensics.channels.build_channels`).
    sample_index
        ``(site, parameter) -> indices`` of its update subvector (``None``: the whole parameter).
    select
        ``(site, module output) -> tensor`` whose ``max |a|`` is the site's activation
        (``None``: the output holds none).
    training_forward
        Whether a forward running now is a training forward of the current step.
    """

    def __init__(
        self,
        params: Sequence[tuple[str, torch.nn.Parameter]],
        modules: Sequence[tuple[str, torch.nn.Module]],
        streams: Sequence[str],
        channels: Sequence[Channel],
        sample_index: Callable[[str, torch.nn.Parameter], torch.Tensor | None],
        select: Select,
        training_forward: Callable[[], bool],
    ) -> None:
        self.params = [p for _, p in params]
        self.streams = frozenset(streams)
        self.select, self.training_forward = select, training_forward
        col = {(c.site, c.field): i for i, c in enumerate(channels)}
        self.width = len(channels)
        self.grad_norm_col = col[("<run>", "grad_norm")]
        names = [n for n, _ in params]
        self._col = {f: [col.get((n, f), -1) for n in names] for f in _PARAM_FIELDS}
        self.modules = list(modules) if "activation" in self.streams else []
        self._act_col = [col[(n, "act_absmax")] for n, _ in self.modules]
        self._mod_index = {id(m): j for j, (_, m) in enumerate(self.modules)}
        self._numel = [local(p).numel() for p in self.params]
        self._index = [sample_index(n, p) for n, p in params] if "update" in self.streams else []
        self._sample_n = [
            n if ix is None else len(ix) for n, ix in zip(self._numel, self._index)
        ]
        self._owned: dict[int, tuple[tuple[int, ...], list[int]]] = {}
        self._opt_handles: dict[int, list[Any]] = {}
        self._mod_handles: list[Any] = []
        self.live = True  # False: every hook returns at once (the recorder was stopped)
        self.begin_step()

    # ------------------------------------------------------------------ hooks
    def attach_modules(self) -> None:
        """Register the forward hooks of the activation sites."""
        for _, m in self.modules:
            self._mod_handles.append(m.register_forward_hook(self._forward_hook))

    def attach_optimizer(self, optimizer: Any) -> None:
        """Register the step pre/post hooks of ``optimizer`` (idempotent)."""
        if id(optimizer) in self._opt_handles or not hasattr(optimizer, "register_step_pre_hook"):
            return
        hooks = OuterStepHooks(optimizer, self._pre_step, self._post_step)
        # the post-hook runs first: an implicit collector's own post-hook ends the step
        post = hooks.handles[1]
        table = post.hooks_dict_ref()
        if table is not None and post.id in table:
            table.move_to_end(post.id, last=False)
        self._opt_handles[id(optimizer)] = [hooks]

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        handles = [*self._mod_handles, *(h for hs in self._opt_handles.values() for h in hs)]
        self._mod_handles, self._opt_handles = [], {}
        for h in handles:
            h.remove()

    def _owned_by(self, optimizer: Any) -> list[int]:
        """Indices of the watched parameters ``optimizer`` steps (cached per group layout)."""
        key = tuple(len(g["params"]) for g in optimizer.param_groups)
        hit = self._owned.get(id(optimizer))
        if hit is not None and hit[0] == key:
            return hit[1]
        ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
        owned = [i for i, p in enumerate(self.params) if id(p) in ids]
        self._owned[id(optimizer)] = (key, owned)
        return owned

    def _sample(self, i: int) -> torch.Tensor:
        flat = local(self.params[i]).reshape(-1)
        ix = self._index[i]
        s = flat.clone() if ix is None else flat.index_select(0, ix)
        # float16/bfloat16: the difference after - before is taken in float32 (never rounded)
        return s.float() if s.dtype in (torch.float16, torch.bfloat16) else s

    def _read_gradients(self, owned: Sequence[int]) -> None:
        gi = [i for i in owned if self.params[i].grad is not None and i not in self._grad]
        for i, n in zip(gi, _norms([local(self.params[i].grad) for i in gi])):  # type: ignore[arg-type]
            self._grad[i] = n

    def _pre_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.live or id(optimizer) in self._pre_done:
            return
        self._pre_done.add(id(optimizer))
        owned = self._owned_by(optimizer)
        # optimizer.step(closure) (Lightning): the backward runs inside step(), so the gradients
        # it consumed are read at the post-hook (torch's optimizers never write .grad)
        closure = args[0] if args else kwargs.get("closure")
        if closure is not None:
            self._after_closure.add(id(optimizer))
        with torch.no_grad():
            if "gradient" in self.streams and closure is None:
                self._read_gradients(owned)
            if "update" in self.streams:
                for i in owned:
                    self._before.setdefault(i, self._sample(i))

    def _post_step(self, optimizer: Any, *_args: Any) -> None:
        if not self.live or id(optimizer) in self._post_done:
            return
        self._post_done.add(id(optimizer))
        owned = self._owned_by(optimizer)
        with torch.no_grad():
            if "gradient" in self.streams and id(optimizer) in self._after_closure:
                self._read_gradients(owned)
            if "update" in self.streams:
                ui = [i for i in owned if i in self._before and i not in self._update]
                before = [self._before[i] for i in ui]
                if ui:
                    delta = torch._foreach_sub([self._sample(i) for i in ui], before)
                    for i, d, b in zip(ui, _norms(delta), _norms(before)):
                        self._update[i] = (d, b)
            if "parameter" in self.streams:
                pi = [i for i in owned if i not in self._param]
                for i, n in zip(pi, _norms([local(self.params[i]) for i in pi])):
                    self._param[i] = n

    def _forward_hook(self, module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if not self.live or torch.compiler.is_compiling() or not self.training_forward():
            return
        j = self._mod_index[id(module)]
        t = self.select(self.modules[j][0], output)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        with torch.no_grad():
            self._acts[j].append(torch.linalg.vector_norm(t.detach(), math.inf))

    # ------------------------------------------------------------------ per step
    def begin_step(self) -> None:
        """Forget the previous step's readings."""
        self._pre_done: set[int] = set()
        self._post_done: set[int] = set()
        self._after_closure: set[int] = set()  # optimizers stepped with a closure
        self._grad: dict[int, torch.Tensor] = {}
        self._before: dict[int, torch.Tensor] = {}
        self._update: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._param: dict[int, torch.Tensor] = {}
        self._acts: list[list[torch.Tensor]] = [[] for _ in self.modules]

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, present)`` of the step (float64 and bool, one per channel; ``loss``
        absent), then :meth:`begin_step`. One host copy per device and dtype."""
        tensors: list[torch.Tensor] = []
        tensors += self._grad.values()
        for d, b in self._update.values():
            tensors += (d, b)
        tensors += self._param.values()
        acts = [len(a) for a in self._acts]
        for a in self._acts:
            tensors += a
        host = _to_host(tensors)
        values = np.full(self.width, np.nan)
        present = np.zeros(self.width, dtype=bool)
        k = 0
        grads = host[: len(self._grad)]
        for i, n in zip(self._grad, grads):
            self._put(values, present, self._col["grad_rms"][i], n / math.sqrt(self._numel[i]))
        if len(grads):
            self._put(values, present, self.grad_norm_col, float(np.sqrt(np.sum(grads**2))))
        k = len(grads)
        for i in self._update:
            d, b = host[k], host[k + 1]
            k += 2
            self._put(values, present, self._col["update_rms"][i], d / math.sqrt(self._sample_n[i]))
            if b > 0:  # a zero parameter (a fresh bias) has no ratio: absent, never inf
                self._put(values, present, self._col["update_ratio"][i], d / b)
        for i in self._param:
            self._put(values, present, self._col["param_rms"][i], host[k] / math.sqrt(self._numel[i]))
            k += 1
        for j, n in enumerate(acts):
            if n:
                self._put(values, present, self._act_col[j], float(np.max(host[k : k + n])))
            k += n
        self.begin_step()
        return values, present

    @staticmethod
    def _put(values: np.ndarray, present: np.ndarray, col: int, v: float) -> None:
        if col >= 0:
            values[col], present[col] = v, True


_PARAM_FIELDS = ("grad_rms", "update_rms", "update_ratio", "param_rms")


def _to_host(tensors: Sequence[torch.Tensor]) -> np.ndarray:
    """The 0-d ``tensors`` as one float64 host vector, in order (one copy per device/dtype)."""
    if not tensors:
        return np.zeros(0)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    out = np.empty(len(tensors))
    for idx in groups.values():
        out[idx] = to_host(torch.stack([tensors[i] for i in idx])).astype(np.float64)
    return out
