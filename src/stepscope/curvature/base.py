"""The base of the curvature operators: a symmetric matrix over the trainable parameters, applied.

:class:`CurvatureOperator` holds what every curvature-matrix-vector product shares: the probe
batch (validated once), the scored logit rows, the mean and per-example cross-entropy losses, flat
and per-parameter vector layouts, and the count and wall-clock time of every product. A new
operator extends it by writing :meth:`CurvatureOperator._apply`; the three exact ones (Hessian,
GGN, empirical Fisher) and the factories are in :mod:`stepscope.curvature.products`.

Example
-------
>>> import torch
>>> from stepscope.curvature.base import CurvatureOperator, CurvatureKind
>>> class Identity(CurvatureOperator):
...     kind = CurvatureKind.HESSIAN  # any kind: this toy applies the identity
...     def _apply(self, v):
...         return [t.clone() for t in v]
>>> _ = torch.manual_seed(0)
>>> op = Identity(torch.nn.Linear(3, 2), torch.randn(4, 3), torch.tensor([0, 1, 1, 0]))
>>> v = torch.arange(op.dim, dtype=torch.float32)
>>> bool(torch.equal(op.matvec_flat(v), v)), op.products_used, op.dim
(True, 1, 8)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from stepscope.codec import parse_enum
from stepscope.errors import Refusal
from stepscope.probe.crossentropy import ce_logit_gradient, stable_cross_entropy
from stepscope.probe.outputs import OutputSelector, score_targets, select_logits


class CurvatureKind(str, Enum):
    """Which curvature matrix a product applies."""

    HESSIAN = "hessian"
    GGN = "ggn"
    EMPIRICAL_FISHER = "empirical_fisher"


class LossKind(str, Enum):
    """The loss whose curvature is measured (mean reduction over the probe batch)."""

    CROSS_ENTROPY = "cross_entropy"


#: For each kind: is the matrix positive semi-definite (so its quadratic forms are >= 0)?
PSD: dict[CurvatureKind, bool] = {
    CurvatureKind.HESSIAN: False,
    CurvatureKind.GGN: True,
    CurvatureKind.EMPIRICAL_FISHER: True,
}

LOSS_CONVENTION = (
    "mean cross-entropy over the probe batch, L = (1/n) sum_i CE(f(x_i), y_i); "
    "M is the Hessian / GGN / empirical Fisher of that mean; "
    "empirical Fisher = (1/n) sum_i g_i g_i^T with g_i the per-example-loss gradients; "
    "model evaluated in eval() mode"
)


@dataclass(frozen=True)
class _ScoredRows:
    """The scored logit positions and each scored row's example and label (set by the first forward).

    ``keep`` is ``None`` for class labels (every row scored); see
    :class:`~stepscope.probe.outputs.ScoredTargets`.
    """

    keep: Tensor | None
    owner: Tensor
    labels: Tensor


class CurvatureOperator:
    """A symmetric curvature matrix over the trainable parameters, applied to vectors.

    Subclasses implement :meth:`_apply` (one exact matrix-vector product). The base class
    validates, counts (:attr:`products_used`, :attr:`gradients_used`) and times
    (:attr:`seconds`, wall clock, device-synchronised) every product.

    Parameters
    ----------
    model
        A classifier returning logits of shape ``(n, C)``. Used as is (no copy, no mode change);
        prefer :func:`probe_operator`, which guards state and sets ``eval()``.
    x, y
        The fixed probe batch: inputs with ``x.shape[0] == n`` and integer labels of shape ``(n,)``
        or token labels ``(n, T)`` (``-100`` not scored; one example's loss sums its tokens).
    loss
        Only ``"cross_entropy"`` (mean over examples).
    output, next_token
        Logit selector and causal-LM shift (:mod:`stepscope.probe.outputs`).
    """

    kind: CurvatureKind

    def __init__(
        self,
        model: torch.nn.Module,
        x: Tensor,
        y: Tensor,
        loss: str = "cross_entropy",
        output: OutputSelector = None,
        next_token: bool = False,
    ) -> None:
        self.loss = parse_enum(LossKind, loss, "loss", "curvature_mode_invalid")
        self.output = output
        self.next_token = bool(next_token)
        self._scored: _ScoredRows | None = None  # fixed by the first forward (setup)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise Refusal(
                "curvature_model_unsupported",
                "the model has no trainable parameters (requires_grad=True).",
                ["enable requires_grad on the parameters to be measured"],
            )
        self.model = model
        self.names = [name for name, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.dtype = named[0][1].dtype
        self.device = named[0][1].device
        if any(p.dtype != self.dtype or p.device != self.device for _, p in named):
            raise Refusal(
                "curvature_model_unsupported",
                "trainable parameters have mixed dtypes or devices.",
                ["move the model to one device and dtype, or pass dtype=torch.float64"],
            )
        if not self.dtype.is_floating_point:
            raise Refusal("curvature_model_unsupported", "parameters are not floating point.")
        # Fresh leaves that share storage with the parameters: reading only, never writing.
        self.params = {name: p.detach().requires_grad_(True) for name, p in named}
        self.x, self.y = _validate_batch(x, y, self.dtype, self.device)
        self.dim = sum(p.numel() for _, p in named)
        self.products_used = 0
        self.gradients_used = 0
        self.seconds = 0.0
        start = self._now()
        self._setup()
        self.seconds += self._now() - start

    # -- what a subclass writes ------------------------------------------------------------------
    def _setup(self) -> None:
        """Build what every product reuses (graphs, cached VJPs)."""

    def _apply(self, v: list[Tensor]) -> list[Tensor]:
        raise NotImplementedError

    # -- shared machinery ------------------------------------------------------------------------
    def logits(self, params: dict[str, Tensor] | None = None) -> Tensor:
        """Scored logit rows ``(m, C)`` of the probe batch (``m = n`` for class labels)."""
        return self._scored_logits(params)[0]

    def _scored_logits(self, params: dict[str, Tensor] | None) -> tuple[Tensor, _ScoredRows]:
        """The scored logit rows and which label and example each row has."""
        raw = functional_call(self.model, params or self.params, (self.x,))
        out = select_logits(raw, self.output, "curvature_model_unsupported")
        if self._scored is not None:  # the scored positions are fixed: no host sync per product
            keep = self._scored.keep
            if keep is None:
                return out, self._scored
            return (out[:, :-1] if self.next_token else out)[keep], self._scored
        scored = score_targets(
            out,
            self.y,
            next_token=self.next_token,
            code="curvature_model_unsupported",
            label_code="curvature_input_invalid",
        )
        out = scored.logits
        if not out.requires_grad:
            raise Refusal(
                "curvature_model_unsupported",
                "no trainable parameter influences the model output.",
                ["enable requires_grad on the parameters the output depends on"],
            )
        if not bool(torch.isfinite(out).all()):
            raise Refusal(
                "curvature_input_invalid",
                "the model produces non-finite logits on the probe batch.",
                ["check the checkpoint and the probe inputs for nan/inf"],
            )
        # once, at setup, not per product (one host sync)
        self._scored = _ScoredRows(keep=scored.keep, owner=scored.owner, labels=scored.labels)
        return out, self._scored

    def mean_loss(self, params: dict[str, Tensor] | None = None) -> Tensor:
        """The mean over examples of each example's cross-entropy (summed over its tokens)."""
        rows, scored = self._scored_logits(params)
        # cancellation-free in value, gradient and Hessian (F.cross_entropy's are 0 when p_y == 1)
        return stable_cross_entropy(rows, scored.labels).sum() / self.x.shape[0]

    def example_losses(self, params: dict[str, Tensor] | None = None) -> Tensor:
        """``(n,)`` per-example losses (a sequence's loss sums its scored tokens)."""
        rows, scored = self._scored_logits(params)
        per_row = stable_cross_entropy(rows, scored.labels)
        if scored.keep is None:
            return per_row
        return per_row.new_zeros(self.x.shape[0]).index_add(0, scored.owner, per_row)

    def mean_gradient(self) -> list[Tensor]:
        """:math:`\\nabla_\\theta L` on the probe batch (one backward; counted in ``gradients_used``)."""
        start = self._now()
        rows, scored = self._scored_logits(None)
        # the cancellation-free CE logit gradient, not F.cross_entropy's p_y - 1
        cotangent = ce_logit_gradient(rows, scored.labels) / self.x.shape[0]
        grads = torch.autograd.grad(
            rows,
            list(self.params.values()),
            grad_outputs=cotangent,
            allow_unused=True,
            materialize_grads=True,
        )
        self.gradients_used += 1
        self.seconds += self._now() - start
        return [g.detach() for g in grads]

    def matvec(self, v: Sequence[Tensor]) -> list[Tensor]:
        """:math:`M v` for ``v`` given as one tensor per trainable parameter (counted, timed)."""
        if len(v) != len(self.shapes) or any(
            not isinstance(t, Tensor) or t.shape != s for t, s in zip(v, self.shapes)
        ):
            raise Refusal(
                "curvature_input_invalid",
                "a vector must hold one tensor per trainable parameter with the same shape.",
                [f"expected shapes {[tuple(s) for s in self.shapes]}"],
            )
        vec = [t.detach().to(device=self.device, dtype=self.dtype) for t in v]
        start = self._now()
        out = [o.detach() for o in self._apply(vec)]
        self.products_used += 1
        self.seconds += self._now() - start
        return out

    def matvec_flat(self, v: Tensor) -> Tensor:
        """:math:`M v` for a flat vector of length :attr:`dim` (parameter order)."""
        return self.flatten(self.matvec(self.unflatten(v)))

    def flatten(self, tensors: Sequence[Tensor]) -> Tensor:
        """Concatenate per-parameter tensors into one flat vector."""
        return torch.cat([t.reshape(-1) for t in tensors])

    def unflatten(self, flat: Tensor) -> list[Tensor]:
        """Split a flat vector of length :attr:`dim` into per-parameter tensors."""
        if flat.dim() != 1 or flat.numel() != self.dim:
            raise Refusal(
                "curvature_input_invalid",
                f"a flat vector must have shape ({self.dim},); got {tuple(flat.shape)}.",
            )
        sizes = [s.numel() for s in self.shapes]
        return [c.reshape(s) for c, s in zip(torch.split(flat, sizes), self.shapes)]

    def random_flat(self, generator: torch.Generator, distribution: str = "gaussian") -> Tensor:
        """A random flat vector drawn from a private CPU ``generator`` (global RNG untouched)."""
        if distribution == "rademacher":
            bits = torch.randint(0, 2, (self.dim,), generator=generator, dtype=torch.int64)
            sample = bits.to(torch.float64) * 2.0 - 1.0
        else:
            sample = torch.randn(self.dim, generator=generator, dtype=torch.float64)
        return sample.to(device=self.device, dtype=self.dtype)

    def ledger(self) -> dict[str, Any]:
        """What this operator's work cost and what it ran on: the :class:`CostLedger` fields of
        a result built from it (``Result(..., **op.ledger())``)."""
        return {
            "products_used": self.products_used,
            "gradients_used": self.gradients_used,
            "seconds": self.seconds,
            "num_examples": int(self.x.shape[0]),
            "num_parameters": self.dim,
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    def _now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()


@dataclass(frozen=True)
class CostLedger:
    """What a curvature result's computation cost and what it ran on, declared once.

    The base of every curvature result (:class:`~stepscope.curvature.TraceEstimate`,
    :class:`~stepscope.curvature.TopEigenvalues`, :class:`~stepscope.curvature.DirectionalCurvature`);
    :meth:`CurvatureOperator.ledger` fills it.

    Attributes
    ----------
    products_used, gradients_used
        Curvature-vector products and gradient evaluations spent.
    seconds
        Wall clock of that work (device-synchronised).
    num_examples, num_parameters, dtype
        The batch size, the parameter count and the dtype the products ran in.
    """

    products_used: int
    gradients_used: int
    seconds: float
    num_examples: int
    num_parameters: int
    dtype: str


def _validate_batch(
    x: Tensor, y: Tensor, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    if not isinstance(x, Tensor) or not isinstance(y, Tensor):
        raise Refusal("curvature_input_invalid", "x and y must be tensors.")
    if x.dim() == 0 or x.shape[0] == 0:
        raise Refusal("curvature_input_invalid", "x must hold a non-empty batch (n, ...).")
    if (
        y.dim() not in (1, 2)
        or y.shape[0] != x.shape[0]
        or y.dtype not in (torch.int64, torch.int32)
    ):
        raise Refusal(
            "curvature_input_invalid",
            f"y must be integer class labels of shape ({x.shape[0]},) or token labels "
            f"({x.shape[0]}, T); got {y.dtype} {tuple(y.shape)}.",
            ["pass y as a LongTensor of class indices, one per example (or per token)"],
        )
    if x.device != device or y.device != device:
        raise Refusal(
            "curvature_input_invalid",
            f"x is on {x.device}, y on {y.device}, the parameters on {device}.",
            ["move the probe batch to the model's device"],
        )
    if y.dim() == 1 and int(y.min()) < 0:
        raise Refusal("curvature_input_invalid", "labels must be >= 0.")
    if x.is_floating_point() and x.dtype != dtype:
        x = x.to(dtype)  # the measurement dtype is the parameters' (float64 on request)
    return x, y.long()
