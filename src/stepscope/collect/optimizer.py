"""Optimizers: step hooks, closures, ownership, and where an implicit iteration ends.

Optimizer hooks: which rows an optimizer owns, and when its gradients are read.

* :func:`unwrap_optimizer` follows wrappers that expose the real optimizer as ``.optimizer``
  (accelerate's ``AcceleratedOptimizer``, which the Hugging Face ``Trainer`` uses) or
  ``._optimizer`` (Lightning's ``LightningOptimizer``) down to the ``torch.optim.Optimizer``
  whose step hooks fire; anything else refuses ``optimizer_unsupported``.
* :class:`OptimizerWatch` holds one optimizer's step hooks and the ``gradient``, ``parameter``
  and ``update`` rows of the parameters in its ``param_groups``. Each optimizer reduces only
  its own rows, so with two optimizers neither writes (fake, zero) updates of the other's
  parameters.
* Gradient timing: the rows hold the ``.grad`` the optimizer consumes. Without a closure, the
  pre-step hook reads them (after the step's last backward and any clipping or unscaling done
  before ``step()``). With ``optimizer.step(closure)`` (LBFGS, Lightning's automatic and manual
  optimization, whose precision plugin wraps the user's closure with its clipping) the backward,
  clipping and unscaling run *inside* the step: the pre-step hook hands torch the closure
  wrapped by :func:`read_after`, which reads the gradients right after the closure returns and
  before the optimizer reads ``.grad`` (for LBFGS with several closure evaluations per step:
  each evaluation replaces the rows, the last one's stays).

Example
-------
>>> import torch
>>> inner = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
>>> class Wrapped:  # what accelerate / HF hand to a callback
...     def __init__(self, optimizer):
...         self.optimizer = optimizer
>>> unwrap_optimizer(Wrapped(inner)) is inner
True

Optimizer steps: what the collector reads at an optimizer's step hooks, and when.

:class:`OptimizerSteps` holds the :class:`~stepscope.collect.optimizer.OptimizerWatch` of every
optimizer the collector saw and decides, at each step hook, what is read:

* pre-step: the owned ``gradient`` rows, as the optimizer consumes them (after the step's last
  backward and any clipping/unscaling; with ``optimizer.step(closure)`` right after the closure
  returns, inside the step: see :mod:`.optimizer`) and the pre-step sample of the owned
  ``update`` rows;
* post-step: the owned ``update`` rows (after - before on the sampled indices) of the
  parameters the optimizer stepped, and ``parameter`` rows; in the implicit spelling the
  optimizer step then ends the collector's step. A parameter whose ``.grad`` is ``None`` after
  the step was skipped by the optimizer (frozen, a LoRA base weight, an expert no token reached,
  a branch not used): its update row is ``site_absent`` with the disclosure
  :data:`NOT_STEPPED`, never an observed zero.

Which steps count: once an explicit transaction was used (or the collector resumes), a bare
``optimizer.step()`` outside one is not recorded (:meth:`OptimizerSteps.post_step` drops what
its iteration staged and warns; the next transaction refuses ``step_transaction_required``).
In the implicit spelling with a ``GradScaler``, an iteration whose optimizer step the scaler
skipped is ended at the next training forward or at :meth:`~stepscope.HistoryCollector.close`
as its own step with ``applied=no`` (:mod:`.optimizer`).

Implicit spelling: where an iteration ends when no optimizer step ends it.

``HistoryCollector(model, optimizer=opt)`` ends a step at each optimizer post-step hook. An
iteration whose optimizer step never ran fires no hook:

* with ``scaler=`` (a ``GradScaler``), an iteration whose step the scaler skipped (inf/NaN
  gradients) is seen at the next training forward (the scaler's ``update()`` replaced its
  per-optimizer states, :func:`~stepscope.collect.step.update_marker`) or at ``close()``, and
  ends as its own step with ``applied=no`` (:meth:`ImplicitIterations.iteration_hook`);
* without ``scaler=``, the collector cannot see the scaler; it sees a training forward after a
  backward whose gradients were reset (``zero_grad``) with no optimizer step in between. That
  iteration is merged into the next step (what it can record), and a ``RuntimeWarning`` says so
  once, naming ``scaler=`` (:meth:`ImplicitIterations.unstepped_iteration_hook`). A backward is
  noticed by a post-accumulate-grad hook on one trainable parameter of the optimizer (its
  gradient is never read there); gradient accumulation (gradients kept between forwards) and a
  loop that steps every iteration never warn.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from stepscope.collect.activations import ActivationSites
from stepscope.collect.sites import PARAM_STREAMS, SiteRow
from stepscope.collect.staging import Reducer
from stepscope.collect.step import (
    OpenStep,
    StepState,
    grad_scale_status,
    scale_in_force,
    update_marker,
)
from stepscope.collect.updates import UpdateSampler, stepped_only
from stepscope.errors import Refusal
from stepscope.history import StepProvenance
from stepscope.stephooks import OuterStepHooks, user_stacklevel
from stepscope.transfer import internal_scope

__all__ = [
    "ImplicitIterations",
    "OptimizerSteps",
    "OptimizerWatch",
    "closure_of",
    "read_after",
    "unwrap_optimizer",
    "with_closure",
]

# ------------------------------------------------------------------ (optimizers)
_WRAPPER_ATTRS = ("optimizer", "_optimizer")


def _hookable(obj: Any) -> bool:
    # a constructed torch optimizer: its step is patched to run the registered step hooks
    return isinstance(obj, torch.optim.Optimizer) and hasattr(obj, "_optimizer_step_pre_hooks")


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The ``torch.optim.Optimizer`` whose step hooks fire for ``optimizer``.

    Wrappers are followed through ``.optimizer`` / ``._optimizer`` (several levels deep).

    Raises
    ------
    Refusal
        ``optimizer_unsupported`` when no hookable torch optimizer is found.
    """
    seen: set[int] = set()
    current = optimizer
    while id(current) not in seen:
        seen.add(id(current))
        inner = next(
            (
                getattr(current, a)
                for a in _WRAPPER_ATTRS
                if getattr(current, a, None) is not None and getattr(current, a) is not current
            ),
            None,
        )
        if inner is None:
            break
        current = inner
    if not _hookable(current):
        raise Refusal(
            "optimizer_unsupported",
            f"{type(optimizer).__name__} is not a torch.optim.Optimizer with step hooks and "
            "exposes none as .optimizer or ._optimizer.",
            [
                "pass the underlying torch.optim.Optimizer",
                "or a wrapper that exposes it as .optimizer",
            ],
        )
    return current


