"""Optimizer steps: what the collector reads at an optimizer's step hooks, and when.

:class:`OptimizerSteps` holds the :class:`~stepscope.collect.optimizers.OptimizerWatch` of every
optimizer the collector saw and decides, at each step hook, what is read:

* pre-step: the owned ``gradient`` rows, as the optimizer consumes them (after the step's last
  backward and any clipping/unscaling; with ``optimizer.step(closure)`` right after the closure
  returns, inside the step: see :mod:`.optimizers`) and the pre-step sample of the owned
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
as its own step with ``applied=no`` (:mod:`.iterations`).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch

from stepscope.collect.activations import ActivationSites
from stepscope.collect.iterations import ImplicitIterations
from stepscope.collect.optimizers import OptimizerWatch, read_after, unwrap_optimizer
from stepscope.collect.reduce import Reducer
from stepscope.collect.scaler import grad_scale_status, update_marker
from stepscope.collect.sites import Row
from stepscope.collect.stepstate import StepState
from stepscope.collect.updates import UpdateSampler, stepped_only
from stepscope.errors import Refusal
from stepscope.history import StepProvenance
from stepscope.stephooks import user_stacklevel
from stepscope.transfer import internal_scope

__all__ = ["OptimizerSteps", "StepHost"]

#: Disclosure (and unsupported reason of update rows) of a parameter stepped twice in one step.
AGAIN = "several_optimizer_steps"
#: Disclosure of the ``site_absent`` update row of a parameter the optimizer skipped (no grad).
NOT_STEPPED = "not_stepped:grad_none"


class StepHost(Protocol):
    """What the optimizer-step handling needs from its collector."""

    _state: StepState | None
    _txn_open: bool
    _scaler: Any  # the open transaction's GradScaler

    def _recording(self) -> StepState | None: ...
    def _begin_step(self) -> StepState: ...
    def _finish_step(self, provenance: StepProvenance, optimizer_known: bool = True) -> None: ...


class OptimizerSteps:
    """The optimizer watches of one collector and the rows read at their step hooks.

    Parameters
    ----------
    host
        The collector (its current step, transaction and step boundary).
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
        host: StepHost,
        rows: Sequence[Row],
        by_stream: Mapping[str, list[Row]],
        streams: Sequence[str],
        reducer: Reducer,
        explicit_only: bool,
    ) -> None:
        self.host, self.rows, self.by_stream, self.streams = host, rows, by_stream, streams
        self.reducer = reducer
        self.explicit_only = explicit_only  # bare optimizer steps are not steps
        self.stray_step: int | None = None  # a bare optimizer step after explicit ones
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
        ends without one is :class:`~stepscope.collect.iterations.ImplicitIterations`'."""
        watch = self.attach(optimizer)
        self.implicit = ImplicitIterations(self.host, sites)
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
        self.implicit, self.watches = None, {}
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

    def close_transaction(self, scaler: Any, state: StepState) -> None:
        """A transaction body ended: read the rows of parameters no optimizer stepped
        (gradients as left, values at the step's end)."""
        status = grad_scale_status(scaler, True)
        if scaler is not None and update_marker(scaler) is not state.scaler_marker:
            status = "unscaled"  # scaler.step() unscaled them; update() has reset its stages
        self.take_gradients(self.by_stream.get("gradient", []), status)
        self.take_parameters(self.by_stream.get("parameter", []))

    def _outside_transaction(self) -> bool:
        """A bare ``optimizer.step()`` where only explicit steps count (never silently implicit)."""
        return self.explicit_only and not self.host._txn_open

    # ------------------------------------------------------------------ step hooks
    def pre_step(
        self, watch: OptimizerWatch, closure: Callable[[], Any] | None
    ) -> Callable[[], Any] | None:
        """Before the optimizer changes anything: gradients (or, with a closure, the closure to
        run instead, which reads them after the original returns) and the update sample."""
        state = self.host._recording()
        if state is None or self._outside_transaction():
            return None
        t0, charged = time.perf_counter(), state.telemetry_s
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
        txn = self.host._txn_open
        scaler = self.host._scaler if txn else self.implicit_scaler
        return grad_scale_status(scaler, txn or scaler is not None)

    def after_closure(self, watch: OptimizerWatch) -> None:
        """A step's closure returned: its owned gradients are what the optimizer reads next.

        Each evaluation replaces what an earlier one of the step wrote (LBFGS); a parameter the
        closure left without a gradient stays ``site_absent``, never a stale read. Telemetry:
        never raises into the closure's caller (the optimizer).
        """
        state = self.host._recording()
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
        state = self.host._recording()
        if state is None:
            return
        if self._outside_transaction():
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
            deltas: list[tuple[Row, torch.Tensor]] = []
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
        if not self.host._txn_open:  # implicit spelling: the optimizer step ends the step
            self.take_parameters(self.by_stream.get("parameter", []))  # frozen ones too
            self.host._finish_step(StepProvenance.IMPLICIT)

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

    def take_gradients(self, rows: Sequence[Row], phase_scale: str) -> None:
        """Read the gradients of ``rows`` not read yet this step."""
        state = self.host._state
        if state is None or "gradient" not in self.streams:
            return
        if not state.spine_due["gradient"]:  # nothing is read; the step's scaling is still noted
            if not state.grads_taken and any(
                r.param is not None and r.param.grad is not None for r in rows
            ):
                state.grads_taken, state.scale_grad = True, phase_scale
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

    def take_parameters(self, rows: Sequence[Row]) -> None:
        """Read the values of ``rows`` not read yet this step."""
        state = self.host._state
        if state is None or not state.spine_due.get("parameter", False):
            return
        pairs: list[tuple[Row, torch.Tensor]] = []
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
        self.host._state = None
        self.host._begin_step()


def _update_failed(state: StepState, rows: Sequence[Row], error: Exception) -> None:
    """The update sample of ``rows`` raised: each is recorded ``capture_failed`` this step."""
    for row in rows:
        state.failed[row.index] = type(error).__name__
