"""Implicit spelling: where an iteration ends when no optimizer step ends it.

``HistoryCollector(model, optimizer=opt)`` ends a step at each optimizer post-step hook. An
iteration whose optimizer step never ran fires no hook:

* with ``scaler=`` (a ``GradScaler``), an iteration whose step the scaler skipped (inf/NaN
  gradients) is seen at the next training forward (the scaler's ``update()`` replaced its
  per-optimizer states, :func:`~stepscope.collect.scaler.update_marker`) or at ``close()``, and
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

import warnings
from typing import Any, Protocol

import torch

from stepscope.collect.activations import ActivationSites
from stepscope.collect.optimizers import OptimizerWatch
from stepscope.collect.scaler import scale_in_force, update_marker
from stepscope.collect.stepstate import StepState
from stepscope.history import StepProvenance
from stepscope.stephooks import user_stacklevel

__all__ = ["ImplicitIterations"]


class IterationHost(Protocol):
    """What the iteration watch needs from its collector."""

    _state: StepState | None
    _txn_open: bool

    def _finish_step(self, provenance: StepProvenance, optimizer_known: bool = True) -> None: ...


class ImplicitIterations:
    """The implicit spelling's iteration boundaries that no optimizer step marks.

    Parameters
    ----------
    host
        The collector (its current step and step boundary).
    sites
        The activation sites (which forwards are training forwards).
    """

    def __init__(self, host: IterationHost, sites: ActivationSites) -> None:
        self.host, self.sites = host, sites
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
        state = self.host._state
        if self._warned or state is None or self.host._txn_open:
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
        state = self.host._state
        if state is None or self.host._txn_open or not self.sites.training_forward():
            return
        marker = update_marker(self.scaler)
        if state.scaler_marker is not None and marker is not state.scaler_marker:
            state.skipped = True
            self.host._finish_step(StepProvenance.IMPLICIT)
            state = self.host._state
            if state is None:
                return
        if state.scaler_marker is None:
            state.scaler_marker = marker
            state.scale_in_force = scale_in_force(self.scaler)

    def finish_skipped(self) -> None:
        """At close: the last iteration's skipped step (with ``scaler=``) is still a step."""
        state = self.host._state
        scaler = self.scaler
        if (
            scaler is not None
            and state is not None
            and state.scaler_marker is not None
            and update_marker(scaler) is not state.scaler_marker
        ):
            state.skipped = True
            self.host._finish_step(StepProvenance.IMPLICIT)
