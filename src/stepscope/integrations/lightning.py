"""PyTorch Lightning: ``StepscopeCallback``, a ``lightning.pytorch.Callback``.

Add it to ``Trainer(callbacks=[...])``; it records every optimizer step of ``fit`` with the
collector's explicit spelling (see :mod:`stepscope.integrations.trainer`), in
a new ``<default_root_dir>/stepscope/version_<N>`` per run unless ``settings.output_dir`` says
otherwise.

Logged Metrics
--------------
``train/loss``
    Sum over the step's micro-batches of the ``loss`` Lightning hands to ``on_train_batch_end``
    (already divided by ``accumulate_grad_batches``): the objective whose gradient the step used.
``train/lr``
    Learning rate of the first optimizer's parameter group 0 in force during the step
    (``train/lr/group<i>`` for every group when there are several).
``eval/validation/<metric>``
    Every metric logged (``self.log``) inside the validation loop of ``fit``, once per validation
    run, with ``sample_count`` = validation examples seen (sanity checks are not recorded).
Step facts: ``micro_batches`` (training batches of the step), ``examples`` (their batch sizes
from ``lightning.pytorch.utilities.data.extract_batch_size``), ``epoch`` (``trainer.current_epoch``),
``clipped`` (``gradient_clip_val`` set: yes; unset and ``configure_gradient_clipping`` not
overridden: no; manual optimization: unknown), ``scale`` from the precision plugin's
``GradScaler`` (``16-mixed``).

Optimizers and steps
--------------------
Every optimizer ``configure_optimizers`` returns is watched (each owns the rows of its own
parameters). Gradient rows are what the optimizer consumed: Lightning runs backward, unscaling
and ``gradient_clip_val`` clipping inside the closure it hands to ``optimizer.step``, and the
collector reads the gradients after that closure returns (post-clip, accumulated over the step's
micro-batches). Automatic optimization: one step per optimizer step, from the first
micro-batch's ``on_train_batch_start`` to the ``on_train_batch_end`` after it. Manual
optimization (``automatic_optimization = False``): **one step per optimizer step**, as
``trainer.global_step`` counts them: a step ends right after its ``opt.step()`` (a post-step
hook registered after the collector's) and the next begins there, so a GAN stepping D and then G
in one batch records two steps (D's gradients and update in the first, G's in the second; the
batch's forwards fall in the step they ran in, its examples in the first), and a GAN stepping
them on alternate batches records each batch's optimizer. A manual step whose ``opt.step()`` the
scaler skipped ends at ``on_train_batch_end`` with ``applied=no``. ``train/loss`` in manual
optimization: the ``training_step``'s returned loss, if any, on the batch's last step.

Multi-process strategies (DDP): every rank writes ``rank<k>/`` under the run directory with one
run id (broadcast from rank 0); ``stepscope merge`` merges them. Resuming ``fit(ckpt_path=...)``
appends a segment that continues at the checkpoint's ``global_step``.

Example
-------
>>> from stepscope.integrations.lightning import StepscopeCallback
>>> cb = StepscopeCallback(sites="Linear", streams=("gradient", "parameter"))
>>> cb.watch.streams
('gradient', 'parameter')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from stepscope.collect.optimizer import unwrap_optimizer
from stepscope.errors import require_extra
from stepscope.integrations.trainer import WatchingCallback
from stepscope.stephooks import OuterStepHooks

if TYPE_CHECKING:  # the real types for mypy; at run time a missing extra refuses with a code
    import lightning.pytorch as _pl
    import lightning.pytorch.utilities.data as _data
else:
    _pl = require_extra("lightning.pytorch", "lightning", "stepscope's Lightning callback")
    _data = require_extra(
        "lightning.pytorch.utilities.data", "lightning", "stepscope's Lightning callback"
    )

__all__ = ["StepscopeCallback"]

VALIDATION = "validation"


class StepscopeCallback(WatchingCallback, _pl.Callback):
    """Record a Lightning ``fit`` with a :class:`~stepscope.HistoryCollector`.

    Parameters as for :class:`~stepscope.integrations.trainer.WatchingCallback`; the
    :class:`~stepscope.integrations.trainer.TrainerWatch` it drives is ``watch``.
    """

    # what the hooks carry between events (an instance's own once assigned)
    _loss: torch.Tensor | None = None  # the step's loss so far
    _lrs: tuple[float, ...] = ()  # the first optimizer's learning rates during the step
    _stepped_from = 0  # trainer.global_step when the step began
    _last_step: int | None = None  # the last step recorded
    _batch_from = 0  # trainer.global_step when the batch began
    _val_before: Mapping[str, Any] | None = None  # callback_metrics before the validation loop
    _val_examples = 0

    # ------------------------------------------------------------------ fit lifecycle
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Open the collector at the (possibly restored) ``global_step``."""
        self.watch.start(
            pl_module,
            default_dir=f"{trainer.default_root_dir}/stepscope",
            trainer_step=trainer.global_step,
            rank=trainer.global_rank,
        )

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the collector (commits what is pending)."""
        self.watch.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close the collector on any exit path; committed steps are kept."""
        self.watch.abort(exception)

    # ------------------------------------------------------------------ steps
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """The first micro-batch of a step opens the step transaction."""
        self._before_batch(trainer, pl_module, batch)

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After the micro-batch whose optimizer step ran, close the step transaction."""
        self._after_batch(trainer, pl_module, outputs)

    def _before_batch(self, trainer: Any, pl_module: Any, batch: Any) -> None:
        if not self.watch.in_step:
            self._begin(trainer, trainer.global_step)
        if not pl_module.automatic_optimization:
            self._watch_manual_steps(trainer, pl_module)
        self._batch_from = trainer.global_step
        self.watch.micro_batch(_batch_size(batch))

    def _after_batch(self, trainer: Any, pl_module: Any, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
        if pl_module.automatic_optimization:
            if trainer.global_step != self._stepped_from:  # else accumulating
                self._end(trainer, pl_module, trainer.global_step)
            return
        # manual: steps end at their optimizer's post-step hook; one the scaler skipped (no
        # hook fired, Lightning counted it) ends here, with applied=no
        if self.watch.in_step and trainer.global_step == self._stepped_from + 1:
            self._end(trainer, pl_module, trainer.global_step)
            self._begin(trainer, trainer.global_step)
        stepped = trainer.global_step > self._batch_from
        if stepped and self._loss is not None and self._last_step is not None:
            self.watch.log("train/loss", self._loss, step=self._last_step)
        self._loss = None

    def _begin(self, trainer: Any, trainer_step: int) -> None:
        optimizers = list(trainer.optimizers)
        self.watch.begin_step(
            optimizers if len(optimizers) > 1 else optimizers[0],
            trainer_step=trainer_step,
            scaler=getattr(trainer.precision_plugin, "scaler", None),
            epoch=trainer.current_epoch,
        )
        self._stepped_from = trainer_step
        if trainer.lightning_module.automatic_optimization:  # manual: reset at the batch's end
            self._loss = None
        self._lrs = tuple(float(g["lr"]) for g in optimizers[0].param_groups)

    def _end(self, trainer: Any, pl_module: Any, trainer_step: int) -> None:
        automatic = pl_module.automatic_optimization
        scalars: dict[str, Any] = {}
        if automatic and self._loss is not None:
            scalars["train/loss"] = self._loss
        if len(self._lrs) == 1:
            scalars["train/lr"] = self._lrs[0]
        else:
            scalars.update({f"train/lr/group{i}": lr for i, lr in enumerate(self._lrs)})
        clipped = _clipped(trainer, pl_module) if automatic else None
        self._last_step = self.watch.end_step(
            clipped=clipped, scalars=scalars, trainer_step=trainer_step
        )

    def _watch_manual_steps(self, trainer: Any, pl_module: Any) -> None:
        """Manual optimization: a post-step hook on every optimizer, registered after the
        collector's (which the first transaction attached), ends each optimizer step's step."""
        if self.watch.hooked or not self.watch.in_step:
            return
        for opt in trainer.optimizers:
            self.watch.own(
                OuterStepHooks(
                    unwrap_optimizer(opt),
                    post=lambda _o, _a, _k: self._after_manual_step(trainer, pl_module),
                )
            )

    def _after_manual_step(self, trainer: Any, pl_module: Any) -> None:
        if not self.watch.in_step:
            return
        step = trainer.global_step + 1  # Lightning counts the step after torch's post-hooks
        self._end(trainer, pl_module, step)
        self._begin(trainer, step)

    # ------------------------------------------------------------------ validation
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Remember the metrics before the loop, to keep only the ones it logs."""
        self._val_before, self._val_examples = dict(trainer.callback_metrics), 0

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Count validation examples."""
        self._val_examples += _batch_size(batch) or 0

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """One ``log_eval('validation', ...)`` with the metrics this validation run logged."""
        if not trainer.sanity_checking:
            self.watch.log_eval(
                VALIDATION,
                _logged_since(self._val_before or {}, trainer.callback_metrics),
                sample_count=self._val_examples or None,
                epoch=trainer.current_epoch,
            )


def _logged_since(before: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics logged since ``before`` was taken (a value object that is not the same)."""
    return {k: v for k, v in metrics.items() if before.get(k) is not v}


def _batch_size(batch: Any) -> int | None:
    try:
        return int(_data.extract_batch_size(batch))
    except Exception:  # a batch Lightning cannot size: examples unknown, never guessed
        return None


def _clipped(trainer: Any, pl_module: Any) -> bool | None:
    if trainer.gradient_clip_val:
        return True
    own = type(pl_module).configure_gradient_clipping
    return False if own is _pl.LightningModule.configure_gradient_clipping else None
