"""The fixed dense probe: one forward and one backward of a small fitting-split subset.

:class:`DenseProbe` measures, per module with parameters and a per-example rule (``Linear``, HF
``Conv1D``, ``Conv1d``/``Conv2d`` through unfolding, ``Embedding``, ``LayerNorm``, ``RMSNorm``;
:mod:`stepscope.probe.sequence`), the
per-example gradient moments of :mod:`stepscope.probe.moments`, activation/backprop zero
fractions, parameter norms and the distances of :mod:`stepscope.probe.state`, plus the probe's
cross-entropy, accuracy, predicted-class counts and confusion matrix.

How: the model runs in eval mode on the probe with forward hooks that keep each layer's input
``A`` and output ``Z``; ``torch.autograd.grad`` of the *summed* cross-entropy with respect to the
``Z`` gives ``B`` at per-example scale (= mean-loss backprop times ``n``). Nothing is written into
``.grad``; parameter gradients are never requested, so the backward is one pass and the mean
gradient ``B^T A / n`` costs the usual weight-gradient matmul. State (modes, ``.grad``,
``requires_grad``, every RNG) is restored on every exit path, parameter and buffer versions are
checked, and no random number is drawn.

Example
-------
>>> import torch
>>> torch.manual_seed(0) and None
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
>>> probe = DenseProbe(torch.randn(50, 4), torch.randint(0, 3, (50,)), size=16, seed=1)
>>> rec = probe.measure(model, step=0, examples_seen=0, epoch=0)
>>> sorted(rec.layers), rec.model.n_examples
(['0', '2'], 16)
>>> rec.layers["0"].fisher_trace >= rec.layers["0"].mean_grad_sq_norm
True
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from stepscope._purity import preserved_state
from stepscope.defaults import DEFAULT_SEED
from stepscope.denominators import RULE
from stepscope.errors import Refusal
from stepscope.probe.assemble import block_record, zero_fraction, zero_validity
from stepscope.probe.forward import CONFUSION_CLASS_CAP, ProbeForward, run_probe_forward
from stepscope.probe.moments import absent_moments, gradient_moments
from stepscope.probe.outputs import OutputSelector
from stepscope.probe.recorder import LayerRecord, ProbeRecord, StepAxes
from stepscope.probe.selection import ProbeSelection, select_probe
from stepscope.probe.sequence import (
    check_module,
    measured_parameters,
    module_kind,
    module_problem,
    uncovered_parameters,
)
from stepscope.probe.state import (
    ParamSnapshot,
    StepUpdate,
    UpdateCapture,
    capture_update,
    distances,
    refresh_snapshot,
    state_versions,
    take_snapshot,
)

CONVENTIONS: dict[str, Any] = {
    "mode": "eval",
    "backprop_scale": "per-example: d(sum CE)/dZ = n * d(mean CE)/dZ",
    "weight_and_bias": "separate blocks; weight metrics exclude bias coordinates",
    "covariance_trace": "fisher_trace - mean_grad_sq_norm, clipped to 0 only within round-off",
    "gradient_diversity": "Yin et al. sum_i ||g_i||^2 / ||sum_i g_i||^2 (legacy = n * this)",
    "gradient_diversity_legacy_scale": "the seed's fisher_trace / ||G||^2 = n * gradient_diversity",
    "negligible_denominator": RULE,
    "covariance_cancellation": "validity covariance_relative_error_estimate = eps(dtype) * "
    "(fisher_trace + mean_grad_sq_norm) / |covariance|: the operand-rounding floor of the error, "
    "not a bound (covariance_relative_error_kind); > 1% flags covariance_cancellation_suspect",
    "zero_fraction": "exact zeros (== 0), not legacy <= 0",
    "reductions": "float32 on device for tensors; float64 on host for n-length arrays",
    "example": "one example = one probe row; a sequence's loss sums its scored tokens",
    "shared_parameters": "a parameter used by several calls or modules (tied embeddings) gets its "
    "total per-example gradient, summed over all uses, in every module record that owns it",
}


class DenseProbe:
    """A fixed probe drawn once from the fitting training split.

    Parameters
    ----------
    inputs, labels
        The fitting training split (``(N, ...)`` inputs, ``(N,)`` integer labels). Indices refer to
        it; anything outside refuses ``probe_split_invalid``.
    size
        Number of probe examples drawn when ``indices`` is ``None`` (default 128).
    seed
        Seed of the probe's private ``torch.Generator`` (the global RNG is never used).
    indices
        Explicit probe positions inside the split, instead of a seeded draw.
    layers
        Qualified names of the modules to measure; default every module with a per-example rule
        (Linear, HF Conv1D, Conv1d/Conv2d with groups 1, Embedding, LayerNorm, RMSNorm).
    input_normalization
        Description of the inputs' normalisation, recorded with every measurement.
    output
        ``None`` (the model returns logits), a key (``"logits"`` of a dict / HF ``ModelOutput``)
        or a callable selecting the logits from the model's output.
    next_token
        Labels are ``(N, T)`` token ids scored with the causal-LM shift (logits at ``t`` predict
        the label at ``t + 1``); ``-100`` labels are not scored. Without it, ``(N, T)`` labels
        are scored position by position against ``(n, T, C)`` logits.
    confusion_cap
        Largest class count with a dense confusion matrix; above it the confusion is bounded
        (:class:`~stepscope.probe.recorder.ModelRecord`).
    """

    def __init__(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        size: int = 128,
        seed: int = DEFAULT_SEED,
        indices: Sequence[int] | torch.Tensor | np.ndarray | None = None,
        layers: Sequence[str] | None = None,
        input_normalization: str = "none recorded (inputs used as given)",
        output: OutputSelector = None,
        next_token: bool = False,
        confusion_cap: int = CONFUSION_CLASS_CAP,
    ) -> None:
        self.selection: ProbeSelection
        self.selection, self._inputs, self._labels = select_probe(
            inputs, labels, size, seed, indices, input_normalization
        )
        self.layer_names: tuple[str, ...] | None = None if layers is None else tuple(layers)
        self.output = output
        self.next_token = bool(next_token)
        self.confusion_cap = int(confusion_cap)
        self.init_snapshot: ParamSnapshot | None = None
        self.snapshot: ParamSnapshot | None = None
        self.last_update: StepUpdate | None = None
        self._snapshot_owned = False
        self._device_cache: dict[tuple[str, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}
        #: which calls are broadcast over the batch, per call layout (stepscope.probe.calls)
        self._layout_cache: dict[tuple, list[bool]] = {}

    # -- layers and parameters -------------------------------------------------------------
    def resolve_layers(self, model: torch.nn.Module) -> dict[str, torch.nn.Module]:
        """Qualified name -> module for the measured layers, in model order.

        By default every module with a per-example rule and a parameter; a module named in
        ``layers`` without one refuses ``probe_layer_unsupported`` naming its type.
        """
        modules = dict(model.named_modules())
        if self.layer_names is None:
            found = {n: m for n, m in modules.items() if module_problem(m) is None}
        else:
            found = {}
            for name in self.layer_names:
                module = modules.get(name)
                if module is None:
                    raise Refusal(
                        "probe_layer_unsupported",
                        f"layer {name!r}: no such module",
                        ["list module names from model.named_modules()"],
                    )
                check_module(name, module)
                found[name] = module
        if not found:
            raise Refusal(
                "probe_layer_unsupported",
                "the model has no module the probe measures (Linear, HF Conv1D, Conv1d/Conv2d, "
                "Embedding, LayerNorm, RMSNorm, LayerNorm-like)",
                ["pass a model with such layers", "or name them via layers=[...]"],
            )
        return found

    def tracked_params(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """``<layer>.weight`` / ``<layer>.bias`` -> parameter, for the measured layers."""
        out: dict[str, torch.Tensor] = {}
        for name, module in self.resolve_layers(model).items():
            for part in measured_parameters(module):
                out[f"{name}.{part}"] = getattr(module, part)
        return out

    def snapshot_init(self, model: torch.nn.Module, step: int = 0) -> ParamSnapshot:
        """Keep the parameters at initialisation, for ``displacement_from_init`` (bytes disclosed)."""
        self.init_snapshot = take_snapshot(self.tracked_params(model), step)
        return self.init_snapshot

    def take_snapshot(self, model: torch.nn.Module, step: int) -> ParamSnapshot:
        """Set the reference of ``delta_since_snapshot`` to the parameters at ``step``."""
        self.snapshot = take_snapshot(self.tracked_params(model), step)
        self._snapshot_owned = False  # handed to the caller: never refreshed in place
        return self.snapshot

    @contextmanager
    def around_step(
        self,
        model: torch.nn.Module,
        *,
        step: int,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> Iterator[UpdateCapture]:
        """Measure the true update of exactly one optimizer step, declared before it runs.

        ``step`` is the optimizer step count before the step. The before-snapshot's memory is in
        ``capture.snapshot_nbytes``; the next :meth:`measure` at ``step + 1`` reports ``update``
        and ``update_ratio``. With ``optimizer``, anything but one ``step()`` call refuses
        ``probe_update_steps_invalid``.

        Example
        -------
        >>> with probe.around_step(model, step=41, optimizer=opt) as upd:  # needs the model, optimizer and batch of a training loop  # doctest: +SKIP
        ...     opt.step()
        """
        with capture_update(self.tracked_params(model), step, optimizer) as capture:
            yield capture
        self.last_update = capture.result

    def update(self) -> StepUpdate:
        """The last measured one-step update, or refuse ``snapshot_missing``."""
        if self.last_update is None:
            raise Refusal(
                "snapshot_missing",
                "no one-step update was measured",
                ["wrap exactly one optimizer.step() in probe.around_step(model, step=...)"],
            )
        return self.last_update

    # -- measurement -----------------------------------------------------------------------
    def _batch(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        key = (str(device), dtype)
        if key not in self._device_cache:
            x = self._inputs.to(device)
            x = x.to(dtype) if x.is_floating_point() else x
            self._device_cache[key] = (x, self._labels.to(device))
        return self._device_cache[key]

    def measure(
        self,
        model: torch.nn.Module,
        *,
        step: int,
        examples_seen: int,
        epoch: int,
        active: Mapping[str, bool] | None = None,
        resnapshot: bool = True,
    ) -> ProbeRecord:
        """Measure the probe on ``model`` without changing any state.

        Parameters
        ----------
        model
            A classifier returning ``(n, classes)`` logits or a language model returning
            ``(n, T, classes)`` (selected with ``output=``), float32 (or float64) parameters.
        step, examples_seen, epoch
            The training clocks this measurement belongs to.
        active
            Layer name -> whether that layer's branch was active in the last training step;
            ``False`` reports its gradient quantities as ``None`` (stale/absent), not 0.
        resnapshot
            After measuring, make the current parameters the ``delta_since_snapshot`` reference.
            The first measurement at ``step == 0`` also becomes the init snapshot if none is set.

        Returns
        -------
        ProbeRecord
        """
        started = time.perf_counter()
        layers = self.resolve_layers(model)
        params = list(model.parameters())
        dtypes = {p.dtype for p in params} or {torch.float32}
        dtype = next(iter(dtypes))
        if len(dtypes) > 1 or dtype not in (torch.float32, torch.float64):
            raise Refusal(
                "probe_dtype_unsupported",
                f"the model's parameters are {sorted(map(str, dtypes))}; the probe measures in "
                "float32 (float64 accepted) and never lowers precision",
                ["measure a float32 copy of the model (keep training precision separate)"],
            )
        unknown = sorted(set(active or {}) - set(layers))
        if unknown:
            raise Refusal(
                "probe_layer_unsupported",
                f"active mask names layers that are not measured: {unknown}",
                ["use the qualified names of measured layers"],
            )
        device = params[0].device if params else torch.device("cpu")
        x, y = self._batch(device, dtype)
        versions = state_versions(model)
        # .grad is never written (autograd.grad on layer outputs only); state_versions checks that
        # instead of cloning every gradient
        with (
            preserved_state(model, restore_grads=False),
            torch.autocast(device.type, enabled=False),
        ):
            model.eval()
            fwd = run_probe_forward(
                model,
                layers,
                x,
                y,
                output=self.output,
                next_token=self.next_token,
                confusion_cap=self.confusion_cap,
                layout_cache=self._layout_cache,
            )
        if state_versions(model) != versions:
            raise Refusal(
                "probe_state_changed",
                "a parameter, buffer or .grad was written during the probe's eval forward/backward",
                ["make the model's eval forward free of in-place state updates"],
            )
        if self.init_snapshot is None and step == 0:
            self.init_snapshot = take_snapshot(self.tracked_params(model), 0)
        record = self._assemble(model, layers, fwd, step, examples_seen, epoch, active or {})
        if resnapshot:  # refresh the probe's own snapshot buffers in place (no new allocation)
            own = self.snapshot if self._snapshot_owned else None
            self.snapshot = refresh_snapshot(own, self.tracked_params(model), step)
            self._snapshot_owned = True
        record.cost["seconds"] = time.perf_counter() - started
        return record

    def _assemble(
        self,
        model: torch.nn.Module,
        layers: dict[str, torch.nn.Module],
        fwd: ProbeForward,
        step: int,
        examples_seen: int,
        epoch: int,
        active: Mapping[str, bool],
    ) -> ProbeRecord:
        host = fwd.to_host()
        n = fwd.n
        params = self.tracked_params(model)
        param_l2 = {k: float(torch.linalg.vector_norm(p.detach())) for k, p in params.items()}
        from_init = distances(params, self.init_snapshot) if self.init_snapshot else {}
        since = distances(params, self.snapshot) if self.snapshot else {}
        upd = (
            self.last_update
            if self.last_update and self.last_update.optimizer_step_after == step
            else None
        )
        dtype_name = str(fwd.dtype).replace("torch.", "")
        out: dict[str, LayerRecord] = {}
        for index, (name, module) in enumerate(layers.items()):
            reason = None
            if active.get(name, True) is False:
                reason = "inactive_in_mask"
            elif name not in host.layers:
                reason = fwd.absent.get(name, "not_executed")
            blocks = {}
            for part in measured_parameters(module):
                key = f"{name}.{part}"
                if reason is None:
                    moments = gradient_moments(*host.layers[name][part], dtype=dtype_name)
                else:
                    moments = absent_moments(reason, n)
                blocks[part] = block_record(
                    key, moments, param_l2, from_init, since, self.snapshot, step, upd
                )
            zeros = host.zero_counts.get(name) if reason is None else None
            weight = blocks["weight"]
            validity = dict(weight.validity)
            validity.update(zero_validity(zeros))
            validity["shared_with"] = fwd.shared.get(f"{name}.weight")
            validity["calls"] = fwd.calls.get(name)
            out[name] = LayerRecord(
                **{f: getattr(weight, f) for f in weight.keys() if f != "validity"},
                validity=validity,
                kind=module_kind(module) or "linear",
                legacy_index=index,
                activation_zero_fraction=zero_fraction(zeros, 0),
                backprop_zero_fraction=zero_fraction(zeros, 2),
                bias=blocks.get("bias"),
            )
        return ProbeRecord(
            step=StepAxes(int(step), int(examples_seen), int(epoch)),
            model=host.model,
            layers=out,
            probe=self.selection.to_dict() | {"dtype": str(fwd.dtype).replace("torch.", "")},
            conventions=dict(CONVENTIONS),
            uncovered_parameters=uncovered_parameters(model, layers),
            cost={
                "forward_passes": 1,
                "backward_passes": fwd.backward_passes,
                "init_snapshot_nbytes": self.init_snapshot.nbytes if self.init_snapshot else None,
                "delta_snapshot_nbytes": self.snapshot.nbytes if self.snapshot else None,
                "update_snapshot_nbytes": upd.snapshot_nbytes if upd else None,
            },
        )


__all__ = ["DenseProbe"]
