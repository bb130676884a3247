"""Activation sites: the forward hooks of the selected modules.

Which forwards count
--------------------
A forward belongs to the step's ``activation`` / ``activation_grad`` rows when it is a
*training* forward: grad mode on and not ``inference_mode`` where the model itself was called
(read by a pre-hook on the model, so the ``no_grad`` forward of a reentrant checkpoint, or a
teacher forward under ``no_grad``/``inference_mode``, inside a training forward still counts),
not inside a backward (the recompute of activation checkpointing runs there), not inside
:meth:`HistoryCollector.telemetry` (probes), and the model is in training mode or an explicit
step transaction is open. Several training forwards of one
step (micro-batches, a module called twice) merge exactly into one row.

``torch.func`` transforms
-------------------------
A module called inside ``torch.func.vmap``/``grad``/``jvp`` outputs a functorch-wrapped tensor
(no storage of its own to reduce): that call is skipped. The row is ``unsupported:torch_func``
when no other call of the step was observed, else observed with the disclosure
``skipped_calls:torch_func`` (its statistics cover the other calls only).

Compiled regions
----------------
Inside a region compiled by ``torch.compile`` (either order: compile then collect, or collect
then compile) the hooks do nothing, so they cause no graph break (``torch._dynamo.explain``
counts 0 for the collector's hooks); the activation rows of such a step are ``unsupported``
with reason ``torch_compile``. Gradients, parameters and updates are read by the optimizer's
hooks outside compiled code and are recorded as usual.

Quiet steps
-----------
On a step where neither activation stream is due (nine in ten at the default cadence) and every
row has been discovered, a module whose only forward hook is the collector's has it taken off
(:meth:`ActivationSites.rest`): torch then calls the module on its hook-free fast path, which
costs nothing per call. The hook is registered again before the next due step, in front of any
hook registered since (so the order among hooks is the original one). Modules with other
forward hooks keep theirs (they pay torch's hooked call path anyway), and once a compiled
region or a compiled model was seen the hooks stay on (no recompilation for a changed hook set).

The model's own pre/post hooks (where it is called, for model surgery and training forwards)
rest on quiet steps too, while they are its only ones and no frame was ever compiled in the
process (:func:`compiled_frames`). A model compiled while they rest is traced without any
of the collector's hooks (torch does not guard on hooks), so when ``torch.compile`` converted
a frame during a rest, the hooks stay on from then on and every due step's unobserved
activation rows read ``unsupported`` (``torch_compile``), never ``site_absent``: whether such
a module ran can no longer be seen.

Which tensor, which site
------------------------
The tensor is found by the rule of :mod:`stepscope.collect.staging`; its structural signature
(dtype and rank, see :func:`~stepscope.collect.sites.output_signature`) names the site. A
module with no tensor output is ``unsupported`` (``no_tensor_output``); a module that has not
run by the end of a due step is registered with signature ``not_run`` and recorded
``site_absent`` (that site ends with reason ``first_run`` when it does run).
"""

from __future__ import annotations

import fnmatch
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from stepscope.collect.sites import (
    ACTIVATION_STREAMS,
    NO_TENSOR,
    NOT_RUN,
    ROOT_SITE,
    SiteRow,
    output_signature,
    unwrap_compiled,
)
from stepscope.collect.staging import (
    TORCH_FUNC,
    Reducer,
    in_backward,
    module_output,
    under_transform,
)
from stepscope.collect.step import OpenStep, StepState


