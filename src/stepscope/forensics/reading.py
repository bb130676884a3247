"""Every-step reading of the flight recorder's per-site scalars: its own hooks, cheap reductions.

:class:`SiteReader` reads, at every step and independently of the collector's cadence,

* at each watched optimizer's step pre-hook: the gradient norms (one fused ``_foreach_norm``
  per device and dtype; with ``optimizer.step(closure)`` at the post-hook instead, since the
  closure's backward runs inside the step) and a copy of each parameter's seeded update
  subvector;
* at its step post-hook: the same subvectors after the step (their differences are the update),
  and the parameters' norms;
* at each selected module's forward hook during a training forward: the output's minimum and
  maximum (one vectorized ``aminmax`` pass, no copy), whose larger magnitude is ``max |a|``.

Nothing is read back on the device side: :meth:`SiteReader.read` stacks the step's 0-d results
and copies them to the host once per step (:func:`stepscope.transfer.to_host`). No RNG is
consumed (the subvector indices are fixed when the reader is built) and nothing the training
step reads is written. The fields are defined in :mod:`stepscope.forensics.channels`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from stepscope.forensics.channels import Channel
from stepscope.stats import _native
from stepscope.stats.gather import SampleGather, gatherable
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
    native
        Sample the plain contiguous CPU float32/float64 parameters with one native call per
        direction (:class:`~stepscope.stats.gather.SampleGather`); the others one by one.
    charge
        Called with the seconds each hook took (the collector counts them as telemetry).
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
        native: bool = True,
        charge: Callable[[float], None] | None = None,
    ) -> None:
        self.charge = charge or (lambda seconds: None)
        self.params = [p for _, p in params]
        self._lib = _native.loaded() if native else None
        # per optimizer: (its owned indices, the gatherable ones, their SampleGather)
        self._plans: dict[int, tuple[list[int], list[int], SampleGather | None]] = {}
        self.streams = frozenset(streams)
        self.select, self.training_forward = select, training_forward
        col = {(c.site, c.field): i for i, c in enumerate(channels)}
        self.width = len(channels)
        self.grad_norm_col = col[("<run>", "grad_norm")]
        names = [n for n, _ in params]
        self._cols = {
            f: np.array([col.get((n, f), -1) for n in names], dtype=np.int64) for f in _PARAM_FIELDS
        }
        self.modules = list(modules) if "activation" in self.streams else []
        self._act_cols = np.array([col[(n, "act_absmax")] for n, _ in self.modules], dtype=np.int64)
        self._mod_index = {id(m): j for j, (_, m) in enumerate(self.modules)}
        self._numel = [local(p).numel() for p in self.params]
        self._index = [sample_index(n, p) for n, p in params] if "update" in self.streams else []
        sample_n = [n if ix is None else len(ix) for n, ix in zip(self._numel, self._index)]
        self._sqrt_numel = np.sqrt(np.asarray(self._numel, dtype=np.float64))
        self._sqrt_sample = np.sqrt(np.asarray(sample_n or self._numel, dtype=np.float64))
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

    def _gather_plan(
        self, optimizer: Any, owned: list[int]
    ) -> tuple[list[int], SampleGather | None]:
        """The gatherable parameters of ``optimizer`` and their one-call sample plan."""
        hit = self._plans.get(id(optimizer))
        if hit is not None and hit[0] is owned:
            return hit[1], hit[2]
        native: list[int] = []
        plan = None
        if self._lib is not None:
            native = [i for i in owned if gatherable(local(self.params[i]))]
            if native:
                tensors = [local(self.params[i]) for i in native]
                plan = SampleGather(tensors, [self._index[i] for i in native], self._lib)
        self._plans[id(optimizer)] = (owned, native, plan)
        return native, plan

    def _sample(self, i: int, copy: bool = True) -> torch.Tensor:
        """Parameter ``i``'s update subvector now (``copy=False``: a view where it can be)."""
        flat = local(self.params[i]).reshape(-1)
        ix = self._index[i]
        if ix is not None:
            s = flat.index_select(0, ix)
        else:
            s = flat.clone() if copy else flat
        # float16/bfloat16: the difference after - before is taken in float32 (never rounded)
        return s.float() if s.dtype in (torch.float16, torch.bfloat16) else s

    def _read_gradients(self, owned: Sequence[int]) -> None:
        gi = [i for i in owned if self.params[i].grad is not None and i not in self._grad]
        if gi:
            self._grad.update(gi)
            self._parts.append(("grad", gi, _norms([local(self.params[i].grad) for i in gi])))  # type: ignore[arg-type]

    def _fail(self, e: BaseException) -> None:
        """A hook failed: every hook returns at once from now on (warned once)."""
        if self.live:
            self.live = False
            warnings.warn(
                f"stepscope: the flight recorder stopped ({type(e).__name__}: {e}); the "
                "collector carries on without it.",
                RuntimeWarning,
                stacklevel=3,
            )

    def _pre_step(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            self._pre_step_body(optimizer, args, kwargs)
        except Exception as e:  # telemetry never raises into the training step
            self._fail(e)
        finally:
            self.charge(time.perf_counter() - t0)

    def _post_step(self, optimizer: Any, *args: Any) -> None:
        t0 = time.perf_counter()
        try:
            self._post_step_body(optimizer, *args)
        except Exception as e:  # telemetry never raises into the training step
            self._fail(e)
        finally:
            self.charge(time.perf_counter() - t0)

    def _forward_hook(self, module: torch.nn.Module, inputs: Any, output: Any) -> None:
        t0 = time.perf_counter()
        try:
            self._forward_hook_body(module, inputs, output)
        except Exception as e:  # telemetry never raises into the training step
            self._fail(e)
        finally:
            self.charge(time.perf_counter() - t0)

    def _pre_step_body(self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
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
                native, plan = self._gather_plan(optimizer, owned)
                if plan is not None and plan.bind([local(self.params[i]) for i in native]):
                    plan.gather(subtract=False)  # every gatherable sample in one call
                    self._native[id(optimizer)] = (native, _norms(plan.samples), plan)
                    self._before.update(dict.fromkeys(native))  # type: ignore[arg-type]
                for i in owned:
                    if i not in self._before:
                        self._before[i] = self._sample(i)

    def _post_step_body(self, optimizer: Any, *_args: Any) -> None:
        if not self.live or id(optimizer) in self._post_done:
            return
        self._post_done.add(id(optimizer))
        owned = self._owned_by(optimizer)
        with torch.no_grad():
            if "gradient" in self.streams and id(optimizer) in self._after_closure:
                self._read_gradients(owned)
            if "update" in self.streams:
                hit = self._native.pop(id(optimizer), None)
                if hit is not None:
                    native, before_norms, plan = hit
                    if plan.bind([local(self.params[i]) for i in native]):
                        plan.gather(subtract=True)  # the samples become after - before
                        self._update.update(native)
                        self._parts.append(("delta", native, _norms(plan.samples)))
                        self._parts.append(("before", native, before_norms))
                    for i in native:
                        self._before.pop(i, None)
                ui = [i for i in owned if i in self._before and i not in self._update]
                if ui:
                    self._update.update(ui)
                    before = [self._before.pop(i) for i in ui]
                    delta = torch._foreach_sub([self._sample(i, copy=False) for i in ui], before)
                    self._parts.append(("delta", ui, _norms(delta)))
                    self._parts.append(("before", ui, _norms(before)))
            if "parameter" in self.streams:
                pi = [i for i in owned if i not in self._param]
                if pi:
                    self._param.update(pi)
                    self._parts.append(("param", pi, _norms([local(self.params[i]) for i in pi])))

    def _forward_hook_body(self, module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if not self.live or torch.compiler.is_compiling() or not self.training_forward():
            return
        j = self._mod_index[id(module)]
        t = self.select(self.modules[j][0], output)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        with torch.no_grad():  # one vectorized pass (vector_norm(inf) is ~80x slower on CPU)
            self._acts[j].extend(torch.aminmax(t.detach()))

    # ------------------------------------------------------------------ per step
    def begin_step(self) -> None:
        """Forget the previous step's readings."""
        self._pre_done: set[int] = set()
        self._post_done: set[int] = set()
        self._after_closure: set[int] = set()  # optimizers stepped with a closure
        self._grad: set[int] = set()  # parameters whose gradient norm was read this step
        self._update: set[int] = set()
        self._param: set[int] = set()
        self._before: dict[int, torch.Tensor] = {}
        # per optimizer: its natively sampled parameters, their pre-step norms, the plan
        self._native: dict[int, tuple[list[int], list[torch.Tensor], SampleGather]] = {}
        # (kind, parameter indices, their 0-d norms), in the order they were read
        self._parts: list[tuple[str, list[int], list[torch.Tensor]]] = []
        self._acts: list[list[torch.Tensor]] = [[] for _ in self.modules]

    def read(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, present)`` of the step (float64 and bool, one per channel; ``loss``
        absent), then :meth:`begin_step`. One host copy per device and dtype."""
        tensors = [t for _, _, ts in self._parts for t in ts]
        act_sites = [j for j, a in enumerate(self._acts) for _ in a]
        tensors += [t for a in self._acts for t in a]
        host = _to_host(tensors)
        values = np.full(self.width, np.nan)
        present = np.zeros(self.width, dtype=bool)
        got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        k = 0
        for kind, idx, ts in self._parts:
            i = np.asarray(idx, dtype=np.int64)
            prev = got.get(kind)
            v = host[k : k + len(ts)]
            got[kind] = (i, v) if prev is None else (np.r_[prev[0], i], np.r_[prev[1], v])
            k += len(ts)
        if "grad" in got:
            i, n = got["grad"]
            self._put(values, present, "grad_rms", i, n / self._sqrt_numel[i])
            values[self.grad_norm_col] = float(np.sqrt(np.sum(n**2)))
            present[self.grad_norm_col] = True
        if "delta" in got:
            (i, d), (_, b) = got["delta"], got["before"]
            self._put(values, present, "update_rms", i, d / self._sqrt_sample[i])
            nonzero = b > 0  # a zero parameter (a fresh bias) has no ratio: absent, never inf
            self._put(values, present, "update_ratio", i[nonzero], d[nonzero] / b[nonzero])
        if "param" in got:
            i, n = got["param"]
            self._put(values, present, "param_rms", i, n / self._sqrt_numel[i])
        if act_sites:  # (min, max) pairs: max |a| over the step's forwards (NaN when any is)
            a = np.abs(host[k:])
            sites = np.asarray(act_sites, dtype=np.int64)
            absmax = np.full(len(self.modules), -np.inf)
            np.fmax.at(absmax, sites, a)
            nan = np.zeros(len(self.modules), dtype=bool)
            np.logical_or.at(nan, sites, np.isnan(a))
            absmax[nan] = np.nan
            seen = np.unique(sites)
            cols = self._act_cols[seen]
            values[cols], present[cols] = absmax[seen], True
        self.begin_step()
        return values, present

    def _put(
        self, values: np.ndarray, present: np.ndarray, field: str, i: np.ndarray, v: np.ndarray
    ) -> None:
        cols = self._cols[field][i]
        keep = cols >= 0
        values[cols[keep]], present[cols[keep]] = v[keep], True


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
