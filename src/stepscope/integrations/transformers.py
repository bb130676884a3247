"""Hugging Face ``Trainer``: ``StepscopeCallback``, a ``transformers.TrainerCallback``.

Pass it in ``Trainer(callbacks=[...])``; it records every optimizer step of ``train`` with the
collector's explicit spelling (see :mod:`stepscope.integrations.trainer`), in
a new ``<args.output_dir>/stepscope/version_<N>`` per run unless ``settings.output_dir`` says
otherwise. accelerate's
``AcceleratedOptimizer`` is unwrapped to the torch optimizer it drives.

Event map: ``on_step_begin`` opens the step transaction (first micro-batch of a gradient
accumulation group), ``on_step_end`` closes it (after ``optimizer.step()``, the scheduler and
``zero_grad``); ``on_evaluate`` writes evaluation rows; ``on_log`` writes the Trainer's logged
training values; ``on_train_end`` closes the collector.

Logged Metrics
--------------
``train/loss``, ``train/grad_norm``, ``train/learning_rate``
    The values the Trainer itself logs (``on_log``, every ``logging_steps``), at the last optimizer
    step they cover: ``loss`` is the Trainer's mean training loss over the logging window.
``train/lr``
    Learning rate of parameter group 0 in force during each step (read at ``on_step_begin``).
``eval/validation/<metric>``
    Every metric of ``Trainer.evaluate`` (``eval_<metric>`` without its prefix; the runtime and
    throughput keys are left out), with ``sample_count`` = ``len(eval_dataset)`` where defined.
    An evaluation with another ``metric_key_prefix`` is recorded under that split.
Step facts: ``micro_batches`` and ``examples`` (training forwards of the step and their leading
batch dimension, counted by a forward pre-hook on the model: removed at ``on_train_end``),
``epoch`` (the Trainer's epoch index), ``clipped`` (``max_grad_norm > 0``: ``clip_grad_norm_``
was applied, which rescales only when the norm exceeds it), ``scale`` from accelerate's
``GradScaler`` (``fp16``).

Multi-process (``torchrun``): every rank writes ``rank<k>/`` under the run directory with one run
id; rank 0 prints where the run is. ``train(resume_from_checkpoint=...)`` appends a segment that
continues at the checkpoint's ``global_step``.

Example
-------
>>> from stepscope.integrations.transformers import StepscopeCallback
>>> cb = StepscopeCallback(sites="*mlp*", cadence=5)
>>> cb.watch.cadence
5
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from stepscope.errors import require_extra
from stepscope.integrations.trainer import WatchingCallback

if TYPE_CHECKING:  # the real types for mypy; at run time a missing extra refuses with a code
    import transformers as _hf
else:
    _hf = require_extra("transformers", "transformers", "stepscope's Hugging Face Trainer callback")

__all__ = ["StepscopeCallback"]

#: Keys of ``Trainer.evaluate`` metrics that describe the evaluation's speed, not the model.
TIMING_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second")
LOGGED = ("loss", "grad_norm", "learning_rate")


class StepscopeCallback(WatchingCallback, _hf.TrainerCallback):
    """Record a Hugging Face ``Trainer.train`` with a :class:`~stepscope.HistoryCollector`.

    Parameters as for :class:`~stepscope.integrations.trainer.WatchingCallback`; the
    :class:`~stepscope.integrations.trainer.TrainerWatch` it drives is ``watch``.
    """

    # what the hooks carry between events (an instance's own once assigned)
    _epoch: int | None = None  # the Trainer's epoch index
    _lr: float | None = None  # parameter group 0's learning rate during the step

    # ------------------------------------------------------------------ lifecycle
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the collector at the (possibly restored) ``global_step``."""
        self._start(args, state, kwargs["model"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the counting hook and close the collector."""
        self.watch.close()

    def _start(self, args: Any, state: Any, model: torch.nn.Module) -> None:
        self.watch.start(
            model,
            default_dir=Path(args.output_dir) / "stepscope",
            trainer_step=state.global_step,
            rank=args.process_index,
        )
        self.watch.own(model.register_forward_pre_hook(self._count_micro_batch, with_kwargs=True))

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The epoch index (``state.epoch`` is fractional; its integer part at the epoch start)."""
        self._epoch = int(state.epoch or 0)

    # ------------------------------------------------------------------ steps
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """First micro-batch of an accumulation group: open the step transaction."""
        self._begin(state, kwargs["optimizer"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After ``optimizer.step()``: declare the step's facts and close the transaction."""
        self._end(args, state)

    def _begin(self, state: Any, optimizer: Any) -> None:
        self._lr = float(optimizer.param_groups[0]["lr"])
        self.watch.begin_step(
            optimizer,
            trainer_step=state.global_step,
            scaler=getattr(optimizer, "scaler", None),
            epoch=self._epoch,
        )

    def _end(self, args: Any, state: Any) -> None:
        clipped = args.max_grad_norm is not None and args.max_grad_norm > 0
        scalars = {} if self._lr is None else {"train/lr": self._lr}
        self.watch.end_step(clipped=clipped, scalars=scalars, trainer_step=state.global_step)

    def _count_micro_batch(self, module: torch.nn.Module, inputs: tuple, kwargs: dict) -> None:
        if not (self.watch.in_step and module.training and torch.is_grad_enabled()):
            return  # evaluation forwards and forwards outside a step are not micro-batches
        first = next(
            (v for v in (*inputs, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()),
            None,
        )
        self.watch.micro_batch(None if first is None else int(first.shape[0]))

    # ------------------------------------------------------------------ run log
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """The Trainer's logged training values, at the last step they cover."""
        if state.global_step >= 1:
            for name, value in _training_values(logs or {}).items():
                self.watch.log(name, value, step=state.global_step - 1)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
    ) -> None:
        """One ``log_eval`` per ``Trainer.evaluate``: split from the metric prefix."""
        if metrics:
            split, clean = _split_metrics(metrics)
            count = _sample_count(kwargs.get("eval_dataloader"))
            self.watch.log_eval(split, clean, sample_count=count, epoch=self._epoch)


def _training_values(logs: dict[str, Any]) -> dict[str, float]:
    """``train/<key>`` for each real number of :data:`LOGGED` in the Trainer's ``logs``."""
    return {
        f"train/{key}": float(value)
        for key in LOGGED
        if isinstance(value := logs.get(key), (int, float)) and not isinstance(value, bool)
    }


def _sample_count(loader: Any) -> int | None:
    """``len(loader.dataset)``, or ``None`` without one (an iterable dataset has no length)."""
    dataset = getattr(loader, "dataset", None)
    try:
        return len(dataset) if dataset is not None else None
    except TypeError:  # an iterable dataset has no length: sample count unknown
        return None


def _split_metrics(metrics: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``{"eval_loss": ..}`` -> ``("validation", {"loss": ..})``; another prefix is its split."""
    keys = [k for k in metrics if "_" in k and k != "epoch"]
    prefix = keys[0].split("_", 1)[0] if keys else "eval"
    clean = {
        k[len(prefix) + 1 :]: v
        for k, v in metrics.items()
        if k.startswith(prefix + "_") and not k.endswith(TIMING_SUFFIXES)
    }
    return ("validation" if prefix == "eval" else prefix), clean