class ActivationSites:
    """Forward hooks (one per selected module, two on the model) and the activation rows.

    Parameters
    ----------
    step
        The collector's open step: the hooks record into its state (never begin or end one).
    reducer
        Where an observed output (and its gradient) is reduced.
    catalog
        The site catalog (a discovered or changed output registers a site there).
    check_structure
        The collector's model-surgery check, run before a step's first forward.
    model, modules, rows, output_keys
        The watched model, its selected ``(name, module)`` pairs, every row, and
        ``WatchSettings.output_keys``.
    """

    def __init__(
        self,
        step: OpenStep,
        reducer: Reducer,
        catalog: Any,
        check_structure: Callable[[], None],
        model: torch.nn.Module,
        modules: Sequence[tuple[str, torch.nn.Module]],
        rows: Sequence[SiteRow],
        output_keys: Mapping[str, str],
    ) -> None:
        self.step, self.reducer, self.catalog = step, reducer, catalog
        self.check_structure, self.model = check_structure, model
        self.rows: dict[int, dict[str, SiteRow]] = {}  # id(module) -> {stream: row}
        for r in rows:
            if r.stream in ACTIVATION_STREAMS:
                self.rows.setdefault(id(r.module), {})[r.stream] = r
        #: qualified name -> the module object the rows are bound to
        self.bound = {name or ROOT_SITE: module for name, module in modules}
        self.keys = {
            site: next((k for g, k in output_keys.items() if fnmatch.fnmatchcase(site, g)), None)
            for site in self.bound
        }
        self._handles: dict[int, Any] = {}
        #: modules whose hook is off for a quiet step (see :meth:`rest`)
        self._resting: list[tuple[torch.nn.Module, Any]] = []  # hooks taken off, handles kept
        #: a compiled model or region was seen: the hooks stay on from then on
        self._compiled_seen = model is not unwrap_compiled(model)
        self._root: list[Any] = []
        #: the model's own pre/post hooks may rest on quiet steps too (nothing else reads where
        #: the model is called then; the collector turns this off for its flight recorder)
        self.rest_root = True
        self._root_resting = False
        self._rest_frames: int | None = None  # compiled_frames() when the root hooks rested
        self._blind = False  # compiled while resting: no unobserved row is known to be absent
        self._depth, self._root_grad = 0, True
        #: output signatures by (dtype, rank): formatted once, not per hook call
        self._signatures: dict[tuple[torch.dtype, int], str] = {}
        #: a hook fired while ``torch.compile`` traced the model (set again by every replay)
        self.compiled = False
        self._discovered: bool | None = None  # every row has a signature (None: recompute)
        #: modules whose output takes :meth:`Reducer.direct`: id -> (row, dtype, rank) of its
        #: one activation row, bound to that signature (forgotten when its rows are bound again
        #: or the module is replaced)
        self._direct: dict[int, tuple[SiteRow, torch.dtype, int]] = {}
        self._registered: bool | None = None  # every row has a site (None: recompute)

    def attach(self) -> None:
        """Register the hooks (the model's own pre/post hooks track where it was called)."""
        for module in self.bound.values():
            self._hook(module)
        self._root = [
            self.model.register_forward_pre_hook(self._enter),
            self.model.register_forward_hook(self._exit, always_call=True),
        ]

    def _hook(self, module: torch.nn.Module) -> None:
        if id(module) in self.rows and id(module) not in self._handles:
            self._handles[id(module)] = module.register_forward_hook(self._forward_hook)

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for h in [*self._root, *self._handles.values()]:
            h.remove()
        self._root, self._handles, self._resting = [], {}, []

    def rest(self, quiet: bool) -> None:
        """A step begins: take the module hooks off for a ``quiet`` step, or put them back.

        A hook is taken off only where it is the module's sole forward hook, once every row is
        discovered and no compiled region was seen; it goes back in front of any forward hook
        registered meanwhile (where it stood before: those came after the collector's).
        """
        if quiet and self._resting and self._discovered and not self._compiled_seen:
            return  # resting since an earlier quiet step, nothing changed since
        if quiet and not self._compiled_seen and self._all_discovered():
            if self._resting:
                return
            self._rest_root(True)
            for module in self.bound.values():
                handle = self._handles.get(id(module))
                hooks = module._forward_hooks
                if handle is not None and len(hooks) == 1 and handle.id in hooks:
                    del hooks[handle.id]  # what handle.remove() does for a plain forward hook
                    del self._handles[id(module)]
                    self._resting.append((module, handle))
            return
        self._rest_root(False)
        resting, self._resting = self._resting, []
        for module, handle in resting:
            if id(module) in self.rows and id(module) not in self._handles:
                # back under its own handle (what register_forward_hook(prepend=...) does,
                # without a new handle per module and step)
                hooks = module._forward_hooks
                first = bool(hooks)
                hooks[handle.id] = self._forward_hook
                if first:
                    hooks.move_to_end(handle.id, last=False)  # type: ignore[attr-defined]
                self._handles[id(module)] = handle

    def _rest_root(self, rest: bool) -> None:
        """Take the model's own pre/post hooks off (``rest``), or put them back in front of
        any hook registered meanwhile (where they stood: they rest only as the model's sole
        forward pre-hook and forward hook, so every other one came after them).

        They rest only between calls of the model (depth 0): a quiet step reads nothing
        where the model is called, and model surgery is looked for at steps with rows.
        """
        if rest == self._root_resting or len(self._root) != 2:
            return
        model, (pre, post) = self.model, self._root
        tables = [
            (model._forward_pre_hooks, pre, self._enter),
            (model._forward_hooks, post, self._exit),
        ]
        if rest:
            frames = compiled_frames()
            if not self.rest_root or self._depth or frames != 0:
                return
            if any(len(hooks) != 1 or h.id not in hooks for hooks, h, _ in tables):
                return  # the model has hooks of its own (torch's slow path anyway)
            for hooks, h, _ in tables:
                del hooks[h.id]
            model._forward_hooks_always_called.pop(post.id, None)
            self._rest_frames = frames
        else:
            if compiled_frames() != self._rest_frames:  # compiled while no hook was on
                self._blind = self._compiled_seen = True
            for hooks, h, fn in tables:
                hooks[h.id] = fn
                hooks.move_to_end(h.id, last=False)  # type: ignore[attr-defined]
            model._forward_hooks_always_called[post.id] = True
        self._root_resting = rest

    def _enter(self, _module: torch.nn.Module, _inputs: Any) -> None:
        if torch.compiler.is_compiling():  # the model's own hooks are on on every step
            self.compiled = self._compiled_seen = True
            return
        self._depth += 1
        if self._depth == 1:
            self._root_grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            state = self.step.state
            if state is not None:
                state.hook_calls += 2  # the model's own pre and post hooks
            if state is not None and not state.structure_checked:
                try:
                    self.check_structure()  # model surgery, before the first forward
                except Exception:  # never in the user's step; retried at the step's end
                    state.structure_checked = False

    def _exit(self, *_args: Any) -> None:
        if torch.compiler.is_compiling():
            return
        self._depth = max(0, self._depth - 1)

    def training_forward(self) -> bool:
        """Whether a forward running now is a training forward of the current step."""
        if in_backward():
            return False
        if self._depth:  # inside the model's call: its mode decides (docs/sites.md)
            grad = self._root_grad
        else:
            grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
        step = self.step  # the collector's half: a step is recorded, in training or a transaction
        return (
            grad and step.recording() is not None and (self.model.training or step.in_transaction)
        )

    def _forward_hook(self, module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        if torch.compiler.is_compiling():  # inside a compiled region: no graph break, no row
            self.compiled = self._compiled_seen = True
            return
        state = self.step.state
        if state is None:  # between steps (closed, or a step that failed to begin)
            return
        if state.activations_quiet and self._all_discovered():  # nine steps in ten by default
            state.hook_calls += 1
            return
        t0, charged = time.perf_counter(), state.telemetry_s
        try:
            if not self.training_forward():
                return
            direct = self._direct.get(id(module))
            if (
                direct is not None
                and output.__class__ is torch.Tensor
                and self.reducer.direct(direct, output, state)
            ):
                return
            rows = self.rows[id(module)]
            try:
                self._observe(rows, state, output)
            except Exception as e:  # telemetry never raises into the training step
                for r in rows.values():
                    state.failed[r.index] = type(e).__name__
        finally:  # the hook's own Python, beyond the reductions it charged (auto cadence)
            state.hook_calls += 1
            state.hook_s += time.perf_counter() - t0 - (state.telemetry_s - charged)

    def _observe(self, rows: dict[str, SiteRow], state: StepState, output: Any) -> None:
        due = state.spine_due
        row, grow = rows.get("activation"), rows.get("activation_grad")
        if not (row is not None and due["activation"]) and not (
            grow is not None and due["activation_grad"]
        ):
            if all(r.signature is not None for r in rows.values()):
                return  # nothing due and discovered: structure is checked on observed steps
        t, reason = module_output(output, self.keys.get(next(iter(rows.values())).site))
        if t is None:
            self.bind(rows.values(), NO_TENSOR, state.step)
            for r in rows.values():
                state.unsupported[r.index] = reason or "no_tensor_output"
            return
        if under_transform(t):  # this call is not reduced; the step's other calls are
            for r in rows.values():
                state.unsupported[r.index] = TORCH_FUNC  # when no other call was observed
                state.row_notes[r.index] = f"skipped_calls:{TORCH_FUNC}"
            return
        key = (t.dtype, t.dim())
        sig = self._signatures.get(key)
        if sig is None:
            sig = self._signatures[key] = output_signature(t)
        numel = t.numel()
        for r in rows.values():
            if r.signature != sig:
                self.bind(rows.values(), sig, state.step)
                break
        if row is not None:
            self.reducer.reduce(row, t)
            if grow is None and self.keys.get(row.site) is None and t.__class__ is torch.Tensor:
                self._direct[id(row.module)] = (row, t.dtype, t.dim())  # (its signature: sig)
        if grow is not None and due["activation_grad"] and t.requires_grad:
            t.register_hook(lambda g, grow=grow: self.reducer.reduce(grow, g))
        for r in rows.values():
            r.numel = numel

    def _all_registered(self) -> bool:
        """Whether every activation row has a site (cached until rows change)."""
        if self._registered is None:
            self._registered = all(
                r.site_id is not None for rows in self.rows.values() for r in rows.values()
            )
        return self._registered

    def _all_discovered(self) -> bool:
        """Whether every activation row has a signature (cached until rows change)."""
        if self._discovered is None:
            self._discovered = all(
                r.signature is not None for rows in self.rows.values() for r in rows.values()
            )
        return self._discovered

    def bind(self, rows: Iterable[SiteRow], sig: str, step: int) -> None:
        """Register rows under ``sig``: discovery, or a structural change (a new site)."""
        catalog = self.catalog
        self._discovered = self._registered = None
        for row in rows:
            self._direct.pop(id(row.module), None)
            if row.signature == sig:
                continue
            if row.signature == NOT_RUN and row.site_id is not None:
                catalog.end_site(row.site_id, step, "first_run")
            row.signature = sig
            row.site_id = catalog.register_site(row.site, row.module_type, sig, step=step)
            if sig in (NOT_RUN, NO_TENSOR):
                row.numel = 0  # nothing is reduced: the plan knows it

    def register_not_run(self, state: StepState) -> None:
        """Give sites that have not run a site, so they are recorded ``site_absent``.

        After a forward compiled by ``torch.compile``, rows not observed this step are
        ``unsupported`` with reason ``torch_compile`` instead.
        """
        if self.compiled or self._blind:
            self.compiled = False
            for rows in self.rows.values():
                for r in rows.values():
                    state.unsupported.setdefault(r.index, "torch_compile")
        if state.activations_quiet or self._all_registered():  # none is registered now
            return
        for rows in self.rows.values():
            todo = [r for r in rows.values() if r.site_id is None and state.spine_due[r.stream]]
            if todo:
                self.bind(todo, NOT_RUN, state.step)

    def rebind(self, name: str, new: torch.nn.Module | None) -> list[SiteRow]:
        """Move the hooks of module ``name`` to its replacement; returns its activation rows."""
        self._discovered = self._registered = None  # surgery: the rows are rediscovered
        old = self.bound.pop(name)
        self._direct.pop(id(old), None)
        self._resting = [(m, h) for m, h in self._resting if m is not old]
        handle = self._handles.pop(id(old), None)
        if handle is not None:
            handle.remove()
        rows = self.rows.pop(id(old), {})
        if new is not None:
            self.bound[name] = new
            if rows:
                self.rows[id(new)] = rows
                self._hook(new)
        return list(rows.values())


def compiled_frames() -> int | None:
    """How many frames ``torch.compile`` has converted in this process (``None``: unknown).

    Read from dynamo's frame counter (``0`` while dynamo's compiler was never imported);
    where a torch version lacks it, ``None``, so the collector's root hooks never rest.

    >>> isinstance(compiled_frames(), int)
    True
    """
    convert = sys.modules.get("torch._dynamo.convert_frame")
    if convert is None:
        return 0
    n = getattr(convert, "FRAME_COUNTER", None)
    return n if isinstance(n, int) else None
