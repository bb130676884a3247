"""Hugging Face ``Trainer``: ``StepscopeCallback``, a ``transformers.TrainerCallback``.

Pass it in ``Trainer(callbacks=[...])``; it records every optimizer step of ``train`` with the
collector's explicit spelling (see :mod:`stepscope.integrations.session`), in
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
>>> cb.session.cadence
5
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from stepscope.collect import DEFAULT_STREAMS, WatchSettings
from stepscope.errors import require_extra
from stepscope.integrations.session import ProbePlan, TrainerSession
from stepscope.probe import DenseProbe

if TYPE_CHECKING:  # the real types for mypy; at run time a missing extra refuses with a code
    import transformers as _hf
else:
    _hf = require_extra("transformers", "transformers", "stepscope's Hugging Face Trainer callback")

__all__ = ["StepscopeCallback"]

#: Keys of ``Trainer.evaluate`` metrics that describe the evaluation's speed, not the model.
TIMING_SUFFIXES = ("_runtime", "_samples_per_second", "_steps_per_second")
LOGGED = ("loss", "grad_norm", "learning_rate")


class StepscopeCallback(_hf.TrainerCallback):
    """Record a Hugging Face ``Trainer.train`` with a :class:`~stepscope.HistoryCollector`.

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
        self.session = TrainerSession(sites, streams, cadence, settings, probe)
        self._hook: Any = None
        self._epoch: int | None = None
        self._lr: float | None = None

    # ------------------------------------------------------------------ lifecycle
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the collector at the (possibly restored) ``global_step``."""
        model = kwargs["model"]
        self.session.start(
            model,
            default_dir=Path(args.output_dir) / "stepscope",
            trainer_step=state.global_step,
            rank=args.process_index,
        )
        self._hook = model.register_forward_pre_hook(self._count_micro_batch, with_kwargs=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Remove the counting hook and close the collector."""
        try:
            if self._hook is not None:
                self._hook.remove()
        finally:
            self._hook = None
            self.session.close()

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The epoch index (``state.epoch`` is fractional; its integer part at the epoch start)."""
        self._epoch = int(state.epoch or 0)

    # ------------------------------------------------------------------ steps
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """First micro-batch of an accumulation group: open the step transaction."""
        optimizer = kwargs["optimizer"]
        self._lr = float(optimizer.param_groups[0]["lr"])
        self.session.begin_step(
            optimizer,
            trainer_step=state.global_step,
            scaler=getattr(optimizer, "scaler", None),
            epoch=self._epoch,
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After ``optimizer.step()``: declare the step's facts and close the transaction."""
        clipped = args.max_grad_norm is not None and args.max_grad_norm > 0
        scalars = {} if self._lr is None else {"train/lr": self._lr}
        self.session.end_step(clipped=clipped, scalars=scalars, trainer_step=state.global_step)

    def _count_micro_batch(self, module: torch.nn.Module, inputs: tuple, kwargs: dict) -> None:
        if not (self.session.in_step and module.training and torch.is_grad_enabled()):
            return  # evaluation forwards and forwards outside a step are not micro-batches
        first = next(
            (v for v in (*inputs, *kwargs.values()) if isinstance(v, torch.Tensor) and v.dim()),
            None,
        )
        self.session.micro_batch(None if first is None else int(first.shape[0]))

    # ------------------------------------------------------------------ run log
    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        """The Trainer's logged training values, at the last step they cover."""
        if not logs or state.global_step < 1:
            return
        for key in LOGGED:
            value = logs.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.session.log(f"train/{key}", float(value), step=state.global_step - 1)

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: Any = None, **kwargs: Any
    ) -> None:
        """One ``log_eval`` per ``Trainer.evaluate``: split from the metric prefix."""
        if not metrics:
            return
        split, clean = _split_metrics(metrics)
        loader = kwargs.get("eval_dataloader")
        dataset = getattr(loader, "dataset", None)
        try:
            count = len(dataset) if dataset is not None else None
        except TypeError:  # an iterable dataset has no length: sample count unknown
            count = None
        self.session.log_eval(split, clean, sample_count=count, epoch=self._epoch)


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