def closure_of(
    optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Callable[[], Any] | None:
    """The closure passed to ``optimizer.step`` (positional or keyword), if any.

    A step hook's ``args`` start with the optimizer itself (``step``'s ``self``).
    """
    if args and args[0] is optimizer:
        args = args[1:]
    closure = args[0] if args else kwargs.get("closure")
    return closure if callable(closure) else None


def with_closure(
    optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any], closure: Callable[[], Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``step``'s ``(args, kwargs)`` with its closure (as :func:`closure_of` found it) replaced.

    >>> opt, old, new = object(), (lambda: 1), (lambda: 2)
    >>> with_closure(opt, (opt, old), {}, new)[0][1] is new
    True
    >>> with_closure(opt, (opt,), {"closure": old}, new)[1]["closure"] is new
    True
    """
    lead = 1 if args and args[0] is optimizer else 0
    if len(args) > lead:
        return (*args[:lead], closure, *args[lead + 1 :]), kwargs
    return args, {**kwargs, "closure": closure}


def read_after(closure: Callable[[], Any], read: Callable[[], None]) -> Callable[[], Any]:
    """``closure`` followed by ``read()``: what the optimizer calls instead of ``closure``.

    The closure's result is returned unchanged; ``read`` must never raise (the collector's
    telemetry guard is inside it).

    >>> seen = []
    >>> wrapped = read_after(lambda: seen.append("backward") or 1.5, lambda: seen.append("read"))
    >>> wrapped(), seen
    (1.5, ['backward', 'read'])
    """

    def closure_then_read() -> Any:
        result = closure()
        read()
        return result

    return closure_then_read


class OptimizerWatch:
    """One optimizer's step hooks and the parameter rows it owns.

    Parameters
    ----------
    optimizer
        A hookable ``torch.optim.Optimizer`` (see :func:`unwrap_optimizer`).
    rows
        All rows of the collector; the ones of parameters in ``optimizer.param_groups`` are owned.
    on_pre, on_post
        Called as ``on_pre(watch, closure)`` and ``on_post(watch)`` from the step hooks;
        ``on_pre`` may return a closure to run in place of the step's own (see
        :func:`read_after`), or ``None``.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        rows: Sequence[SiteRow],
        on_pre: Callable[[OptimizerWatch, Callable[[], Any] | None], Callable[[], Any] | None],
        on_post: Callable[[OptimizerWatch], None],
    ) -> None:
        self.optimizer = optimizer
        self._all_rows = list(rows)
        self._owned_count = -1
        self.rows: dict[str, list[SiteRow]] = {}
        self.param_ids: frozenset[int] = frozenset()  # ids of the parameters it steps
        self.refresh()
        self._on_pre = on_pre
        self.hooks = OuterStepHooks(  # once per step() call, also when it nests super().step()
            optimizer, pre=self._pre, post=lambda _o, _a, _k: on_post(self)
        )

    def _pre(
        self, optimizer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        # ``opt.step()``: torch passes only the optimizer itself (no closure to look for)
        closure = None if len(args) < 2 and not kwargs else closure_of(optimizer, args, kwargs)
        replacement = self._on_pre(self, closure)
        if replacement is None or closure is None:
            return None
        return with_closure(optimizer, args, kwargs, replacement)

    def refresh(self) -> None:
        """Recompute ownership when the optimizer's parameter list changed (add_param_group)."""
        count = 0
        for g in self.optimizer.param_groups:  # (a loop: every step's hooks ask)
            count += len(g["params"])
        if count == self._owned_count:
            return
        self._owned_count = count
        owned = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
        self.param_ids = frozenset(owned)
        self.rows = {
            s: [r for r in self._all_rows if r.stream == s and id(r.param) in owned]
            for s in PARAM_STREAMS
        }

    def invalidate(self) -> None:
        """Recompute ownership at the next :meth:`owned` (rows were rebound: model surgery)."""
        self._owned_count = -1

    def owned(self, stream: str) -> list[SiteRow]:
        """This optimizer's rows of ``stream`` (``gradient``, ``parameter`` or ``update``)."""
        self.refresh()
        return self.rows[stream]

    def remove(self) -> None:
        """Remove every hook of this watch (idempotent)."""
        self.hooks.remove()


# ------------------------------------------------------------------ (stepping)
#: Disclosure (and unsupported reason of update rows) of a parameter stepped twice in one step.
AGAIN = "several_optimizer_steps"
#: Disclosure of the ``site_absent`` update row of a parameter the optimizer skipped (no grad).
NOT_STEPPED = "not_stepped:grad_none"


class OptimizerSteps:
    """The optimizer watches of one collector and the rows read at their step hooks.

    Parameters
    ----------
    step
        The collector's open step (read by the hooks; only the collector begins or ends one).
    end_step, restart_step
        The collector's callbacks: end the open step (an implicit optimizer step ends it), and
        drop it and begin it afresh (a bare optimizer step outside a transaction).
    rows, by_stream, streams
        All rows, the per-stream rows (shared with model surgery, which retires rows), and the
        collector's streams.
    reducer
        Where the read tensors are reduced.
    explicit_only
        Whether only explicit transactions are steps from the start (a resumed collector).
    """

    def __init__(
        self,
        step: OpenStep,
        end_step: Callable[[StepProvenance], None],
        restart_step: Callable[[], None],
        rows: Sequence[SiteRow],
        by_stream: Mapping[str, list[SiteRow]],
        streams: Sequence[str],
        reducer: Reducer,
        explicit_only: bool,
    ) -> None:
        self.step, self.end_step, self.restart_step = step, end_step, restart_step
        self.rows, self.by_stream, self.streams = rows, by_stream, streams
        self.reducer = reducer
        self.explicit_only = explicit_only  # bare optimizer steps are not steps
        self.stray_step: int | None = None  # a bare optimizer step after explicit ones
        self._last_opened: tuple[Any, ...] | None = None  # the last transaction's optimizers
        self.watches: dict[int, OptimizerWatch] = {}
        self.updates = UpdateSampler(reducer.backend)
        self.implicit: ImplicitIterations | None = None  # the implicit spelling's iterations
        self._warned_repeat = False  # a parameter stepped twice in one step (warned once)
        self._shared: frozenset[int] = frozenset()  # parameters several optimizers own
        self._shared_key: tuple[tuple[int, int], ...] = ()

    # ------------------------------------------------------------------ attaching
    def attach(self, optimizer: Any) -> OptimizerWatch:
        """Watch ``optimizer`` (or the optimizer a wrapper exposes); idempotent."""
        watch = self.watches.get(id(optimizer))
        if watch is not None and watch.optimizer is optimizer:  # every step's transaction
            watch.hooks.ensure_eager()  # torch.compile may have come into use since
            return watch
        opt = unwrap_optimizer(optimizer)
        watch = self.watches.get(id(opt))
        if watch is None:
            watch = OptimizerWatch(opt, self.rows, self.pre_step, self.post_step)
            self.watches[id(opt)] = watch
        return watch

    def attach_implicit(
        self, model: torch.nn.Module, optimizer: Any, scaler: Any, sites: ActivationSites
    ) -> None:
        """Implicit spelling: the optimizer's step hooks end each step; where an iteration
        ends without one is :class:`~stepscope.collect.optimizer.ImplicitIterations`'."""
        watch = self.attach(optimizer)
        self.implicit = ImplicitIterations(self.step, self.end_step, sites)
        self.implicit.attach(model, watch, scaler)

    @property
    def implicit_scaler(self) -> Any:
        """The ``scaler=`` of the implicit spelling (``None``: none given)."""
        return None if self.implicit is None else self.implicit.scaler

    def finish_skipped(self) -> None:
        """At close: the last iteration's skipped step (implicit + scaler) is still a step."""
        if self.implicit is not None:
            self.implicit.finish_skipped()

    def invalidate(self) -> None:
        """Rows were rebound (model surgery): recompute every optimizer's ownership."""
        for watch in self.watches.values():
            watch.invalidate()

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        implicit, watches = self.implicit, self.watches
        self.implicit, self.watches, self._last_opened = None, {}, None
        if implicit is not None:
            implicit.remove()
        for watch in watches.values():
            watch.remove()
        self.updates.clear()

    # ------------------------------------------------------------------ transactions
    def open_transaction(self, optimizers: Sequence[Any]) -> None:
        """A transaction opens: refuse after a stray bare step, then watch ``optimizers``."""
        if self.stray_step is not None:
            stray, self.stray_step = self.stray_step, None
            raise Refusal(
                "step_transaction_required",
                f"an optimizer step ran outside `with collector.step(...)` at step {stray}; it "
                "was not recorded (this collector records explicit steps only).",
                ["run every optimizer step inside `with collector.step(optimizer):`"],
            )
        self.explicit_only = True
        for opt in optimizers:
            self.attach(opt)
        self._last_opened = tuple(optimizers)

    def same_transaction(self, optimizers: Sequence[Any]) -> bool:
        """Whether ``optimizers`` are exactly those of the last :meth:`open_transaction` (then
        it opened this transaction already: nothing new to check or watch, no stray step).

        Every step of a training loop passes the same optimizer: its transaction costs a
        comparison. A stray bare step in between makes this ``False`` (the next
        :meth:`open_transaction` refuses it)."""
        last = self._last_opened
        if last is None or self.stray_step is not None or len(last) != len(optimizers):
            return False
        for a, b in zip(last, optimizers):
            if a is not b:
                return False
        return True

    def close_transaction(self, scaler: Any, state: StepState) -> None:
        """A transaction body ended: read the rows of parameters no optimizer stepped
        (gradients as left, values at the step's end)."""
        if scaler is None and state.optimizer_quiet and state.grads_taken:
            return  # a quiet step: no row is read, and its scaling is noted already
        status = grad_scale_status(scaler, True)
        if scaler is not None and update_marker(scaler) is not state.scaler_marker:
            status = "unscaled"  # scaler.step() unscaled them; update() has reset its stages
        self.take_gradients(self.by_stream.get("gradient", []), status)
        self.take_parameters(self.by_stream.get("parameter", []))

    def _outside_transaction(self) -> bool:
        """A bare ``optimizer.step()`` where only explicit steps count (never silently implicit)."""
        return self.explicit_only and not self.step.in_transaction

    # ------------------------------------------------------------------ step hooks
    def pre_step(
        self, watch: OptimizerWatch, closure: Callable[[], Any] | None
    ) -> Callable[[], Any] | None:
        """Before the optimizer changes anything: gradients (or, with a closure, the closure to
        run instead, which reads them after the original returns) and the update sample."""
        step = self.step
        # (recording() and _outside_transaction(), spelled out: this runs at every step)
        state = None if step.window.depth else step.state
        if state is None or (self.explicit_only and not step.in_transaction):
            return None
        t0, charged = time.perf_counter(), state.telemetry_s
        if (
            state.optimizer_quiet
            and closure is None
            and not state.optimizer_steps
            and len(self.watches) == 1
        ):  # a quiet step's only optimizer step: nothing is read, the scaling is noted
            state.optimizer_steps[id(watch)] = 1
            if not state.grads_taken and "gradient" in self.streams:
                for r in watch.owned("gradient"):  # what take_gradients notes when not due
                    if r.param is not None and r.param.grad is not None:
                        state.grads_taken, state.scale_grad = True, self._scale_status()
                        break
            state.hook_calls += 1
            state.hook_s += time.perf_counter() - t0
            return None
        try:
            return self._pre_step(state, watch, closure)
        finally:  # the hook's own Python, beyond the reductions it charged (auto cadence)
            state.hook_calls += 1
            state.hook_s += time.perf_counter() - t0 - (state.telemetry_s - charged)

    def _pre_step(
        self, state: StepState, watch: OptimizerWatch, closure: Callable[[], Any] | None
    ) -> Callable[[], Any] | None:
        calls = state.optimizer_steps[id(watch)] = state.optimizer_steps.get(id(watch), 0) + 1
        if calls > 1:  # the same optimizer again: every row it owns
            self._step_again(state, watch, set(watch.param_ids), True)
        else:
            shared = self._shared_params()  # (empty with one optimizer, or disjoint ones)
            if shared:  # a parameter another optimizer of this step owns too
                mine = {i for i in shared if i in watch.param_ids}
                again = mine & state.stepped_params
                state.stepped_params |= mine
                if again:
                    self._step_again(state, watch, again, False)
        replacement = None
        if closure is None:
            self.take_gradients(watch.owned("gradient"), self._scale_status())
        elif "gradient" in self.streams:  # backward, clipping, unscaling run inside step()
            replacement = read_after(closure, lambda: self.after_closure(watch))
        if "update" in self.streams and state.spine_due["update"] and calls == 1:
            t0 = time.perf_counter()
            rows = watch.owned("update")
            try:
                with internal_scope("collector.update_sample"):
                    self.updates.snapshot(rows)
            except Exception as e:  # telemetry never raises into the training step
                _update_failed(state, rows, e)
            state.charge("update", time.perf_counter() - t0)
        return replacement

    def _scale_status(self) -> str:
        """Whether gradients read now are scaled (``unknown`` in the implicit spelling unless
        the scaler was given to the collector)."""
        txn = self.step.in_transaction
        scaler = self.step.scaler if txn else self.implicit_scaler
        return grad_scale_status(scaler, txn or scaler is not None)

    def after_closure(self, watch: OptimizerWatch) -> None:
        """A step's closure returned: its owned gradients are what the optimizer reads next.

        Each evaluation replaces what an earlier one of the step wrote (LBFGS); a parameter the
        closure left without a gradient stays ``site_absent``, never a stale read. Telemetry:
        never raises into the closure's caller (the optimizer).
        """
        state = self.step.recording()
        if state is None or not state.spine_due["gradient"]:
            return
        rows = watch.owned("gradient")
        try:
            for row in rows:
                if row.index in state.grad_rows and row.param is not None:
                    self.reducer.staging(row.param.device).reset_row(row.index)
                    state.grad_rows.discard(row.index)
            self.take_gradients(rows, self._scale_status())
        except Exception as e:  # telemetry never raises into the training step
            _update_failed(state, rows, e)

    def post_step(self, watch: OptimizerWatch) -> None:
        """After the optimizer step: updates and parameter values; ends an implicit step."""
        step = self.step
        state = None if step.window.depth else step.state  # recording(), spelled out
        if state is None:
            return
        if self.explicit_only and not step.in_transaction:  # _outside_transaction()
            self._discard_stray_step(watch, state)
            return
        state.stepped = True
        if self.implicit is not None:
            self.implicit.stepped()  # this iteration's backward was stepped
        t_hook, charged = time.perf_counter(), state.telemetry_s
        first = state.optimizer_steps.get(id(watch), 1) == 1
        if "update" in self.streams and state.spine_due["update"] and first:
            t0 = time.perf_counter()
            rows = watch.owned("update")
            deltas: list[tuple[SiteRow, torch.Tensor]] = []
            try:
                with internal_scope("collector.post_step"):
                    deltas = stepped_only(self.updates.deltas(rows), state.row_notes, NOT_STEPPED)
            except Exception as e:  # telemetry never raises into the training step
                _update_failed(state, rows, e)
                deltas = []
            if deltas:  # the sampling is telemetry too (its pre-step half is charged as well)
                state.charge("update", time.perf_counter() - t0)
            self.reducer.reduce_many("update", deltas)
            if state.unsupported:  # a shared parameter's second update is not a row
                for row in rows:
                    if state.unsupported.get(row.index) == AGAIN and row.param is not None:
                        self.reducer.staging(row.param.device).reset_row(row.index)
        if state.spine_due.get("parameter", False):  # else nothing to read (nor to look up)
            self.take_parameters(watch.owned("parameter"))
        state.hook_calls += 1
        state.hook_s += time.perf_counter() - t_hook - (state.telemetry_s - charged)
        if not self.step.in_transaction:  # implicit spelling: the optimizer step ends the step
            self.take_parameters(self.by_stream.get("parameter", []))  # frozen ones too
            self.end_step(StepProvenance.IMPLICIT)

    def _shared_params(self) -> frozenset[int]:
        """Ids of the parameters more than one watched optimizer owns (cached while every
        optimizer's ownership holds; empty with a single optimizer)."""
        if len(self.watches) < 2:
            return frozenset()
        for w in self.watches.values():
            w.refresh()
        key = tuple((id(w), len(w.param_ids)) for w in self.watches.values())
        if key != self._shared_key:
            seen: set[int] = set()
            shared: set[int] = set()
            for w in self.watches.values():
                shared |= w.param_ids & seen
                seen |= w.param_ids
            self._shared, self._shared_key = frozenset(shared), key
        return self._shared

    def _step_again(
        self, state: StepState, watch: OptimizerWatch, params: set[int], same: bool
    ) -> None:
        """Parameters (ids) an optimizer step of this step already stepped are stepped again
        (``same``: by the same optimizer). Their gradient and parameter rows are read again (the
        last optimizer step's gradient, the values at the step's end), their update rows are
        ``unsupported:several_optimizer_steps`` (an update row is one optimizer step's), and the
        first time a warning says so."""
        if not self._warned_repeat:
            self._warned_repeat = True
            what = (
                "ran more than once"
                if same
                else "stepped parameters another optimizer had already stepped"
            )
            warnings.warn(
                f"stepscope: {type(watch.optimizer).__name__}.step() {what} inside one "
                f"collector.step() (step {state.step}); their update rows are recorded "
                "unsupported:several_optimizer_steps, their gradients and values are the last "
                "optimizer step's. Open one collector.step() per optimizer step, and give each "
                "parameter to one optimizer.",
                RuntimeWarning,
                stacklevel=user_stacklevel(),  # the user's optimizer.step()
            )
        again = (("gradient", state.grad_rows), ("parameter", state.param_rows), ("update", None))
        for stream, read in again:
            for row in watch.owned(stream):
                if row.param is None or id(row.param) not in params:
                    continue
                self.reducer.staging(row.param.device).reset_row(row.index)
                if read is not None:
                    read.discard(row.index)
                    state.row_notes[row.index] = AGAIN
                else:
                    state.unsupported[row.index] = AGAIN

    def take_gradients(self, rows: Sequence[SiteRow], phase_scale: str) -> None:
        """Read the gradients of ``rows`` not read yet this step."""
        state = self.step.state
        if state is None or "gradient" not in self.streams:
            return
        if not state.spine_due["gradient"]:  # nothing is read; the step's scaling is still noted
            if not state.grads_taken:
                for r in rows:
                    if r.param is not None and r.param.grad is not None:
                        state.grads_taken, state.scale_grad = True, phase_scale
                        break
            return
        pairs = []
        for row in rows:
            grad = None if row.param is None else row.param.grad
            if row.index not in state.grad_rows and grad is not None:
                if not state.grads_taken:  # the first read of the step states the scaling
                    state.grads_taken, state.scale_grad = True, phase_scale
                state.grad_rows.add(row.index)
                pairs.append((row, grad))
        self.reducer.reduce_many("gradient", pairs)

    def take_parameters(self, rows: Sequence[SiteRow]) -> None:
        """Read the values of ``rows`` not read yet this step."""
        state = self.step.state
        if state is None or not state.spine_due.get("parameter", False):
            return
        pairs: list[tuple[SiteRow, torch.Tensor]] = []
        for row in rows:
            if row.index not in state.param_rows and row.param is not None:
                state.param_rows.add(row.index)
                pairs.append((row, row.param))
        with torch.no_grad():
            self.reducer.reduce_many("parameter", pairs)

    def _discard_stray_step(self, watch: OptimizerWatch, state: StepState) -> None:
        """Drop what a bare optimizer step's iteration staged; the next step() refuses."""
        self.stray_step = state.step
        warnings.warn(
            f"stepscope: {type(watch.optimizer).__name__}.step() ran outside `with "
            f"collector.step(...)` at step {state.step}; it is not recorded, and the next "
            "collector.step() refuses step_transaction_required.",
            RuntimeWarning,
            stacklevel=user_stacklevel(),  # the bare optimizer.step()
        )
        self.updates.clear()
        self.restart_step()


def _update_failed(state: StepState, rows: Sequence[SiteRow], error: Exception) -> None:
    """The update sample of ``rows`` raised: each is recorded ``capture_failed`` this step."""
    for row in rows:
        state.failed[row.index] = type(error).__name__


# ------------------------------------------------------------------ (iterations)
class ImplicitIterations:
    """The implicit spelling's iteration boundaries that no optimizer step marks.

    Parameters
    ----------
    step, end_step
        The collector's open step and its callback that ends it (see :class:`OptimizerSteps`).
    sites
        The activation sites (which forwards are training forwards).
    """

    def __init__(
        self,
        step: OpenStep,
        end_step: Callable[[StepProvenance], None],
        sites: ActivationSites,
    ) -> None:
        self.step, self.end_step, self.sites = step, end_step, sites
        self.scaler: Any = None  # the scaler= given to the collector
        self._handles: list[Any] = []
        self._probe: torch.Tensor | None = None  # the parameter whose backward is noticed
        self._backward = False  # a backward reached the probe since the last training forward
        self._warned = False

    def attach(self, model: torch.nn.Module, watch: OptimizerWatch, scaler: Any) -> None:
        """Watch ``model``'s forwards (and, without a scaler, one parameter's backward)."""
        if scaler is not None:
            self.scaler = scaler
            self._handles.append(model.register_forward_pre_hook(self.iteration_hook))
            return
        params = (p for g in watch.optimizer.param_groups for p in g["params"])
        probe = next((p for p in params if p.requires_grad), None)
        if probe is None:
            return
        self._probe = probe
        self._handles.append(probe.register_post_accumulate_grad_hook(self._backward_seen))
        self._handles.append(model.register_forward_pre_hook(self.unstepped_iteration_hook))

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        handles, self._handles = self._handles, []
        for h in handles:
            h.remove()

    def stepped(self) -> None:
        """An optimizer step ended the iteration: its backward was stepped."""
        self._backward = False

    def _backward_seen(self, _param: torch.Tensor) -> None:
        self._backward = True

    def unstepped_iteration_hook(self, _module: torch.nn.Module, _inputs: Any) -> None:
        """No ``scaler=``: a training forward after a backward whose gradients were reset, with
        no optimizer step between them, warns once (the iteration is merged into this step)."""
        state = self.step.state
        if self._warned or state is None or self.step.in_transaction:
            return
        if not self.sites.training_forward():
            return
        backward, self._backward = self._backward, False
        probe = self._probe
        if backward and probe is not None and probe.grad is None:
            self._warned = True
            warnings.warn(
                f"stepscope: an iteration ended without an optimizer step (step {state.step}: a "
                "backward ran, its gradients were reset, no optimizer.step() hook fired); it is "
                "merged into this step. With a GradScaler that skips steps, pass it: "
                "HistoryCollector(model, optimizer=opt, scaler=scaler), so a skipped iteration "
                "is its own step with applied=no; or use `with collector.step(opt, "
                "scaler=scaler):`.",
                RuntimeWarning,
                stacklevel=user_stacklevel(),  # the user's model(...) call
            )

    def iteration_hook(self, _module: torch.nn.Module, _inputs: Any) -> None:
        """With ``scaler=``: a training forward after ``scaler.update()``.

        An iteration whose optimizer step the scaler skipped never fires the step hooks; its
        ``update()`` is seen here, at the next iteration's first forward, and ends it as its
        own step with ``applied=no``.
        """
        state = self.step.state
        if state is None or self.step.in_transaction or not self.sites.training_forward():
            return
        marker = update_marker(self.scaler)
        if state.scaler_marker is not None and marker is not state.scaler_marker:
            state.skipped = True
            self.end_step(StepProvenance.IMPLICIT)
            state = self.step.state
            if state is None:
                return
        if state.scaler_marker is None:
            state.scaler_marker = marker
            state.scale_in_force = scale_in_force(self.scaler)

    def finish_skipped(self) -> None:
        """At close: the last iteration's skipped step (with ``scaler=``) is still a step."""
        state = self.step.state
        scaler = self.scaler
        if (
            scaler is not None
            and state is not None
            and state.scaler_marker is not None
            and update_marker(scaler) is not state.scaler_marker
        ):
            state.skipped = True
            self.end_step(StepProvenance.IMPLICIT)
