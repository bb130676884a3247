"""PyTorch Lightning: ``StepscopeCallback``, a ``lightning.pytorch.Callback``.

Add it to ``Trainer(callbacks=[...])``; it records every optimizer step of ``fit`` with the
collector's explicit spelling (see :mod:`stepscope.integrations.session`), in
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
overridden: no), ``scale`` from the precision plugin's ``GradScaler`` (``16-mixed``).

Multi-process strategies (DDP): every rank writes ``rank<k>/`` under the run directory with one
run id (broadcast from rank 0); ``stepscope merge`` merges them. Resuming ``fit(ckpt_path=...)``
appends a segment that continues at the checkpoint's ``global_step``.

Example
-------
>>> from stepscope.integrations.lightning import StepscopeCallback
>>> cb = StepscopeCallback(sites="Linear", streams=("gradient", "parameter"))
>>> cb.session.streams
('gradient', 'parameter')
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from stepscope.collect import DEFAULT_STREAMS, WatchSettings
from stepscope.errors import require_extra
from stepscope.integrations.session import ProbePlan, TrainerSession
from stepscope.probe import DenseProbe

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


class StepscopeCallback(_pl.Callback):
    """Record a Lightning ``fit`` with a :class:`~stepscope.HistoryCollector`.

    Parameters
    ----------
    sites, streams, cadence, settings
        What to watch, as for :class:`~stepscope.HistoryCollector`.
    probe
        Optional :class:`~stepscope.DenseProbe` (a fixed probe drawn from the training split),
        measured at step 0 and then on the densest cadence whose measured cost stays within 5%
        of training time (or a :class:`~stepscope.integrations.session.ProbePlan`).
    """

    def __init__(
        self,
        sites: Any = None,
        streams: tuple[str, ...] | list[str] = DEFAULT_STREAMS,
        cadence: Any = None,
        settings: WatchSettings | None = None,
        probe: DenseProbe | ProbePlan | None = None,
    ) -> None:
        super().__init__()
        self.session = TrainerSession(sites, streams, cadence, settings, probe)
        self._loss: torch.Tensor | None = None
        self._lrs: list[float] = []
        self._stepped_from = 0
        self._val_before: dict[str, Any] = {}
        self._val_examples = 0

    # ------------------------------------------------------------------ fit lifecycle
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        """Open the collector at the (possibly restored) ``global_step``."""
        self.session.start(
            pl_module,
            default_dir=f"{trainer.default_root_dir}/stepscope",
            trainer_step=trainer.global_step,
            rank=trainer.global_rank,
        )

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        """Close the collector (commits what is pending)."""
        self.session.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        """Close the collector on any exit path; committed steps are kept."""
        self.session.abort(exception)

    # ------------------------------------------------------------------ steps
    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        """The first micro-batch of a step opens the step transaction."""
        session = self.session
        if not session.in_step:
            optimizer = trainer.optimizers[0]
            session.begin_step(
                optimizer,
                trainer_step=trainer.global_step,
                scaler=getattr(trainer.precision_plugin, "scaler", None),
                epoch=trainer.current_epoch,
            )
            self._stepped_from = trainer.global_step
            self._loss = None
            self._lrs = [float(g["lr"]) for g in optimizer.param_groups]
        session.micro_batch(_batch_size(batch))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """After the micro-batch whose optimizer step ran, close the step transaction."""
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            loss = loss.detach()
            self._loss = loss if self._loss is None else self._loss + loss
        if trainer.global_step == self._stepped_from:
            return  # accumulating: the optimizer has not stepped yet
        scalars: dict[str, Any] = {} if self._loss is None else {"train/loss": self._loss}
        if len(self._lrs) == 1:
            scalars["train/lr"] = self._lrs[0]
        else:
            scalars.update({f"train/lr/group{i}": lr for i, lr in enumerate(self._lrs)})
        self.session.end_step(
            clipped=_clipped(trainer, pl_module), scalars=scalars, trainer_step=trainer.global_step
        )

    # ------------------------------------------------------------------ validation
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        """Remember the metrics before the loop, to keep only the ones it logs."""
        self._val_before = dict(trainer.callback_metrics)
        self._val_examples = 0

    def on_validation_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Count validation examples."""
        self._val_examples += _batch_size(batch) or 0

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """One ``log_eval('validation', ...)`` with the metrics this validation run logged."""
        if trainer.sanity_checking:
            return
        before = self._val_before
        metrics = {k: v for k, v in trainer.callback_metrics.items() if before.get(k) is not v}
        self.session.log_eval(
            VALIDATION,
            metrics,
            sample_count=self._val_examples or None,
            epoch=trainer.current_epoch,
        )


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
