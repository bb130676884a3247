"""User scalars, branch masks and evaluations: the logging surface shared by
:class:`~stepscope.runlog.RunLog` and :class:`~stepscope.HistoryCollector`.

A class that mixes in :class:`UserLog` provides ``_pending`` (a
:class:`~stepscope.runlog.PendingStep`), a row sink ``_log_sink``, ``_timer``, and three small
methods: ``_check_open``, ``_charge(seconds)`` (telemetry accounting) and ``_eval_coordinate()``
(the ``(optimizer_step, examples_seen)`` an evaluation logged now is tagged with).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from stepscope.errors import Refusal
from stepscope.runlog.evals import EvalRecord
from stepscope.runlog.names import eval_scalar
from stepscope.runlog.pending import _host_or_tensor, _to_host_all


def write_eval(sink: Any, rec: EvalRecord) -> None:
    """One evaluation: its ``eval/<split>/<metric>`` scalar rows and its ``evals.log`` line."""
    for metric, value in rec.metrics.items():
        sink.write_scalar(eval_scalar(rec.split, metric), rec.optimizer_step, value)
    sink.write_eval(rec)


def make_eval(
    split: str,
    metrics: Mapping[str, Any],
    *,
    step: int,
    examples_seen: int | None,
    epoch: int | None,
    sample_count: int | None,
    data_hash: str | None,
    endpoint: bool,
) -> EvalRecord:
    """An :class:`EvalRecord` from host or device values (tensors: one transfer per device)."""
    if not isinstance(metrics, Mapping):
        raise Refusal("runlog_value_invalid", "metrics must be a mapping name -> value.", [])
    values = {k: _host_or_tensor(v, f"metric {k!r}") for k, v in metrics.items()}
    tensors = [k for k, v in values.items() if isinstance(v, torch.Tensor)]
    for k, v in zip(tensors, _to_host_all([values[k] for k in tensors])):  # type: ignore[misc]
        values[k] = v
    return EvalRecord(
        split,
        values,  # type: ignore[arg-type]
        optimizer_step=step,
        examples_seen=examples_seen,
        epoch=epoch,
        sample_count=sample_count,
        data_hash=data_hash,
        endpoint=endpoint,
        wall_time=time.time(),
    )


class UserLog:
    """``log``, ``log_mask`` and ``log_eval`` written once."""

    _pending: Any
    _timer: Any

    def _check_open(self) -> None:  # pragma: no cover - provided by the host class
        raise NotImplementedError

    def _charge(self, seconds: float) -> None:  # pragma: no cover - provided by the host class
        raise NotImplementedError

    def _eval_coordinate(self) -> tuple[int, int | None]:  # pragma: no cover
        raise NotImplementedError

    @property
    def _log_sink(self) -> Any:  # pragma: no cover - provided by the host class
        raise NotImplementedError

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """A scalar (loss, learning rate, ...) for the current step, or an explicit ``step``.

        Tensors stay on their device until the step boundary, where all of them are moved to the
        host in one transfer per device — never one ``.item()`` per call.
        """
        t0 = self._timer()
        self._check_open()
        self._pending.add_scalar(name, value, step)
        self._charge(self._timer() - t0)

    def log_mask(
        self,
        name: str,
        active_mask: Any,
        *,
        branch_dim: int | None = None,
        nominal_macs_per_unit: float | None = None,
    ) -> None:
        """Branch activity of the current step (stochastic depth, experts, unit dropout).

        ``name`` is the branch's qualified module name; each nonzero entry of ``active_mask`` is
        one active unit. Writes ``branch/<name>/active_fraction``, ``active_units``,
        ``total_units`` and, with ``nominal_macs_per_unit``, ``nominal_skipped_macs`` (nominal,
        not measured time or energy). A collector records the gradient cells of the sites of a
        branch with no active unit this step as ``not_scheduled`` (no payload), never as zeros.
        See :meth:`stepscope.runlog.PendingStep.add_mask` for ``branch_dim``.
        """
        t0 = self._timer()
        self._check_open()
        self._pending.add_mask(
            name, active_mask, branch_dim=branch_dim, nominal_macs_per_unit=nominal_macs_per_unit
        )
        self._charge(self._timer() - t0)

    def log_eval(
        self,
        split: str,
        metrics: Mapping[str, Any],
        *,
        sample_count: int | None = None,
        data_hash: str | None = None,
        endpoint: bool = False,
        epoch: int | None = None,
    ) -> EvalRecord:
        """Record one evaluation of ``split`` at the current training coordinate.

        ``optimizer_step`` is the number of steps recorded so far (0 at initialization),
        ``examples_seen`` the examples of those steps (``None`` if a step did not declare them),
        ``epoch`` your own count (``None``: not recorded). Tensor metrics are moved to the host
        in one transfer. Returns the stored :class:`~stepscope.runlog.EvalRecord`.
        """
        t0 = self._timer()
        self._check_open()
        step, seen = self._eval_coordinate()
        rec = make_eval(
            split,
            metrics,
            step=step,
            examples_seen=seen,
            epoch=epoch,
            sample_count=sample_count,
            data_hash=data_hash,
            endpoint=endpoint,
        )
        write_eval(self._log_sink, rec)
        self._charge(self._timer() - t0)
        return rec
